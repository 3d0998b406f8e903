// BillingService (the caller's tenant) and BillingAdminService (operators).
#include <charconv>
#include <string_view>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "billing/billing.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "sv/v1/billing.grpc.pb.h"

namespace sv::api::internal {
namespace {

using internal::ToProto;  // The timestamp conversion, next to the ones below.

constexpr int kTenantsPageMax = 500;

v1::BillingMode ModeToProto(billing::BillingMode mode) {
  return mode == billing::BillingMode::kPostpaid ? v1::POSTPAID : v1::PREPAID;
}

void ToProto(const billing::Balance& b, v1::Balance* out) {
  out->set_mode(ModeToProto(b.mode));
  out->set_paid_micros(b.paid_micros);
  out->set_trial_micros(b.trial_micros);
  if (b.trial_expires_at) *out->mutable_trial_expire_time() = ToProto(*b.trial_expires_at);
  out->set_receivable_micros(b.receivable_micros);
  out->set_credit_limit_micros(b.credit_limit_micros);
  out->set_available_micros(b.available_micros);
  out->set_burn_micros_per_minute(b.burn_micros_per_minute);
  for (const auto& n : b.notices) {
    auto* notice = out->add_notices();
    notice->set_kind(n.kind);
    notice->set_instance_id(n.instance_id);
    notice->set_message(n.message);
    *notice->mutable_create_time() = ToProto(n.at);
  }
}

void ToProto(const billing::TransferRecord& t, v1::Transfer* out) {
  out->set_id(t.id);
  out->set_idempotency_key(t.idempotency_key);
  out->set_leg(t.leg);
  out->set_kind(t.kind);
  out->set_from_account(t.from_kind);
  out->set_to_account(t.to_kind);
  out->set_amount_micros(t.amount_micros);
  out->set_tenant_delta_micros(t.tenant_delta_micros);
  out->set_instance_id(t.instance_id);
  if (t.usage_minute) {
    *out->mutable_usage_minute_time() = ToProto(billing::MinuteStart(*t.usage_minute));
  }
  *out->mutable_create_time() = ToProto(t.at);
  out->set_reason(t.reason);
}

v1::CreditRequestState CreditStateToProto(const std::string& state) {
  if (state == "pending") return v1::CREDIT_PENDING_APPROVAL;
  if (state == "posted") return v1::CREDIT_POSTED;
  if (state == "rejected") return v1::CREDIT_REJECTED;
  if (state == "expired") return v1::CREDIT_EXPIRED;
  return v1::CREDIT_REQUEST_STATE_UNSPECIFIED;
}

void ToProto(const billing::CreditRequestRecord& r, v1::CreditRequest* out) {
  out->set_credit_id(r.credit_id);
  out->set_tenant_id(r.tenant_id);
  out->set_amount_micros(r.amount_micros);
  out->set_reason(r.reason);
  out->set_state(CreditStateToProto(r.state));
  out->set_requested_by(r.requested_by);
  *out->mutable_request_time() = ToProto(r.requested_at);
  out->set_decided_by(r.decided_by);
  if (r.decided_at) *out->mutable_decide_time() = ToProto(*r.decided_at);
  out->set_decision_reason(r.decision_reason);
  if (r.state == "pending" || r.state == "expired") {
    *out->mutable_expire_time() = ToProto(r.expires_at);
  }
  if (r.transfer) ToProto(*r.transfer, out->mutable_transfer());
  out->set_needs_approval(r.needs_approval);
}

void ToProto(const billing::Invoice& inv, v1::Invoice* out) {
  out->set_id(inv.id);
  out->set_period(inv.period);
  *out->mutable_period_start_time() = ToProto(inv.period_start);
  *out->mutable_period_end_time() = ToProto(inv.period_end);
  out->set_total_micros(inv.total_micros);
  out->set_total_fen(inv.total_fen);
  *out->mutable_issue_time() = ToProto(inv.issued_at);
  if (inv.amount_due_micros) {
    out->set_carried_micros(*inv.carried_micros);
    out->set_carried_fen(*inv.carried_fen);
    out->set_amount_due_micros(*inv.amount_due_micros);
    out->set_amount_due_fen(*inv.amount_due_fen);
  }
  for (const auto& l : inv.lines) {
    auto* line = out->add_lines();
    line->set_kind(l.kind);
    line->set_instance_id(l.instance_id);
    line->set_gpu_model(l.gpu_model);
    line->set_gpu_minutes(l.gpu_minutes);
    line->set_amount_micros(l.amount_micros);
    line->set_amount_fen(l.amount_fen);
  }
}

absl::Status NoBilling() {
  return Error(absl::StatusCode::kUnavailable, "BILLING_DISABLED",
               "billing is not configured on this server");
}

class BillingServiceImpl final : public v1::BillingService::Service {
 public:
  BillingServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

