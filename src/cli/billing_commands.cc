// svctl balance, usage, transfers, invoices; svctl admin topup, credit,
// refund-topup, balances, invoices, revenue, audit. Money is printed from
// int64 micro-yuan without floating point.
#include <cstdlib>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "billing/transfer_kinds.h"
#include "cli/commands.h"
#include "sv/v1/billing.grpc.pb.h"

namespace sv::cli {
namespace {

// An amount in fen as CNY with two decimals, e.g. -0.05 CNY.
std::string Fen(int64_t fen) {
  const bool negative = fen < 0;
  const uint64_t abs = negative ? 0 - static_cast<uint64_t>(fen) : static_cast<uint64_t>(fen);
  return absl::StrFormat("%s%d.%02d CNY", negative ? "-" : "", abs / 100, abs % 100);
}

// Calls `call(request, &page)` for every page, from `request`'s token to the
// last, and merges each page into *all with `merge`.
template <typename Request, typename Response, typename Call, typename Merge>
grpc::Status EveryPage(Request request, Response* all, Call call, Merge merge) {
  do {
    Response page;
    grpc::Status status = call(request, &page);
    if (!status.ok()) return status;
    merge(page, all);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return grpc::Status::OK;
}

bool ParseTime(const std::string& text, google::protobuf::Timestamp* out) {
  absl::Time t;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return false;
  out->set_seconds(absl::ToUnixSeconds(t));
  return true;
}

void PrintBalance(const v1::Balance& b, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"mode", b.mode() == v1::POSTPAID ? "postpaid" : "prepaid"},
      {"paid", Yuan(b.paid_micros())},
      {"trial", Yuan(b.trial_micros())},
      {"trial expires", FormatTime(b.trial_expire_time())},
  };
  if (b.mode() == v1::POSTPAID) {
    rows.push_back({"receivable", Yuan(b.receivable_micros())});
    rows.push_back({"credit limit", Yuan(b.credit_limit_micros())});
  }
  rows.push_back({"available", Yuan(b.available_micros())});
  rows.push_back({"running cost", Yuan(b.burn_micros_per_minute()) + " per minute"});
  PrintTable(rows, out);
  for (const auto& n : b.notices()) {
    out << "notice " << FormatTime(n.create_time()) << " " << n.kind() << ": " << n.message()
        << "\n";
  }
}

// The price list as people read it: per GPU-hour and per GiB-month (30
// days), with the book's own unit after it.
void PrintPrices(const v1::ListPricesResponse& prices, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {{"ITEM", "PRICE", "FROM", "UNTIL"}};
  for (const auto& p : prices.prices()) {
    const bool gpu = p.item_kind() == "gpu_minute";
    const int64_t unit = p.unit_price_micros();
    std::string item = gpu ? (p.item() == "*" ? "any other GPU" : p.item())
                           : (p.item() == "*" ? "any other volume" : p.item() + " volume");
    std::string price =
        gpu ? absl::StrCat(Yuan(unit * 60), " per GPU-hour (", Yuan(unit), " per GPU-minute)")
            : absl::StrCat(Yuan(unit * 24 * 30), " per GiB-month (", Yuan(unit),
                           " per GiB-hour)");
    rows.push_back({item, price, FormatTime(p.effective_time()), FormatTime(p.until_time())});
  }
  PrintTable(rows, out);
}

void AddTenantCommands(CLI::App& app, Action* action) {
  app.add_subcommand("balance", "Show paid and trial credit, and billing notices")
      ->callback([=] {
        *action = [](Session& s) {
          std::string error;
          if (!s.Connect(&error)) return Fail(error);
          v1::Balance balance;
          auto stub = v1::BillingService::NewStub(s.channel);
          grpc::Status status = stub->GetBalance(s.Context().get(), {}, &balance);
          if (!status.ok()) return FailRpc(status, s);
          if (s.format() == Format::kJson) {
            PrintJson(balance, std::cout);
          } else {
            PrintBalance(balance, std::cout);
          }
          return kExitOk;
        };
      });

  app.add_subcommand("prices", "What GPUs and volumes cost, and price changes already scheduled")
      ->callback([=] {
        *action = [](Session& s) {
          std::string error;
          if (!s.Connect(&error)) return Fail(error);
          v1::ListPricesResponse prices;
          auto stub = v1::BillingService::NewStub(s.channel);
          grpc::Status status = stub->ListPrices(s.Context().get(), {}, &prices);
          if (!status.ok()) return FailRpc(status, s);
          if (s.format() == Format::kJson) {
            PrintJson(prices, std::cout);
          } else {
            PrintPrices(prices, std::cout);
          }
          return kExitOk;
        };
      });

  auto usage_request = std::make_shared<v1::GetUsageRequest>();
  auto from = std::make_shared<std::string>(), to = std::make_shared<std::string>();
  auto* usage = app.add_subcommand("usage", "GPU minutes and cost per instance per day");
  usage->add_option("--from", *from, "Start, RFC 3339 (default: 30 days ago)");
  usage->add_option("--to", *to, "End, RFC 3339 (default: now)");
  usage->add_option("--instance", *usage_request->mutable_instance_id(), "Only this instance");
  usage->callback([=] {
    *action = [=](Session& s) {
      if (!from->empty() && !ParseTime(*from, usage_request->mutable_start_time())) {
        return Fail("--from must be an RFC 3339 time");
      }
      if (!to->empty() && !ParseTime(*to, usage_request->mutable_end_time())) {
        return Fail("--to must be an RFC 3339 time");
      }
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::GetUsageResponse response;
      auto stub = v1::BillingService::NewStub(s.channel);
      grpc::Status status = stub->GetUsage(s.Context().get(), *usage_request, &response);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {
          {"DAY", "INSTANCE", "GPU MODEL", "GPU-MINUTES", "COST"}};
      for (const auto& r : response.rows()) {
        rows.push_back({r.day(), r.instance_id(), r.gpu_model(),
                        std::to_string(r.gpu_minutes()), Yuan(r.amount_micros())});
      }
      PrintTable(rows, std::cout);
      return kExitOk;
    };
  });

  auto list = std::make_shared<v1::ListTransfersRequest>();
  auto* transfers = app.add_subcommand("transfers", "Ledger transfers of the tenant, oldest first");
  transfers->add_flag("--newest-first",
                      [list](std::int64_t n) { list->set_newest_first(n > 0); },
                      "Newest first (the page token keeps the order)");
  transfers->add_option("--kind", *list->mutable_kind(), "Only this kind")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(billing::kTransferKinds),
                                                     std::end(billing::kTransferKinds))));
  transfers->add_option("--instance", *list->mutable_instance_id(), "Only this instance");
  auto transfers_from = std::make_shared<std::string>();
  auto transfers_to = std::make_shared<std::string>();
  transfers->add_option("--from", *transfers_from,
                        "Start, RFC 3339, inclusive (a charge counts at the end of its minute)");
  transfers->add_option("--to", *transfers_to, "End, RFC 3339, exclusive");
  transfers->add_option("--page-size", [list](const CLI::results_t& r) {
    int n = 0;
    if (!absl::SimpleAtoi(r[0], &n)) return false;
    list->set_page_size(n);
    return true;
  }, "Transfers per page (at most 1000)");
  transfers->add_option("--page-token", *list->mutable_page_token(), "From a previous page");
  transfers->callback([=] {
    *action = [=](Session& s) {
      if (!transfers_from->empty() && !ParseTime(*transfers_from, list->mutable_start_time())) {
        return Fail("--from must be an RFC 3339 time");
      }
      if (!transfers_to->empty() && !ParseTime(*transfers_to, list->mutable_end_time())) {
        return Fail("--to must be an RFC 3339 time");
      }
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::ListTransfersResponse response;
      auto stub = v1::BillingService::NewStub(s.channel);
      grpc::Status status = stub->ListTransfers(s.Context().get(), *list, &response);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
        return kExitOk;
      }
      // A REASON column only where a credit or refund has one.
      bool reasons = false;
      for (const auto& t : response.transfers()) reasons = reasons || !t.reason().empty();
      std::vector<std::vector<std::string>> rows = {{"ID", "TIME", "KIND", "AMOUNT", "FROM",
                                                     "TO", "INSTANCE", "MINUTE"}};
      if (reasons) rows[0].push_back("REASON");
      for (const auto& t : response.transfers()) {
        // A minute charge's legs have no transfer id (docs/billing.md).
        rows.push_back({t.id() == 0 ? "-" : std::to_string(t.id()), FormatTime(t.create_time()),
                        t.kind(),
                        Yuan(t.tenant_delta_micros() != 0 ? t.tenant_delta_micros()
                                                          : t.amount_micros()),
                        t.from_account(), t.to_account(),
                        t.instance_id().empty() ? "-" : t.instance_id(),
                        FormatTime(t.usage_minute_time())});
        if (reasons) rows.back().push_back(t.reason().empty() ? "-" : t.reason());
      }
      PrintTable(rows, std::cout);
      if (!response.next_page_token().empty()) {
        std::cout << "next page: --page-token " << response.next_page_token() << "\n";
      }
      return kExitOk;
    };
  });

  auto invoice_id = std::make_shared<std::string>();
  auto* invoices = app.add_subcommand("invoices", "Monthly invoices (postpaid), or one by id");
  invoices->add_option("id", *invoice_id, "Show this invoice with its lines");
  invoices->callback([=] {
    *action = [=](Session& s) {
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      auto stub = v1::BillingService::NewStub(s.channel);
      if (!invoice_id->empty()) {
        v1::GetInvoiceRequest request;
        request.set_id(*invoice_id);
        v1::Invoice invoice;
        grpc::Status status = stub->GetInvoice(s.Context().get(), request, &invoice);
        if (!status.ok()) return FailRpc(status, s);
        if (s.format() == Format::kJson) {
          PrintJson(invoice, std::cout);
          return kExitOk;
        }
        std::vector<std::vector<std::string>> head = {
            {"invoice", invoice.id()},
            {"period", absl::StrCat(invoice.period(), " (Asia/Shanghai; ",
                                    FormatTime(invoice.period_start_time()), " to ",
                                    FormatTime(invoice.period_end_time()), ")")},
            {"issued", FormatTime(invoice.issue_time())},
            {"total", absl::StrCat(Fen(invoice.total_fen()), " (exact ",
                                   Yuan(invoice.total_micros()), ")")}};
        if (invoice.has_amount_due_fen()) {
          // Earlier months not paid (positive) less payments and credit.
          const int64_t carried = invoice.carried_micros();
          head.push_back({"earlier balance",
                          absl::StrCat(Fen(invoice.carried_fen()),
                                       carried < 0   ? " (payments and credit)"
                                       : carried > 0 ? " (not paid yet)"
                                                     : "")});
          head.push_back({"amount due", Fen(invoice.amount_due_fen())});
        }
        PrintTable(head, std::cout);
        std::cout << "\n";
        std::vector<std::vector<std::string>> lines = {
            {"KIND", "INSTANCE", "GPU MODEL", "GPU-MINUTES", "AMOUNT"}};
        for (const auto& l : invoice.lines()) {
          lines.push_back({l.kind(), l.instance_id().empty() ? "-" : l.instance_id(),
                           l.gpu_model().empty() ? "-" : l.gpu_model(),
                           l.gpu_minutes() > 0 ? std::to_string(l.gpu_minutes()) : "-",
                           Fen(l.amount_fen())});
        }
        PrintTable(lines, std::cout);
        std::cout << "Each line is rounded to fen; the total is the sum of the lines.\n";
        if (invoice.has_amount_due_fen()) {
          std::cout << "Amount due is the total plus the earlier balance as of the issue "
                       "(never below zero); payments since then are not in it.\n";
        }
        return kExitOk;
      }
      // Every page, newest period first.
      v1::ListInvoicesResponse all;
      grpc::Status status = EveryPage(
          v1::ListInvoicesRequest(), &all,
          [&](const auto& r, auto* page) {
            return stub->ListInvoices(s.Context().get(), r, page);
          },
          [](auto& page, auto* all) {
            for (auto& inv : *page.mutable_invoices()) *all->add_invoices() = std::move(inv);
          });
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(all, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {{"ID", "PERIOD", "TOTAL", "DUE", "ISSUED"}};
      for (const auto& inv : all.invoices()) {
        rows.push_back({inv.id(), inv.period(), Fen(inv.total_fen()),
                        inv.has_amount_due_fen() ? Fen(inv.amount_due_fen()) : "-",
                        FormatTime(inv.issue_time())});
      }
      PrintTable(rows, std::cout);
      if (all.invoices_size() == 0) {
        std::cout << "(no invoices: a postpaid tenant gets one for each month it was postpaid)\n";
      }
      return kExitOk;
    };
  });
}

