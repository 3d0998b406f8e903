// DashboardAdminService: the aggregates behind /admin. Every method only
// reads; operators only (admin.billing in the authorization table).
#include <charconv>
#include <map>

#include "absl/strings/str_cat.h"
#include "api/internal/dashboard_service.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "common/status.h"
#include "store/dashboard_store.h"
#include "store/utilization_store.h"
#include "sv/v1/dashboard.grpc.pb.h"

namespace sv::api::internal {
namespace {

constexpr int kDashboardPageDefault = 100;
constexpr int kNodesMax = 5000;
constexpr int kSeriesHoursMax = 24 * 35;
constexpr absl::Duration kRangeMax = absl::Hours(24 * 366 * 5);

absl::StatusOr<absl::Time> TimeOf(const char* field, const google::protobuf::Timestamp& t) {
  if (t.seconds() < 0 || t.seconds() > 253'402'300'799 || t.nanos() < 0 ||
      t.nanos() > 999'999'999) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_TIME",
                 std::string(field) + " is not a valid timestamp");
  }
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

// [start, end) with defaults: end = now, start = end - default_span.
template <typename Request>
absl::Status RangeOf(const Request& request, absl::Time now, absl::Duration default_span,
                     absl::Time* from, absl::Time* to) {
  *to = now;
  if (request.has_end_time()) {
    SV_ASSIGN_OR_RETURN(*to, TimeOf("end_time", request.end_time()));
  }
  *from = *to - default_span;
  if (request.has_start_time()) {
    SV_ASSIGN_OR_RETURN(*from, TimeOf("start_time", request.start_time()));
  }
  if (*to <= *from || *to - *from > kRangeMax) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_TIME_RANGE",
                 "end_time must be after start_time, at most 5 years apart");
  }
  return absl::OkStatus();
}

absl::Status BadToken() {
  return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
               "page_token is not one this server returned");
}