  grpc::Status GetBalance(grpc::ServerContext* context, const v1::GetBalanceRequest*,
                          v1::Balance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetBalance", nullptr, "", who.status());
    absl::Status status = deps_.billing == nullptr ? NoBilling() : absl::OkStatus();
    if (status.ok()) status = deps_.billing->EnsureTrialGrant(who->user_id, deps_.clock->Now());
    if (status.ok()) {
      auto balance = deps_.billing->GetBalance(who->tenant_id, deps_.clock->Now());
      status = balance.status();
      if (balance.ok()) ToProto(*balance, response);
    }
    return Finish("GetBalance", &*who, "", status);
  }

  grpc::Status ListTransfers(grpc::ServerContext* context,
                             const v1::ListTransfersRequest* request,
                             v1::ListTransfersResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListTransfers", nullptr, "", who.status());
    return Finish("ListTransfers", &*who, "", Transfers(*who, *request, response));
  }

  grpc::Status GetUsage(grpc::ServerContext* context, const v1::GetUsageRequest* request,
                        v1::GetUsageResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetUsage", nullptr, "", who.status());
    return Finish("GetUsage", &*who, "", Usage(*who, *request, response));
  }

  grpc::Status ListInvoices(grpc::ServerContext* context, const v1::ListInvoicesRequest* request,
                            v1::ListInvoicesResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListInvoices", nullptr, "", who.status());
    return Finish("ListInvoices", &*who, "", Invoices(*who, *request, response));
  }

  grpc::Status ListPrices(grpc::ServerContext* context, const v1::ListPricesRequest*,
                          v1::ListPricesResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListPrices", nullptr, "", who.status());
    absl::Status status = deps_.billing == nullptr ? NoBilling() : absl::OkStatus();
    if (status.ok()) {
      auto prices = deps_.billing->ListPrices(deps_.clock->Now());
      status = prices.status();
      if (prices.ok()) {
        for (const auto& p : *prices) {
          auto* out = response->add_prices();
          out->set_item_kind(p.item_kind);
          out->set_item(p.item);
          out->set_unit_price_micros(p.unit_price_micros);
          *out->mutable_effective_time() = ToProto(p.from);
          if (p.until) *out->mutable_until_time() = ToProto(*p.until);
        }
      }
    }
    return Finish("ListPrices", &*who, "", status);
  }

  grpc::Status GetInvoice(grpc::ServerContext* context, const v1::GetInvoiceRequest* request,
                          v1::Invoice* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetInvoice", nullptr, "", who.status());
    absl::Status status = deps_.billing == nullptr ? NoBilling() : absl::OkStatus();
    if (status.ok() && request->id().empty()) {
      status = Error(absl::StatusCode::kInvalidArgument, "MISSING_ID", "id is required");
    }
    if (status.ok()) {
      auto invoice = deps_.billing->GetInvoice(who->tenant_id, request->id());
      status = invoice.status();
      if (invoice.ok()) ToProto(*invoice, response);
    }
    return Finish("GetInvoice", &*who, "", status);
  }