// Runs one admin call with the admin key and prints its answer as JSON.
template <typename Call>
Action AdminCall(Call call) {
  return [call](Session& s) {
    s.flags.admin = true;
    std::string error;
    if (!s.Connect(&error)) return Fail(error);
    auto stub = v1::BillingAdminService::NewStub(s.channel);
    return call(s, *stub);
  };
}

const char* CreditStateName(v1::CreditRequestState state) {
  switch (state) {
    case v1::CREDIT_PENDING_APPROVAL: return "PENDING_APPROVAL";
    case v1::CREDIT_POSTED: return "POSTED";
    case v1::CREDIT_REJECTED: return "REJECTED";
    case v1::CREDIT_EXPIRED: return "EXPIRED";
    default: return "UNKNOWN";
  }
}

int PrintCreditRequest(Session& s, const v1::CreditRequest& r) {
  if (s.format() == Format::kJson) {
    PrintJson(r, std::cout);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"credit id", r.credit_id()},
      {"tenant", r.tenant_id()},
      {"credit", Yuan(r.amount_micros())},
      {"state", CreditStateName(r.state())},
      {"requested by", r.requested_by() + " at " + FormatTime(r.request_time())}};
  if (!r.decided_by().empty()) {
    rows.push_back({r.state() == v1::CREDIT_REJECTED ? "rejected by" : "approved by",
                    r.decided_by() + " at " + FormatTime(r.decide_time()) +
                        (r.decision_reason().empty() ? "" : ": " + r.decision_reason())});
  }
  if (r.has_transfer()) rows.push_back({"transfer", r.transfer().idempotency_key()});
  PrintTable(rows, std::cout);
  if (r.state() == v1::CREDIT_PENDING_APPROVAL) {
    std::cout << "awaits a second operator until " << FormatTime(r.expire_time())
              << ": svctl admin credits approve " << r.credit_id() << "\n";
  }
  return kExitOk;
}