class DashboardAdminServiceImpl final : public v1::DashboardAdminService::Service {
 public:
  DashboardAdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps),
        auth_(auth),
        dashboard_(deps.store->database()),
        utilization_(deps.store->database()) {}

  grpc::Status GetRevenueSeries(grpc::ServerContext* context,
                                const v1::GetRevenueSeriesRequest* request,
                                v1::GetRevenueSeriesResponse* response) override {
    return Run("GetRevenueSeries", *context, [&]() -> absl::Status {
      const bool monthly = request->granularity() == v1::REVENUE_GRANULARITY_MONTH;
      if (!v1::RevenueGranularity_IsValid(request->granularity())) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_GRANULARITY",
                     "granularity must be DAY or MONTH");
      }
      absl::Time from, to;
      SV_RETURN_IF_ERROR(RangeOf(*request, deps_.clock->Now(),
                                 monthly ? absl::Hours(24 * 366) : absl::Hours(24 * 30), &from,
                                 &to));
      SV_ASSIGN_OR_RETURN(auto rows, dashboard_.RevenueSeries(from, to, monthly));
      for (const auto& r : rows) {
        auto* p = response->add_points();
        p->set_period(r.period);
        *p->mutable_period_start_time() = ToProto(r.period_start);
        p->set_charged_micros(r.charged_micros);
        p->set_trial_charged_micros(r.trial_charged_micros);
        p->set_sla_refunds_micros(r.sla_refunds_micros);
        p->set_topups_micros(r.topups_micros);
        p->set_app_fees_micros(r.app_fees_micros);
        p->set_storage_micros(r.storage_micros);
        p->set_shortfall_micros(r.shortfall_micros);
        p->set_storage_shortfall_micros(r.storage_shortfall_micros);
        p->set_app_fee_shortfall_micros(r.app_fee_shortfall_micros);
        p->set_topup_refunds_micros(r.topup_refunds_micros);
        p->set_credits_micros(r.credits_micros);
        // Operator credits are an expense when given: the tenant spends
        // them as paid credit, so its charges count them as money earned
        // (until 2026-12-07 a credit of 10,000 CNY, spent, showed as
        // 10,000 CNY of revenue with no cash behind it).
        p->set_net_revenue_micros(r.charged_micros - r.trial_charged_micros +
                                  r.app_fees_micros - r.app_fees_trial_micros +
                                  r.storage_micros - r.storage_trial_micros -
                                  (r.sla_refunds_micros - r.sla_refunds_trial_micros) -
                                  r.credits_micros);
      }
      return absl::OkStatus();
    });
  }

  grpc::Status GetSlaRefundsByMetric(grpc::ServerContext* context,
                                     const v1::GetSlaRefundsByMetricRequest* request,
                                     v1::GetSlaRefundsByMetricResponse* response) override {
    return Run("GetSlaRefundsByMetric", *context, [&]() -> absl::Status {
      absl::Time from, to;
      SV_RETURN_IF_ERROR(RangeOf(*request, deps_.clock->Now(), absl::Hours(24 * 30), &from, &to));
      SV_ASSIGN_OR_RETURN(auto rows, dashboard_.SlaRefundsByMetric(from, to));
      for (const auto& r : rows) {
        auto* m = response->add_metrics();
        m->set_metric(r.metric);
        m->set_refund_count(r.refund_count);
        m->set_amount_micros(r.amount_micros);
      }
      return absl::OkStatus();
    });
  }

  grpc::Status GetFleetUtilization(grpc::ServerContext* context,
                                   const v1::GetFleetUtilizationRequest* request,
                                   v1::GetFleetUtilizationResponse* response) override {
    return Run("GetFleetUtilization", *context, [&]() -> absl::Status {
      if (request->series_hours() < 0 || request->series_hours() > kSeriesHoursMax) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_SERIES_HOURS",
                     absl::StrCat("series_hours must be 0 (48) to ", kSeriesHoursMax));
      }
      SV_ASSIGN_OR_RETURN(auto nodes, dashboard_.FleetNodes(kNodesMax));
      // Utilization: the current hour and the one before, so the figure
      // never drops to "no samples" just after the hour turns.
      const absl::Time now = deps_.clock->Now();
      const absl::Time this_hour = absl::FromUnixSeconds(absl::ToUnixSeconds(now) / 3600 * 3600);
      SV_ASSIGN_OR_RETURN(auto by_node,
                          utilization_.ByNode(this_hour - absl::Hours(1), now + absl::Hours(1)));
      const int series_hours = request->series_hours() == 0 ? 48 : request->series_hours();
      SV_ASSIGN_OR_RETURN(auto series, utilization_.Series(this_hour - absl::Hours(series_hours - 1),
                                                           this_hour + absl::Hours(1)));
      // Leaves in node order (pod, leaf), summed here from the node rows.
      struct LeafSum {
        int nodes = 0, down = 0, gpus = 0, allocated = 0;
        store::UtilizationSum utilization;
      };
      store::UtilizationSum fleet;
      std::map<std::pair<std::string, std::string>, LeafSum> leaves;
      std::vector<std::pair<std::string, std::string>> order;
      int gpus = 0, allocated = 0;
      for (const auto& n : nodes) {
        auto key = std::make_pair(n.pod, n.leaf_switch);
        auto [it, added] = leaves.try_emplace(key);
        if (added) order.push_back(key);
        LeafSum& l = it->second;
        ++l.nodes;
        if (n.state == "down") ++l.down;
        l.gpus += n.gpu_count;
        l.allocated += n.allocated_gpu_count;
        store::UtilizationSum u;
        if (auto it = by_node.find(n.name); it != by_node.end()) u = it->second;
        l.utilization.utilization_sum += u.utilization_sum;
        l.utilization.sample_count += u.sample_count;
        fleet.utilization_sum += u.utilization_sum;
        fleet.sample_count += u.sample_count;
        gpus += n.gpu_count;
        allocated += n.allocated_gpu_count;
        auto* out = response->add_nodes();
        out->set_node_name(n.name);
        out->set_pod(n.pod);
        out->set_leaf_switch(n.leaf_switch);
        out->set_state(n.state);
        out->set_gpu_count(n.gpu_count);
        out->set_allocated_gpu_count(n.allocated_gpu_count);
        out->set_instance_count(n.instance_count);
        out->set_gpu_utilization_pct(u.MeanPct());
      }
      for (const auto& key : order) {
        const LeafSum& l = leaves[key];
        auto* out = response->add_leaves();
        out->set_pod(key.first);
        out->set_leaf_switch(key.second);
        out->set_node_count(l.nodes);
        out->set_down_node_count(l.down);
        out->set_gpu_count(l.gpus);
        out->set_allocated_gpu_count(l.allocated);
        out->set_allocated_pct(l.gpus > 0 ? l.allocated * 100 / l.gpus : 0);
        out->set_gpu_utilization_pct(l.utilization.MeanPct());
      }
      response->set_gpu_count(gpus);
      response->set_allocated_gpu_count(allocated);
      response->set_gpu_utilization_pct(fleet.MeanPct());
      for (const auto& p : series) {
        auto* out = response->add_utilization_series();
        *out->mutable_hour_start_time() = ToProto(p.hour);
        out->set_gpu_utilization_pct(p.sum.MeanPct());
        out->set_sample_count(p.sum.sample_count);
      }
      return absl::OkStatus();
    });
  }

  grpc::Status ListTrialGrants(grpc::ServerContext* context,
                               const v1::ListTrialGrantsRequest* request,
                               v1::ListTrialGrantsResponse* response) override {
    return Run("ListTrialGrants", *context, [&]() -> absl::Status {
      SV_ASSIGN_OR_RETURN(int page_size,
                          NormalizePageSize(request->page_size(), kDashboardPageDefault));
      if (request->page_token().size() > 64) return BadToken();
      SV_ASSIGN_OR_RETURN(auto rows, dashboard_.TenantTrials(request->page_token(), page_size + 1));
      const bool more = static_cast<int>(rows.size()) > page_size;
      if (more) rows.resize(page_size);
      for (const auto& r : rows) {
        auto* t = response->add_tenants();
        t->set_tenant_id(r.tenant_id);
        t->set_tenant_name(r.tenant_name);
        t->set_grant_count(r.grant_count);
        t->set_granted_micros(r.granted_micros);
        t->set_burned_micros(r.burned_micros);
        t->set_expired_micros(r.expired_micros);
        t->set_remaining_micros(r.remaining_micros);
        *t->mutable_first_grant_time() = ToProto(r.first_grant);
        *t->mutable_expire_time() = ToProto(r.expire);
      }
      if (more) response->set_next_page_token(rows.back().tenant_id);
      SV_ASSIGN_OR_RETURN(auto totals, dashboard_.TrialTotals());
      response->set_grant_count(totals.grant_count);
      response->set_granted_micros(totals.granted_micros);
      response->set_burned_micros(totals.burned_micros);
      response->set_expired_micros(totals.expired_micros);
      response->set_remaining_micros(totals.remaining_micros);
      return absl::OkStatus();
    });
  }

  grpc::Status ListTopUps(grpc::ServerContext* context, const v1::ListTopUpsRequest* request,
                          v1::ListTopUpsResponse* response) override {
    return Run("ListTopUps", *context, [&]() -> absl::Status {
      SV_ASSIGN_OR_RETURN(int page_size,
                          NormalizePageSize(request->page_size(), kDashboardPageDefault));
      int64_t before_id = 0;
      const std::string& token = request->page_token();
      if (!token.empty()) {
        auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), before_id);
        if (error != std::errc() || end != token.data() + token.size() || before_id <= 0) {
          return BadToken();
        }
      }
      absl::Time from = absl::UnixEpoch(), to = absl::FromUnixSeconds(253'402'300'799);
      if (request->has_start_time()) {
        SV_ASSIGN_OR_RETURN(from, TimeOf("start_time", request->start_time()));
      }
      if (request->has_end_time()) {
        SV_ASSIGN_OR_RETURN(to, TimeOf("end_time", request->end_time()));
      }
      SV_ASSIGN_OR_RETURN(auto rows, dashboard_.TopUps(from, to, before_id, page_size + 1));
      const bool more = static_cast<int>(rows.size()) > page_size;
      if (more) rows.resize(page_size);
      for (const auto& r : rows) {
        auto* t = response->add_topups();
        t->set_transfer_id(r.transfer_id);
        t->set_tenant_id(r.tenant_id);
        t->set_tenant_name(r.tenant_name);
        t->set_payment_id(r.payment_id);
        t->set_amount_micros(r.amount_micros);
        *t->mutable_create_time() = ToProto(r.at);
        t->set_refunded_micros(r.refunded_micros);
      }
      if (more) response->set_next_page_token(std::to_string(rows.back().transfer_id));
      SV_ASSIGN_OR_RETURN(auto totals, dashboard_.TopUpTotalsIn(from, to));
      response->set_total_count(totals.count);
      response->set_total_micros(totals.amount_micros);
      response->set_refunded_micros(totals.refunded_micros);
      return absl::OkStatus();
    });
  }

 private:
  template <typename Body>
  grpc::Status Run(const char* method, const grpc::ServerContext& context, Body body) {
    auto who = auth_.Authenticate(context);
    if (!who.ok()) return Finish(method, nullptr, "", who.status());
    // The authorization table already requires admin.billing; operators are
    // also checked here, as the billing admin service does.
    if (who->role != store::Role::kOperator) {
      return Finish(method, &*who, "",
                    Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
                          "only an operator may read the billing dashboard"));
    }
    return Finish(method, &*who, "", body());
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
  store::DashboardStore dashboard_;
  store::UtilizationStore utilization_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewDashboardAdminService(const ApiDependencies& deps,
                                                        const Authenticator& auth) {
  return std::make_unique<DashboardAdminServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