 private:
  absl::Status Transfers(const store::Principal& who, const v1::ListTransfersRequest& request,
                         v1::ListTransfersResponse* response) {
    if (deps_.billing == nullptr) return NoBilling();
    SV_ASSIGN_OR_RETURN(int page_size, NormalizePageSize(request.page_size()));
    billing::TransferFilter filter;
    if (request.page_token().size() > 100) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                   "page_token is not one this server returned");
    }
    // A newest-first token starts with 'n', so a token is only accepted in
    // the order that issued it; the rest is checked by ListTransfers.
    filter.newest_first = request.newest_first();
    std::string_view token = request.page_token();
    if (!token.empty()) {
      if ((token.front() == 'n') != filter.newest_first) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                     "page_token belongs to the other order (newest_first)");
      }
      if (filter.newest_first) token.remove_prefix(1);
    }
    filter.after = std::string(token);
    if (request.has_start_time()) {
      SV_ASSIGN_OR_RETURN(filter.from, TimeField("start_time", request.start_time()));
    }
    if (request.has_end_time()) {
      SV_ASSIGN_OR_RETURN(filter.to, TimeField("end_time", request.end_time()));
    }
    if (request.kind().size() > 32 || request.instance_id().size() > 64) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_FILTER",
                   "kind is at most 32 characters and instance_id at most 64");
    }
    if (!request.kind().empty() &&
        absl::c_find(billing::kTransferKinds, request.kind()) == std::end(billing::kTransferKinds)) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_FILTER",
                   absl::StrCat("kind '", request.kind(), "' is not a transfer kind; it is one of ",
                                absl::StrJoin(billing::kTransferKinds, ", ")));
    }
    filter.kind = request.kind();
    filter.instance_id = request.instance_id();
    filter.limit = page_size + 1;
    SV_ASSIGN_OR_RETURN(auto transfers, deps_.billing->ListTransfers(who.tenant_id, filter));
    const bool more = static_cast<int>(transfers.size()) > page_size;
    if (more) transfers.resize(page_size);
    for (const auto& t : transfers) ToProto(t, response->add_transfers());
    if (more) {
      response->set_next_page_token(
          absl::StrCat(filter.newest_first ? "n" : "", transfers.back().cursor));
    }
    return absl::OkStatus();
  }

  absl::Status Usage(const store::Principal& who, const v1::GetUsageRequest& request,
                     v1::GetUsageResponse* response) {
    if (deps_.billing == nullptr) return NoBilling();
    const absl::Time now = deps_.clock->Now();
    absl::Time from = now - absl::Hours(24 * 30), to = now;
    if (request.has_start_time()) {
      SV_ASSIGN_OR_RETURN(from, TimeField("start_time", request.start_time()));
    }
    if (request.has_end_time()) {
      SV_ASSIGN_OR_RETURN(to, TimeField("end_time", request.end_time()));
    }
    if (to <= from || to - from > absl::Hours(24 * 366)) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_TIME_RANGE",
                   "end_time must be after start_time, at most 366 days apart");
    }
    SV_ASSIGN_OR_RETURN(auto rows,
                        deps_.billing->GetUsage(who.tenant_id, from, to, request.instance_id()));
    for (const auto& r : rows) {
      auto* row = response->add_rows();
      row->set_instance_id(r.instance_id);
      row->set_day(r.day);
      row->set_gpu_model(r.gpu_model);
      row->set_gpu_minutes(r.gpu_minutes);
      row->set_instance_minutes(r.instance_minutes);
      row->set_amount_micros(r.amount_micros);
    }
    return absl::OkStatus();
  }

  absl::Status Invoices(const store::Principal& who, const v1::ListInvoicesRequest& request,
                        v1::ListInvoicesResponse* response) {
    if (deps_.billing == nullptr) return NoBilling();
    SV_ASSIGN_OR_RETURN(int page_size, NormalizePageSize(request.page_size()));
    if (request.page_token().size() > 64) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                   "page_token is not one this server returned");
    }
    SV_ASSIGN_OR_RETURN(auto invoices, deps_.billing->ListInvoices(
                                           who.tenant_id, request.page_token(), page_size + 1));
    const bool more = static_cast<int>(invoices.size()) > page_size;
    if (more) invoices.resize(page_size);
    for (const auto& inv : invoices) ToProto(inv, response->add_invoices());
    if (more) response->set_next_page_token(invoices.back().id);
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
};

absl::Status OperatorOnly(const store::Principal& who) {
  if (who.role == store::Role::kOperator) return absl::OkStatus();
  return Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
               "only an operator may call the billing admin API");
}

class BillingAdminServiceImpl final : public v1::BillingAdminService::Service {
 public:
  BillingAdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