// svctl admin credits list|approve|reject: the two-person rule's requests.
void AddCreditRequestCommands(CLI::App& admin, Action* action) {
  auto* credits = admin.add_subcommand(
      "credits", "Credit requests: those above the approval limit wait for a second operator");
  credits->require_subcommand(1);
  auto pending = std::make_shared<bool>(false);
  auto* list = credits->add_subcommand("list", "List credit requests, newest first");
  list->add_flag("--pending", *pending, "Only those awaiting approval");
  list->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      v1::ListCreditRequestsRequest request;
      request.set_pending_only(*pending);
      request.set_page_size(1000);
      // Every page, into one answer.
      v1::ListCreditRequestsResponse response;
      for (;;) {
        v1::ListCreditRequestsResponse page;
        grpc::Status status = stub.ListCreditRequests(s.Context().get(), request, &page);
        if (!status.ok()) return FailRpc(status, s);
        response.mutable_credit_requests()->MergeFrom(page.credit_requests());
        response.set_approval_above_micros(page.approval_above_micros());
        if (page.next_page_token().empty()) break;
        request.set_page_token(page.next_page_token());
      }
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {
          {"CREDIT ID", "TENANT", "AMOUNT", "STATE", "REQUESTED BY", "DECIDED BY", "REASON"}};
      for (const auto& r : response.credit_requests()) {
        rows.push_back({r.credit_id(), r.tenant_id(), Yuan(r.amount_micros()),
                        CreditStateName(r.state()), r.requested_by(),
                        r.decided_by().empty() ? "-" : r.decided_by(), r.reason()});
      }
      PrintTable(rows, std::cout);
      std::cout << (response.approval_above_micros() < 0
                        ? std::string("no credit needs a second operator")
                        : "credits above " + Yuan(response.approval_above_micros()) +
                              " need a second operator")
                << "\n";
      return kExitOk;
    });
  });
  auto credit_id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto* approve = credits->add_subcommand(
      "approve", "Approve and post another operator's credit request");
  auto* reject = credits->add_subcommand("reject", "Reject (or withdraw) a credit request");
  for (auto* c : {approve, reject}) {
    c->add_option("credit_id", *credit_id, "The request's credit id")->required();
  }
  approve->add_option("--reason", *reason, "A note for the record (optional)");
  reject->add_option("--reason", *reason, "Why; kept with the request")->required();
  auto decide = [=](bool yes) {
    return AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      v1::DecideCreditRequest request;
      request.set_credit_id(*credit_id);
      request.set_reason(*reason);
      v1::CreditRequest answer;
      grpc::Status status = yes ? stub.ApproveCredit(s.Context().get(), request, &answer)
                                : stub.RejectCredit(s.Context().get(), request, &answer);
      if (!status.ok()) return FailRpc(status, s);
      return PrintCreditRequest(s, answer);
    });
  };
  approve->callback([=] { *action = decide(true); });
  reject->callback([=] { *action = decide(false); });
}

}  // namespace

int ResolveTenant(Session& s, const std::string& id_or_name, std::string* id) {
  constexpr std::string_view kPrefix = "ten-";
  bool looks_like_id = id_or_name.size() > kPrefix.size() &&
                       id_or_name.compare(0, kPrefix.size(), kPrefix) == 0;
  for (size_t i = kPrefix.size(); looks_like_id && i < id_or_name.size(); ++i) {
    const char c = id_or_name[i];
    looks_like_id = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  }
  if (looks_like_id) {
    if (id != &id_or_name) *id = id_or_name;
    return kExitOk;
  }
  auto stub = v1::BillingAdminService::NewStub(s.channel);
  v1::ListTenantBalancesRequest request;
  request.set_page_size(500);
  std::string found;
  do {
    v1::ListTenantBalancesResponse page;
    grpc::Status status = stub->ListTenantBalances(s.Context().get(), request, &page);
    if (!status.ok()) return FailRpc(status, s);
    for (const auto& t : page.balances()) {
      if (t.tenant_name() == id_or_name) found = t.tenant_id();
    }
    request.set_page_token(page.next_page_token());
  } while (found.empty() && !request.page_token().empty());
  if (found.empty()) {
    return Fail("no tenant is named \"" + id_or_name +
                "\" (svctl admin balances shows ids and names)");
  }
  *id = found;
  return kExitOk;
}