  grpc::Status GetRevenueSummary(grpc::ServerContext* context,
                                 const v1::RevenueSummaryRequest* request,
                                 v1::RevenueSummary* response) override {
    return Run("GetRevenueSummary", *context, [&]() -> absl::Status {
      absl::Time from = absl::InfinitePast(), to = absl::InfiniteFuture();
      if (request->has_start_time()) {
        SV_ASSIGN_OR_RETURN(from, TimeField("start_time", request->start_time()));
      }
      if (request->has_end_time()) {
        SV_ASSIGN_OR_RETURN(to, TimeField("end_time", request->end_time()));
      }
      SV_ASSIGN_OR_RETURN(auto s, deps_.billing->GetRevenueSummary(from, to));
      response->set_charged_micros(s.charged_micros);
      response->set_trial_spent_micros(s.trial_spent_micros);
      response->set_topups_micros(s.topups_micros);
      response->set_trial_granted_micros(s.trial_granted_micros);
      response->set_trial_expired_micros(s.trial_expired_micros);
      response->set_sla_refunds_micros(s.sla_refunds_micros);
      response->set_shortfall_micros(s.shortfall_micros);
      response->set_storage_shortfall_micros(s.storage_shortfall_micros);
      response->set_app_fee_shortfall_micros(s.app_fee_shortfall_micros);
      response->set_topup_refunds_micros(s.topup_refunds_micros);
      response->set_credits_micros(s.credits_micros);
      response->set_platform_revenue_balance_micros(s.platform_revenue_balance_micros);
      response->set_app_fees_micros(s.app_fees_micros);
      response->set_app_fees_to_publishers_micros(s.app_fees_to_publishers_micros);
      response->set_storage_micros(s.storage_micros);
      response->set_adjustments_net_micros(s.adjustments_net_micros);
      response->set_platform_revenue_micros(s.platform_revenue_micros);
      return absl::OkStatus();
    });
  }

  grpc::Status ListTenantBalances(grpc::ServerContext* context,
                                  const v1::ListTenantBalancesRequest* request,
                                  v1::ListTenantBalancesResponse* response) override {
    return Run("ListTenantBalances", *context, [&]() -> absl::Status {
      int page_size = request->page_size() <= 0 ? 100 : request->page_size();
      if (page_size > kTenantsPageMax || request->page_token().size() > 64) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE",
                     "page_size is at most 500; page_token must be one this server returned");
      }
      SV_ASSIGN_OR_RETURN(auto rows, deps_.billing->ListTenantBalances(
                                         request->page_token(), page_size + 1,
                                         deps_.clock->Now()));
      const bool more = static_cast<int>(rows.size()) > page_size;
      if (more) rows.resize(page_size);
      for (const auto& r : rows) {
        auto* out = response->add_balances();
        out->set_tenant_id(r.tenant_id);
        out->set_tenant_name(r.tenant_name);
        ToProto(r.balance, out->mutable_balance());
        out->set_suspended(r.suspended);
      }
      if (more) response->set_next_page_token(rows.back().tenant_id);
      return absl::OkStatus();
    });
  }

  grpc::Status ListAllInvoices(grpc::ServerContext* context,
                               const v1::ListAllInvoicesRequest* request,
                               v1::ListAllInvoicesResponse* response) override {
    return Run("ListAllInvoices", *context, [&]() -> absl::Status {
      int page_size = request->page_size() <= 0 ? 100 : request->page_size();
      if (page_size > kTenantsPageMax || request->page_token().size() > 64) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE",
                     "page_size is at most 500; page_token must be one this server returned");
      }
      if (request->tenant_id().size() > 64 || request->period().size() > 16) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_FILTER",
                     "tenant_id is at most 64 characters, period is YYYY-MM");
      }
      SV_ASSIGN_OR_RETURN(auto list,
                          deps_.billing->ListAllInvoices({request->tenant_id(), request->period(),
                                                          request->page_token(), page_size + 1}));
      const bool more = static_cast<int>(list.invoices.size()) > page_size;
      if (more) list.invoices.resize(page_size);
      for (const auto& t : list.invoices) {
        auto* out = response->add_invoices();
        out->set_tenant_id(t.invoice.tenant_id);
        out->set_tenant_name(t.tenant_name);
        ToProto(t.invoice, out->mutable_invoice());
      }
      if (more) response->set_next_page_token(list.invoices.back().invoice.id);
      response->set_total_micros(list.total_micros);
      response->set_amount_due_micros(list.amount_due_micros);
      response->set_invoice_count(static_cast<int32_t>(list.count));
      return absl::OkStatus();
    });
  }

  grpc::Status TopUp(grpc::ServerContext* context, const v1::TopUpRequest* request,
                     v1::Transfer* response) override {
    return Run("TopUp", *context, [&]() -> absl::Status {
      SV_RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
      SV_ASSIGN_OR_RETURN(auto transfer,
                          deps_.billing->TopUp(request->tenant_id(), request->payment_id(),
                                               request->amount_micros(), deps_.clock->Now()));
      ToProto(transfer, response);
      spdlog::info("api: top-up {} of {} micro-yuan tenant={}", request->payment_id(),
                   request->amount_micros(), request->tenant_id());
      return absl::OkStatus();
    });
  }

  grpc::Status IssueCredit(grpc::ServerContext* context, const v1::IssueCreditRequest* request,
                           v1::Transfer* response) override {
    return RunAs("IssueCredit", *context, [&](const store::Principal& who) -> absl::Status {
      SV_RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
      SV_ASSIGN_OR_RETURN(
          auto transfer,
          deps_.billing->IssueCredit(request->tenant_id(), request->credit_id(),
                                     request->amount_micros(), request->reason(), Issuer(who),
                                     deps_.clock->Now()));
      ToProto(transfer, response);
      return absl::OkStatus();
    });
  }

  grpc::Status RequestCredit(grpc::ServerContext* context,
                             const v1::IssueCreditRequest* request,
                             v1::CreditRequest* response) override {
    return RunAs("RequestCredit", *context, [&](const store::Principal& who) -> absl::Status {
      SV_RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
      SV_ASSIGN_OR_RETURN(
          auto record,
          deps_.billing->RequestCredit(request->tenant_id(), request->credit_id(),
                                       request->amount_micros(), request->reason(),
                                       OperatorOf(who), deps_.clock->Now()));
      ToProto(record, response);
      return absl::OkStatus();
    });
  }

  grpc::Status ApproveCredit(grpc::ServerContext* context,
                             const v1::DecideCreditRequest* request,
                             v1::CreditRequest* response) override {
    return Decide("ApproveCredit", *context, *request, true, response);
  }

  grpc::Status RejectCredit(grpc::ServerContext* context, const v1::DecideCreditRequest* request,
                            v1::CreditRequest* response) override {
    return Decide("RejectCredit", *context, *request, false, response);
  }

  grpc::Status ListCreditRequests(grpc::ServerContext* context,
                                  const v1::ListCreditRequestsRequest* request,
                                  v1::ListCreditRequestsResponse* response) override {
    return Run("ListCreditRequests", *context, [&]() -> absl::Status {
      const int page_size = request->page_size() == 0 ? 100 : request->page_size();
      if (page_size < 0 || page_size > 1000) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_SIZE",
                     "page_size must be 0 (100) to 1000");
      }
      int64_t before = 0;
      const std::string& token = request->page_token();
      if (!token.empty()) {
        auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), before);
        if (ec != std::errc() || end != token.data() + token.size() || before <= 0) {
          return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                       "page_token is not one this server returned");
        }
      }
      bool more = false;
      SV_ASSIGN_OR_RETURN(auto records, deps_.billing->ListCreditRequests(
                                            request->pending_only(), page_size, before,
                                            deps_.clock->Now(), &more));
      for (const auto& r : records) ToProto(r, response->add_credit_requests());
      if (more) response->set_next_page_token(absl::StrCat(records.back().seq));
      response->set_approval_above_micros(
          deps_.billing->options().credit_approval_above_micros);
      return absl::OkStatus();
    });
  }

  grpc::Status RefundTopUp(grpc::ServerContext* context, const v1::RefundTopUpRequest* request,
                           v1::Transfer* response) override {
    return RunAs("RefundTopUp", *context, [&](const store::Principal& who) -> absl::Status {
      SV_RETURN_IF_ERROR(ValidateTenantId(request->tenant_id()));
      SV_ASSIGN_OR_RETURN(
          auto transfer,
          deps_.billing->RefundTopUp(request->tenant_id(), request->payment_id(),
                                     request->amount_micros(), request->reason(), Issuer(who),
                                     deps_.clock->Now()));
      ToProto(transfer, response);
      return absl::OkStatus();
    });
  }

  grpc::Status SetBillingMode(grpc::ServerContext* context,
                              const v1::SetBillingModeRequest* request,
                              v1::SetBillingModeResponse*) override {
    return Run("SetBillingMode", *context, [&]() -> absl::Status {
      if (request->mode() == v1::BILLING_MODE_UNSPECIFIED) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_MODE",
                     "mode must be PREPAID or POSTPAID");
      }
      return deps_.billing->SetBillingMode(
          request->tenant_id(),
          request->mode() == v1::POSTPAID ? billing::BillingMode::kPostpaid
                                          : billing::BillingMode::kPrepaid,
          request->credit_limit_micros());
    });
  }

  grpc::Status SetGpuPrice(grpc::ServerContext* context, const v1::SetGpuPriceRequest* request,
                           v1::SetGpuPriceResponse*) override {
    return Run("SetGpuPrice", *context, [&]() -> absl::Status {
      const absl::Time now = deps_.clock->Now();
      SV_ASSIGN_OR_RETURN(absl::Time from, EffectiveFrom(*request, now));
      return deps_.billing->SetGpuPrice(request->gpu_model(), request->unit_price_micros(),
                                        from, now);
    });
  }

  grpc::Status SetStoragePrice(grpc::ServerContext* context,
                               const v1::SetStoragePriceRequest* request,
                               v1::SetStoragePriceResponse*) override {
    return Run("SetStoragePrice", *context, [&]() -> absl::Status {
      const absl::Time now = deps_.clock->Now();
      SV_ASSIGN_OR_RETURN(absl::Time from, EffectiveFrom(*request, now));
      return deps_.billing->SetStoragePrice(request->volume_kind(),
                                            request->unit_price_micros(), from, now);
    });
  }

  grpc::Status RunAudit(grpc::ServerContext* context, const v1::RunAuditRequest*,
                        v1::RunAuditResponse* response) override {
    return Run("RunAudit", *context, [&]() -> absl::Status {
      SV_ASSIGN_OR_RETURN(auto failures, deps_.billing->Audit());
      response->set_ok(failures.empty());
      for (const auto& f : failures) response->add_failures(f);
      return absl::OkStatus();
    });
  }

 private:
  // A price request's effective_time, or `now` when it has none.
  template <typename Request>
  static absl::StatusOr<absl::Time> EffectiveFrom(const Request& request, absl::Time now) {
    if (!request.has_effective_time()) return now;
    return TimeField("effective_time", request.effective_time());
  }

  // Who issued a credit or refund, for ledger_transfer_reasons.
  static const std::string& Issuer(const store::Principal& who) {
    return who.user_id.empty() ? who.api_key_id : who.user_id;
  }

  static billing::OperatorRef OperatorOf(const store::Principal& who) {
    return {Issuer(who), who.user_email.empty() ? who.api_key_id : who.user_email};
  }

  grpc::Status Decide(const char* method, const grpc::ServerContext& context,
                      const v1::DecideCreditRequest& request, bool approve,
                      v1::CreditRequest* response) {
    return RunAs(method, context, [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(auto record,
                          deps_.billing->DecideCredit(request.credit_id(), approve,
                                                      request.reason(), OperatorOf(who),
                                                      deps_.clock->Now()));
      ToProto(record, response);
      return absl::OkStatus();
    });
  }

  template <typename Body>
  grpc::Status Run(const char* method, const grpc::ServerContext& context, Body body) {
    return RunAs(method, context, [&](const store::Principal&) { return body(); });
  }

  // Run, for a body that needs the operator (who issued a credit).
  template <typename Body>
  grpc::Status RunAs(const char* method, const grpc::ServerContext& context, Body body) {
    auto who = auth_.Authenticate(context);
    if (!who.ok()) return Finish(method, nullptr, "", who.status());
    absl::Status status = OperatorOnly(*who);
    if (status.ok() && deps_.billing == nullptr) status = NoBilling();
    if (status.ok()) status = body(*who);
    return Finish(method, &*who, "", status);
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewBillingService(const ApiDependencies& deps,
                                                 const Authenticator& auth) {
  return std::make_unique<BillingServiceImpl>(deps, auth);
}

std::unique_ptr<grpc::Service> NewBillingAdminService(const ApiDependencies& deps,
                                                      const Authenticator& auth) {
  return std::make_unique<BillingAdminServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