namespace {

// The operator's money commands (topup, credit, refund-topup): parses the
// amount (optional: empty leaves 0), resolves the tenant, makes the call and
// prints the transfer it answers, `label` naming its amount. A replay of the
// id answers the first transfer.
template <typename Request, typename Call>
int AdminTransferCall(Session& s, Request& request, const std::string& amount_flag,
                      const std::string& amount, const std::string& id_label,
                      const std::string& id, const std::string& label, Call call) {
  int64_t micros = 0;
  if (!amount.empty() && !ParseYuan(amount, &micros)) {
    return Fail(YuanSyntaxError(amount_flag, amount));
  }
  request.set_amount_micros(micros);
  if (int rc = ResolveTenant(s, request.tenant_id(), request.mutable_tenant_id());
      rc != kExitOk) {
    return rc;
  }
  v1::Transfer transfer;
  grpc::Status status = call(request, &transfer);
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    PrintJson(transfer, std::cout);
    return kExitOk;
  }
  PrintTable({{"tenant", request.tenant_id()},
              {id_label, id},
              {label, Yuan(transfer.amount_micros())},
              {"from", transfer.from_account()},
              {"to", transfer.to_account()},
              {"transfer", transfer.idempotency_key()},
              {"time", FormatTime(transfer.create_time())}},
             std::cout);
  return kExitOk;
}

// A price given per a large unit (per GPU-hour, per GiB-month) or per the
// price book's own unit (per GPU-minute, per GiB-hour); exactly one.
struct RateFlags {
  std::string large_flag, large;
  std::string unit_flag, unit;
  int64_t units_per_large;  // 60 minutes an hour, 720 hours a 30-day month.
  std::string unit_name;    // For the error: "minute", "GiB-hour".
  bool positive;            // Refuse 0 (GPU rent is never free).
};

// The rate in micro-yuan per book unit, or the error's exit code.
int ParseRate(const RateFlags& f, int64_t* micros) {
  const bool large = f.unit.empty();
  const std::string& flag = large ? f.large_flag : f.unit_flag;
  const std::string& text = large ? f.large : f.unit;
  if (text.empty()) return Fail("give " + f.large_flag + " or " + f.unit_flag);
  if (!ParseYuan(text, micros) || *micros < 0 || (f.positive && *micros == 0)) {
    return Fail(flag + (f.positive ? " must be a positive" : " must be a") +
                " CNY amount with at most 6 decimals");
  }
  if (!large) return kExitOk;
  if (*micros % f.units_per_large != 0) {
    return Fail(absl::StrCat(flag, " ", text, " is not a whole number of micro-yuan per ",
                             f.unit_name, "; give ", f.unit_flag, " instead"));
  }
  *micros /= f.units_per_large;
  return kExitOk;
}

void AddAdminBillingCommands(CLI::App& app, Action* action) {
  CLI::App* admin = app.get_subcommand("admin");
  auto topup = std::make_shared<v1::TopUpRequest>();
  auto amount = std::make_shared<std::string>();
  auto* top = admin->add_subcommand("topup", "Credit a tenant's paid wallet (payment confirmed)");
  top->add_option("tenant", *topup->mutable_tenant_id(), "Tenant id or name")->required();
  top->add_option("amount", *amount, "Amount in CNY, e.g. 100 or 12.50")->required();
  top->add_option("--payment-id", *topup->mutable_payment_id(),
                  "The payment's id; a replay with it is a no-op")
      ->required();
  top->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      return AdminTransferCall(s, *topup, "amount", *amount, "payment", topup->payment_id(),
                               "amount", [&](const auto& r, v1::Transfer* t) {
                                 return stub.TopUp(s.Context().get(), r, t);
                               });
    });
  });
  auto credit = std::make_shared<v1::IssueCreditRequest>();
  auto credit_amount = std::make_shared<std::string>();
  auto* give = admin->add_subcommand(
      "credit", "Give a tenant credit (compensation, promotion): paid wallet, or off a "
                "postpaid tenant's receivable");
  give->add_option("tenant", *credit->mutable_tenant_id(), "Tenant id or name")->required();
  give->add_option("amount", *credit_amount, "Amount in CNY, e.g. 50 or 12.50")->required();
  give->add_option("--credit-id", *credit->mutable_credit_id(),
                   "An id of your choosing, e.g. the incident's; a replay with it is a no-op")
      ->required();
  give->add_option("--reason", *credit->mutable_reason(), "Why; the tenant is shown it")
      ->required();
  give->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      int64_t micros = 0;
      if (!ParseYuan(*credit_amount, &micros)) {
        return Fail(YuanSyntaxError("amount", *credit_amount));
      }
      v1::IssueCreditRequest request = *credit;
      request.set_amount_micros(micros);
      if (int rc = ResolveTenant(s, request.tenant_id(), request.mutable_tenant_id());
          rc != kExitOk) {
        return rc;
      }
      v1::CreditRequest answer;
      grpc::Status status = stub.RequestCredit(s.Context().get(), request, &answer);
      if (!status.ok()) return FailRpc(status, s);
      return PrintCreditRequest(s, answer);
    });
  });
  AddCreditRequestCommands(*admin, action);
  auto refund = std::make_shared<v1::RefundTopUpRequest>();
  auto refund_amount = std::make_shared<std::string>();
  auto* back = admin->add_subcommand(
      "refund-topup", "Give a top-up back, all or part (once per payment; at most what the "
                      "paid wallet holds)");
  back->add_option("tenant", *refund->mutable_tenant_id(), "Tenant id or name")->required();
  back->add_option("--payment-id", *refund->mutable_payment_id(), "The top-up's payment id")
      ->required();
  back->add_option("--amount", *refund_amount, "Amount in CNY (default: the whole top-up)");
  back->add_option("--reason", *refund->mutable_reason(), "Why; the tenant is shown it")
      ->required();
  back->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      if (!refund_amount->empty() && refund_amount->find_first_not_of("0.") ==
                                         std::string::npos) {
        return Fail("--amount must be positive (leave it out to refund the whole top-up)");
      }
      return AdminTransferCall(s, *refund, "--amount", *refund_amount, "payment",
                               refund->payment_id(), "refunded",
                               [&](const auto& r, v1::Transfer* t) {
                                 return stub.RefundTopUp(s.Context().get(), r, t);
                               });
    });
  });
  admin->add_subcommand("balances", "Balances of all tenants (every page)")->callback([=] {
    *action = AdminCall([](Session& s, v1::BillingAdminService::Stub& stub) {
      v1::ListTenantBalancesResponse all;
      v1::ListTenantBalancesRequest request;
      request.set_page_size(500);
      grpc::Status status = EveryPage(
          request, &all,
          [&](const auto& r, auto* page) {
            return stub.ListTenantBalances(s.Context().get(), r, page);
          },
          [](auto& page, auto* all) {
            for (auto& b : *page.mutable_balances()) *all->add_balances() = std::move(b);
          });
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(all, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {
          {"TENANT", "NAME", "MODE", "PAID", "TRIAL", "RECEIVABLE", "AVAILABLE", "PER MINUTE",
           "STANDING"}};
      for (const auto& t : all.balances()) {
        const v1::Balance& b = t.balance();
        const bool postpaid = b.mode() == v1::POSTPAID;
        rows.push_back({t.tenant_id(), t.tenant_name(), postpaid ? "postpaid" : "prepaid",
                        Yuan(b.paid_micros()), Yuan(b.trial_micros()),
                        postpaid ? Yuan(b.receivable_micros()) : "-", Yuan(b.available_micros()),
                        Yuan(b.burn_micros_per_minute()),
                        t.suspended() ? "SUSPENDED" : "active"});
      }
      PrintTable(rows, std::cout);
      return kExitOk;
    });
  });
  auto all_invoices = std::make_shared<v1::ListAllInvoicesRequest>();
  auto* admin_invoices =
      admin->add_subcommand("invoices", "Every tenant's invoices, with what each says is due");
  admin_invoices->add_option("--tenant", *all_invoices->mutable_tenant_id(),
                             "Only this tenant (id or name)");
  admin_invoices->add_option("--period", *all_invoices->mutable_period(),
                             "Only this month, YYYY-MM (Asia/Shanghai)");
  admin_invoices->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      v1::ListAllInvoicesResponse all;
      v1::ListAllInvoicesRequest request = *all_invoices;
      request.set_page_size(500);
      if (!request.tenant_id().empty()) {
        if (int rc = ResolveTenant(s, request.tenant_id(), request.mutable_tenant_id());
            rc != kExitOk) {
          return rc;
        }
      }
      grpc::Status status = EveryPage(
          request, &all,
          [&](const auto& r, auto* page) {
            return stub.ListAllInvoices(s.Context().get(), r, page);
          },
          [](auto& page, auto* all) {
            for (auto& inv : *page.mutable_invoices()) *all->add_invoices() = std::move(inv);
            all->set_total_micros(page.total_micros());
            all->set_amount_due_micros(page.amount_due_micros());
            all->set_invoice_count(page.invoice_count());
          });
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(all, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {
          {"PERIOD", "TENANT", "NAME", "INVOICE", "TOTAL", "DUE", "ISSUED"}};
      for (const auto& t : all.invoices()) {
        const v1::Invoice& inv = t.invoice();
        rows.push_back({inv.period(), t.tenant_id(), t.tenant_name(), inv.id(),
                        Fen(inv.total_fen()),
                        inv.has_amount_due_fen() ? Fen(inv.amount_due_fen()) : "-",
                        FormatTime(inv.issue_time())});
      }
      PrintTable(rows, std::cout);
      std::cout << all.invoice_count() << " invoice(s), " << Yuan(all.total_micros())
                << " invoiced, " << Yuan(all.amount_due_micros())
                << " due as of their issue\n";
      return kExitOk;
    });
  });
  auto revenue_request = std::make_shared<v1::RevenueSummaryRequest>();
  auto revenue_from = std::make_shared<std::string>();
  auto revenue_to = std::make_shared<std::string>();
  auto* revenue = admin->add_subcommand("revenue", "Revenue summary (all time, or a range)");
  revenue->add_option("--from", *revenue_from, "Start, RFC 3339, inclusive");
  revenue->add_option("--to", *revenue_to, "End, RFC 3339, exclusive");
  revenue->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      if (!revenue_from->empty() &&
          !ParseTime(*revenue_from, revenue_request->mutable_start_time())) {
        return Fail("--from must be an RFC 3339 time");
      }
      if (!revenue_to->empty() && !ParseTime(*revenue_to, revenue_request->mutable_end_time())) {
        return Fail("--to must be an RFC 3339 time");
      }
      v1::RevenueSummary r;
      grpc::Status status = stub.GetRevenueSummary(s.Context().get(), *revenue_request, &r);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(r, std::cout);
        return kExitOk;
      }
      PrintTable({{"GPU rent charged", Yuan(r.charged_micros())},
                  {"  of which trial credit", Yuan(r.trial_spent_micros())},
                  {"app fees", Yuan(r.app_fees_micros())},
                  {"  of which to publishers", Yuan(r.app_fees_to_publishers_micros())},
                  {"storage", Yuan(r.storage_micros())},
                  {"adjustments (net)", Yuan(r.adjustments_net_micros())},
                  {"platform revenue (net, in range)", Yuan(r.platform_revenue_micros())},
                  {"SLA refunds", Yuan(r.sla_refunds_micros())},
                  {"shortfall: GPU rent (ran, not paid)", Yuan(r.shortfall_micros())},
                  {"shortfall: storage (kept, not paid)", Yuan(r.storage_shortfall_micros())},
                  {"shortfall: app fees (ran, not paid)", Yuan(r.app_fee_shortfall_micros())},
                  {"top-ups", Yuan(r.topups_micros())},
                  {"top-ups refunded", Yuan(r.topup_refunds_micros())},
                  {"credits given", Yuan(r.credits_micros())},
                  {"trial granted", Yuan(r.trial_granted_micros())},
                  {"trial expired", Yuan(r.trial_expired_micros())},
                  {"platform revenue balance (all time)",
                   Yuan(r.platform_revenue_balance_micros())}},
                 std::cout);
      return kExitOk;
    });
  });
  auto mode_request = std::make_shared<v1::SetBillingModeRequest>();
  auto mode_name = std::make_shared<std::string>();
  auto credit_limit = std::make_shared<std::string>();
  auto* mode = admin->add_subcommand(
      "billing-mode", "Make a tenant prepaid, or postpaid with a credit limit (monthly invoices)");
  mode->add_option("tenant", *mode_request->mutable_tenant_id(), "Tenant id or name")
      ->required();
  mode->add_option("mode", *mode_name, "prepaid or postpaid")
      ->required()
      ->check(CLI::IsMember({"prepaid", "postpaid"}));
  mode->add_option("--credit-limit", *credit_limit,
                   "Postpaid (required): how much the tenant may owe, in CNY, e.g. 50000");
  mode->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      // A forgotten limit would make a postpaid tenant that may owe nothing,
      // whose instances stop when its trial credit ends (its paid wallet is
      // not drawn on while postpaid, docs/billing.md).
      if (*mode_name == "postpaid" && credit_limit->empty()) {
        return Fail("postpaid needs --credit-limit: how much the tenant may owe, in CNY");
      }
      int64_t limit = 0;
      if (!credit_limit->empty() && !ParseYuan(*credit_limit, &limit)) {
        return Fail(YuanSyntaxError("--credit-limit", *credit_limit));
      }
      mode_request->set_mode(*mode_name == "postpaid" ? v1::POSTPAID : v1::PREPAID);
      mode_request->set_credit_limit_micros(limit);
      if (int rc = ResolveTenant(s, mode_request->tenant_id(), mode_request->mutable_tenant_id());
          rc != kExitOk) {
        return rc;
      }
      v1::SetBillingModeResponse response;
      grpc::Status status = stub.SetBillingMode(s.Context().get(), *mode_request, &response);
      if (!status.ok()) return FailRpc(status, s);
      std::cout << mode_request->tenant_id() << " is " << *mode_name
                << (*mode_name == "postpaid" ? " with a credit limit of " + Yuan(limit) : "")
                << "\n";
      return kExitOk;
    });
  });

  auto price_request = std::make_shared<v1::SetGpuPriceRequest>();
  auto per_hour = std::make_shared<std::string>();
  auto per_minute = std::make_shared<std::string>();
  auto price_from = std::make_shared<std::string>();
  auto* price = admin->add_subcommand(
      "price", "Set a GPU model's price from a time on (the price book is versioned)");
  price->add_option("gpu_model", *price_request->mutable_gpu_model(),
                    "GPU model, e.g. \"RTX 4090\"")
      ->required();
  auto* hour_option = price->add_option(
      "--per-gpu-hour", *per_hour,
      "CNY per GPU-hour, e.g. 1.98 (must be a whole number of micro-yuan per minute)");
  price->add_option("--per-gpu-minute", *per_minute, "CNY per GPU-minute, e.g. 0.033")
      ->excludes(hour_option);
  price->add_option("--from", *price_from, "Effective from, RFC 3339 (default: now)");
  price->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      int64_t micros = 0;
      if (int rc = ParseRate({"--per-gpu-hour", *per_hour, "--per-gpu-minute", *per_minute, 60,
                              "minute", true},
                             &micros);
          rc != kExitOk) {
        return rc;
      }
      if (!price_from->empty() &&
          !ParseTime(*price_from, price_request->mutable_effective_time())) {
        return Fail("--from must be an RFC 3339 time");
      }
      price_request->set_unit_price_micros(micros);
      v1::SetGpuPriceResponse response;
      grpc::Status status = stub.SetGpuPrice(s.Context().get(), *price_request, &response);
      if (!status.ok()) return FailRpc(status, s);
      std::cout << price_request->gpu_model() << ": " << Yuan(micros) << " per GPU-minute ("
                << Yuan(micros * 60) << " per GPU-hour) from "
                << (price_from->empty() ? std::string("now") : *price_from) << "\n";
      return kExitOk;
    });
  });
  auto storage_request = std::make_shared<v1::SetStoragePriceRequest>();
  auto per_gib_hour = std::make_shared<std::string>();
  auto per_gib_month = std::make_shared<std::string>();
  auto storage_from = std::make_shared<std::string>();
  auto* storage = admin->add_subcommand(
      "storage-price", "Set a volume kind's price from a time on (the price book is versioned)");
  storage->add_option("volume_kind", *storage_request->mutable_volume_kind(),
                      "network, node_local, or \"*\" for any other")
      ->required();
  auto* gib_month_option = storage->add_option(
      "--per-gib-month", *per_gib_month,
      "CNY per GiB-month of 30 days, e.g. 0.288 (a whole number of micro-yuan per GiB-hour)");
  storage->add_option("--per-gib-hour", *per_gib_hour, "CNY per GiB-hour, e.g. 0.0004")
      ->excludes(gib_month_option);
  storage->add_option("--from", *storage_from, "Effective from, RFC 3339 (default: now)");
  storage->callback([=] {
    *action = AdminCall([=](Session& s, v1::BillingAdminService::Stub& stub) {
      int64_t micros = 0;
      if (int rc = ParseRate({"--per-gib-month", *per_gib_month, "--per-gib-hour",
                              *per_gib_hour, 720, "GiB-hour", false},
                             &micros);
          rc != kExitOk) {
        return rc;
      }
      if (!storage_from->empty() &&
          !ParseTime(*storage_from, storage_request->mutable_effective_time())) {
        return Fail("--from must be an RFC 3339 time");
      }
      storage_request->set_unit_price_micros(micros);
      v1::SetStoragePriceResponse response;
      grpc::Status status =
          stub.SetStoragePrice(s.Context().get(), *storage_request, &response);
      if (!status.ok()) return FailRpc(status, s);
      std::cout << storage_request->volume_kind() << " volumes: " << Yuan(micros)
                << " per GiB-hour (" << Yuan(micros * 720) << " per GiB-month) from "
                << (storage_from->empty() ? std::string("now") : *storage_from) << "\n";
      return kExitOk;
    });
  });
  admin->add_subcommand("audit", "Check every ledger invariant")->callback([=] {
    *action = AdminCall([](Session& s, v1::BillingAdminService::Stub& stub) {
      v1::RunAuditResponse response;
      grpc::Status status = stub.RunAudit(s.Context().get(), {}, &response);
      if (!status.ok()) return FailRpc(status, s);
      for (const auto& f : response.failures()) std::cout << "FAIL " << f << "\n";
      if (response.ok()) std::cout << "ok\n";
      return response.ok() ? kExitOk : kExitFailed;
    });
  });
}

}  // namespace

void AddBillingCommands(CLI::App& app, Action* action) {
  AddTenantCommands(app, action);
  AddAdminBillingCommands(app, action);
}

}  // namespace sv::cli
