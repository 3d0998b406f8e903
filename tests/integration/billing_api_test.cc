// Billing through a real svd: the tenant and admin billing API, the credit
// gate on CreateInstance, and a kill -9 of svd in the middle of a billing
// catch-up followed by a restart.
#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <thread>

#include "absl/strings/str_cat.h"
#include "api/errors.h"
#include "billing/billing.h"
#include "control/scheduling.h"
#include "store/migrations.h"
#include "sv/v1/billing.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

constexpr int64_t kPrice = 33'000;

int64_t QueryInt(const std::string& url, const std::string& sql) {
  pqxx::connection c(url);
  pqxx::nontransaction txn(c);
  auto rows = txn.exec(sql);
  return rows[0][0].is_null() ? -1 : rows[0][0].as<int64_t>();
}

// A tenant's balance, transfers, paging, the credit gate, top-ups with
// their idempotency, operator-only calls and the audit RPC.
TEST(BillingApiTest, BalanceCreditGateTopUpAndAudit) {
  SvdOptions options{CreateTestDatabase(), 16, 2, {"--billing-interval-ms", "200"}};
  options.billing_create_credit_minutes = 10;
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "payer");
  ASSERT_FALSE(token.empty());
  auto billing = v1::BillingService::NewStub(svd.channel());
  auto admin = v1::BillingAdminService::NewStub(svd.channel());
  auto instances = v1::InstanceService::NewStub(svd.channel());

  // The trial is granted on the first call and shown with its expiry.
  v1::Balance balance;
  ASSERT_TRUE(billing->GetBalance(Context(token).get(), {}, &balance).ok());
  EXPECT_EQ(balance.trial_micros(), 10'000'000);
  EXPECT_EQ(balance.paid_micros(), 0);
  EXPECT_TRUE(balance.has_trial_expire_time());
  EXPECT_EQ(balance.mode(), v1::PREPAID);

  // 16 GPUs for 10 minutes cost 5.28 CNY (covered); 32 GPUs 10.56 (not).
  v1::CreateInstanceRequest create;
  create.mutable_instance()->set_gpu_count(32);
  v1::Instance instance;
  grpc::Status refused = instances->CreateInstance(Context(token).get(), create, &instance);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "INSUFFICIENT_CREDIT");
  create.mutable_instance()->set_gpu_count(16);
  ASSERT_TRUE(instances->CreateInstance(Context(token).get(), create, &instance).ok());
  // A second 16 would fit alone, but not with the first one's minutes,
  // which metering has not charged yet: nothing is created.
  v1::Instance second;
  grpc::Status committed = instances->CreateInstance(Context(token).get(), create, &second);
  EXPECT_EQ(committed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(committed), "INSUFFICIENT_CREDIT");
  EXPECT_NE(committed.error_message().find("cost 10.56 CNY but only 10.00 CNY is available"),
            std::string::npos)
      << committed.error_message();
  v1::ListInstancesResponse mine;
  ASSERT_TRUE(instances->ListInstances(Context(token).get(), {}, &mine).ok());
  EXPECT_EQ(mine.instances_size(), 1);

  // Growing it to 32 is held to the same gate; it keeps its 16 GPUs.
  v1::GetInstanceRequest get;
  get.set_id(instance.id());
  v1::Instance seen;
  for (int i = 0; i < 300 && seen.state() != v1::RUNNING; ++i) {
    ASSERT_TRUE(instances->GetInstance(Context(token).get(), get, &seen).ok());
    if (seen.state() != v1::RUNNING) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(seen.state(), v1::RUNNING);
  v1::ResizeInstanceRequest grow;
  grow.set_id(instance.id());
  grow.set_gpu_count(32);
  v1::ResizeInstanceResponse grown;
  grpc::Status no_credit = instances->ResizeInstance(Context(token).get(), grow, &grown);
  EXPECT_EQ(no_credit.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(no_credit), "INSUFFICIENT_CREDIT") << no_credit.error_message();
  // A size no resize can reach is refused as such, not for its price.
  for (int size : {200, 136, 12}) {
    grow.set_gpu_count(size);
    grpc::Status invalid = instances->ResizeInstance(Context(token).get(), grow, &grown);
    EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << size;
    EXPECT_EQ(api::ReasonOf(invalid), "INVALID_GPU_COUNT") << size << ": "
                                                           << invalid.error_message();
  }
  ASSERT_TRUE(instances->GetInstance(Context(token).get(), get, &seen).ok());
  EXPECT_EQ(seen.gpu_count(), 16);

  // Top-ups are for operators; the payment id makes a replay a no-op.
  v1::TopUpRequest topup;
  v1::ListTenantBalancesResponse tenants;
  ASSERT_TRUE(admin->ListTenantBalances(Context(svd.admin_key()).get(), {}, &tenants).ok());
  std::string tenant_id;
  for (const auto& t : tenants.balances()) {
    if (t.tenant_name() == "payer") tenant_id = t.tenant_id();
  }
  ASSERT_FALSE(tenant_id.empty());
  topup.set_tenant_id(tenant_id);
  topup.set_payment_id("alipay-2026-0001");
  topup.set_amount_micros(50'000'000);
  v1::Transfer transfer;
  grpc::Status denied = admin->TopUp(Context(token).get(), topup, &transfer);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(admin->TopUp(Context(svd.admin_key()).get(), topup, &transfer).ok());
  EXPECT_EQ(transfer.idempotency_key(), "topup:alipay-2026-0001");
  EXPECT_EQ(transfer.tenant_delta_micros(), 50'000'000);
  ASSERT_TRUE(admin->TopUp(Context(svd.admin_key()).get(), topup, &transfer).ok());
  topup.set_amount_micros(60'000'000);
  grpc::Status clash = admin->TopUp(Context(svd.admin_key()).get(), topup, &transfer);
  EXPECT_EQ(clash.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(api::ReasonOf(clash), "IDEMPOTENCY_KEY_REUSED");
  topup.set_tenant_id("ten-doesnotexist");
  topup.set_payment_id("p2");
  EXPECT_EQ(admin->TopUp(Context(svd.admin_key()).get(), topup, &transfer).error_code(),
            grpc::StatusCode::NOT_FOUND);
  topup.set_amount_micros(-1);
  EXPECT_EQ(admin->TopUp(Context(svd.admin_key()).get(), topup, &transfer).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(billing->GetBalance(Context(token).get(), {}, &balance).ok());
  EXPECT_EQ(balance.paid_micros(), 50'000'000);

  // Transfers page one at a time: the trial grant, then the top-up.
  v1::ListTransfersRequest list;
  list.set_page_size(1);
  v1::ListTransfersResponse page;
  ASSERT_TRUE(billing->ListTransfers(Context(token).get(), list, &page).ok());
  ASSERT_EQ(page.transfers_size(), 1);
  EXPECT_EQ(page.transfers(0).kind(), "trial_grant");
  ASSERT_FALSE(page.next_page_token().empty());
  list.set_page_token(page.next_page_token());
  list.set_kind("topup");
  ASSERT_TRUE(billing->ListTransfers(Context(token).get(), list, &page).ok());
  ASSERT_EQ(page.transfers_size(), 1);
  EXPECT_EQ(page.transfers(0).kind(), "topup");
  list.set_page_token("not-a-token");
  grpc::Status bad = billing->ListTransfers(Context(token).get(), list, &page);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(bad), "INVALID_PAGE_TOKEN");

  // A kind the ledger cannot hold is refused, not answered with an empty
  // page; each kind the ledger's CHECK allows is accepted.
  v1::ListTransfersRequest by_kind;
  by_kind.set_kind("top-up");
  grpc::Status unknown_kind = billing->ListTransfers(Context(token).get(), by_kind, &page);
  EXPECT_EQ(unknown_kind.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(unknown_kind), "INVALID_FILTER");
  EXPECT_NE(unknown_kind.error_message().find("balance_move"), std::string::npos)
      << unknown_kind.error_message();
  std::string check;
  {
    pqxx::connection c(options.database_url);
    pqxx::nontransaction txn(c);
    check = txn.exec1("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                      "WHERE conname = 'ledger_transfers_kind_check'")[0]
                .as<std::string>();
  }
  int quoted = 0;
  for (char c : check) quoted += c == '\'' ? 1 : 0;
  EXPECT_EQ(quoted, 2 * static_cast<int>(std::size(billing::kTransferKinds))) << check;
  for (const char* kind : billing::kTransferKinds) {
    EXPECT_NE(check.find(absl::StrCat("'", kind, "'")), std::string::npos) << kind;
    by_kind.set_kind(kind);
    EXPECT_TRUE(billing->ListTransfers(Context(token).get(), by_kind, &page).ok()) << kind;
  }

  v1::Invoice invoice;
  v1::GetInvoiceRequest get_invoice;
  get_invoice.set_id("inv-nope");
  EXPECT_EQ(billing->GetInvoice(Context(token).get(), get_invoice, &invoice).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // The same through svctl: balance as a table, a top-up in CNY, the audit.
  auto svctl = [&](const std::string& key, std::vector<std::string> args) {
    args.insert(args.begin(), SvctlPath());
    return RunCapture(args, {"SVCTL_ENDPOINT=" + svd.endpoint(), "SVCTL_TOKEN=" + key,
                             "HOME=/nonexistent", "XDG_CONFIG_HOME="});
  };
  RunResult shown = svctl(token, {"balance"});
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("50.000000 CNY"), std::string::npos) << shown.out;
  RunResult topped = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "topup",
                                             tenant_id, "12.5", "--payment-id", "wx-77"});
  EXPECT_EQ(topped.exit_code, 0) << topped.err;
  EXPECT_NE(topped.out.find("12.500000 CNY"), std::string::npos) << topped.out;
  EXPECT_NE(topped.out.find("topup:wx-77"), std::string::npos) << topped.out;
  // The operator's tables: every tenant's balance, and the revenue summary.
  RunResult balances = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "balances"});
  EXPECT_EQ(balances.exit_code, 0) << balances.err;
  EXPECT_NE(balances.out.find(tenant_id), std::string::npos) << balances.out;
  EXPECT_NE(balances.out.find("62.500000 CNY"), std::string::npos) << balances.out;
  RunResult revenue = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "revenue"});
  EXPECT_EQ(revenue.exit_code, 0) << revenue.err;
  EXPECT_NE(revenue.out.find("top-ups"), std::string::npos) << revenue.out;
  EXPECT_NE(revenue.out.find("62.500000 CNY"), std::string::npos) << revenue.out;
  RunResult bad_range = svctl(svd.admin_key(),
                             {"--token", svd.admin_key(), "admin", "revenue", "--from", "yesterday"});
  EXPECT_NE(bad_range.exit_code, 0);
  EXPECT_NE(bad_range.err.find("RFC 3339"), std::string::npos) << bad_range.err;
  RunResult bad_amount = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin",
                                                 "topup", tenant_id, "1e3", "--payment-id",
                                                 "wx-78"});
  EXPECT_NE(bad_amount.exit_code, 0);
  EXPECT_NE(bad_amount.err.find("got '1e3'"), std::string::npos) << bad_amount.err;
  RunResult listed = svctl(token, {"transfers", "--kind", "topup"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("topup"), std::string::npos) << listed.out;
  // svctl knows the kinds (billing::kTransferKinds) and names them.
  RunResult bad_kind_cli = svctl(token, {"transfers", "--kind", "refund"});
  EXPECT_NE(bad_kind_cli.exit_code, 0);
  EXPECT_NE(bad_kind_cli.err.find("sla_refund"), std::string::npos) << bad_kind_cli.err;
  // A prepaid tenant has no invoices, and the table says why it is empty.
  RunResult no_invoices = svctl(token, {"invoices"});
  EXPECT_EQ(no_invoices.exit_code, 0) << no_invoices.err;
  EXPECT_NE(no_invoices.out.find("(no invoices"), std::string::npos) << no_invoices.out;

  // Newest first, a page at a time: wx-77, then alipay-2026-0001. A token
  // only works in the order that issued it.
  v1::ListTransfersRequest newest;
  newest.set_kind("topup");
  newest.set_page_size(1);
  newest.set_newest_first(true);
  std::vector<std::string> keys;
  for (int i = 0; i < 5; ++i) {
    v1::ListTransfersResponse p;
    ASSERT_TRUE(billing->ListTransfers(Context(token).get(), newest, &p).ok());
    for (const auto& t : p.transfers()) keys.push_back(t.idempotency_key());
    if (p.next_page_token().empty()) break;
    newest.set_page_token(p.next_page_token());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"topup:wx-77", "topup:alipay-2026-0001"}));
  v1::ListTransfersRequest oldest;
  oldest.set_kind("topup");
  oldest.set_page_size(1);
  ASSERT_TRUE(billing->ListTransfers(Context(token).get(), oldest, &page).ok());
  ASSERT_EQ(page.transfers_size(), 1);
  EXPECT_EQ(page.transfers(0).idempotency_key(), "topup:alipay-2026-0001");
  ASSERT_FALSE(page.next_page_token().empty());
  newest.set_page_token(page.next_page_token());
  grpc::Status mixed = billing->ListTransfers(Context(token).get(), newest, &page);
  EXPECT_EQ(mixed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(mixed), "INVALID_PAGE_TOKEN");
  RunResult newest_cli = svctl(token, {"transfers", "--kind", "topup", "--newest-first"});
  EXPECT_EQ(newest_cli.exit_code, 0) << newest_cli.err;
  EXPECT_LT(newest_cli.out.find("12.500000"), newest_cli.out.find("50.000000"))
      << newest_cli.out;
  // A time window: nothing before 2000, both top-ups after it; a bad time
  // is refused by svctl before any call.
  RunResult before_2000 =
      svctl(token, {"transfers", "--kind", "topup", "--to", "2000-01-01T00:00:00Z"});
  EXPECT_EQ(before_2000.exit_code, 0) << before_2000.err;
  EXPECT_EQ(before_2000.out.find("12.500000"), std::string::npos) << before_2000.out;
  RunResult since_2000 =
      svctl(token, {"transfers", "--kind", "topup", "--from", "2000-01-01T00:00:00Z"});
  EXPECT_NE(since_2000.out.find("12.500000"), std::string::npos) << since_2000.out;
  EXPECT_NE(since_2000.out.find("50.000000"), std::string::npos) << since_2000.out;
  RunResult bad_time = svctl(token, {"transfers", "--from", "yesterday"});
  EXPECT_NE(bad_time.exit_code, 0);
  EXPECT_NE(bad_time.err.find("RFC 3339"), std::string::npos) << bad_time.err;
  // An operator's credit and a refund of a top-up through svctl: the
  // revenue summary shows both.
  RunResult credited =
      svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "credit", "payer", "2.5",
                              "--credit-id", "inc-9", "--reason", "slow start on 12-01"});
  EXPECT_EQ(credited.exit_code, 0) << credited.err;
  EXPECT_NE(credited.out.find("2.500000 CNY"), std::string::npos) << credited.out;
  EXPECT_NE(credited.out.find("credit:inc-9"), std::string::npos) << credited.out;
  RunResult no_reason = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "credit",
                                                "payer", "1", "--credit-id", "inc-10"});
  EXPECT_NE(no_reason.exit_code, 0);
  EXPECT_NE(no_reason.err.find("--reason"), std::string::npos) << no_reason.err;
  RunResult refunded = svctl(svd.admin_key(),
                             {"--token", svd.admin_key(), "admin", "refund-topup", tenant_id,
                              "--payment-id", "wx-77", "--reason", "paid twice"});
  EXPECT_EQ(refunded.exit_code, 0) << refunded.err;
  EXPECT_NE(refunded.out.find("12.500000 CNY"), std::string::npos) << refunded.out;
  RunResult twice = svctl(svd.admin_key(),
                          {"--token", svd.admin_key(), "admin", "refund-topup", tenant_id,
                           "--payment-id", "wx-77", "--amount", "1", "--reason", "paid twice"});
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.err.find("IDEMPOTENCY_KEY_REUSED"), std::string::npos) << twice.err;
  RunResult summed = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "revenue"});
  EXPECT_NE(summed.out.find("credits given"), std::string::npos) << summed.out;
  EXPECT_NE(summed.out.find("2.500000 CNY"), std::string::npos) << summed.out;
  RunResult statement = svctl(token, {"transfers", "--kind", "credit"});
  EXPECT_NE(statement.out.find("REASON"), std::string::npos) << statement.out;
  EXPECT_NE(statement.out.find("slow start on 12-01"), std::string::npos) << statement.out;
  RunResult told = svctl(token, {"balance"});
  EXPECT_NE(told.out.find("slow start on 12-01"), std::string::npos) << told.out;
  EXPECT_NE(told.out.find("paid twice"), std::string::npos) << told.out;
  RunResult audited = svctl(svd.admin_key(), {"--token", svd.admin_key(), "admin", "audit"});
  EXPECT_EQ(audited.exit_code, 0) << audited.out << audited.err;

  v1::RunAuditResponse audit;
  EXPECT_EQ(admin->RunAudit(Context(token).get(), {}, &audit).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(admin->RunAudit(Context(svd.admin_key()).get(), {}, &audit).ok());
  for (const auto& f : audit.failures()) ADD_FAILURE() << f;
  EXPECT_TRUE(audit.ok());
  billing.reset();
  admin.reset();
  instances.reset();
}

// 30 hours of history for 60 instances are billed by svd in batches; svd
// is killed with SIGKILL while it bills, restarted, and finishes. Every
// instance-minute is charged exactly once, and `svd audit` passes.
// Starting a stopped instance is held to the create's credit gate: after a
// price rise the trial no longer covers its first 10 minutes, so the start
// is refused with INSUFFICIENT_CREDIT and the instance stays STOPPED; after a
// top-up it starts.
TEST(BillingApiTest, StartIsHeldToTheCreditGate) {
  SvdOptions options{CreateTestDatabase(), 4, 1, {"--billing-interval-ms", "200"}};
  options.billing_create_credit_minutes = 10;
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "restarter");
  ASSERT_FALSE(token.empty());
  auto instances = v1::InstanceService::NewStub(svd.channel());
  auto admin = v1::BillingAdminService::NewStub(svd.channel());

  // 8 GPUs for 10 minutes cost 2.64 CNY of the 10 CNY trial.
  v1::CreateInstanceRequest create;
  create.mutable_instance()->set_gpu_count(8);
  v1::Instance instance;
  ASSERT_TRUE(instances->CreateInstance(Context(token).get(), create, &instance).ok());
  v1::StopInstanceRequest stop;
  stop.set_id(instance.id());
  v1::Instance stopped;
  grpc::Status stop_status = instances->StopInstance(Context(token).get(), stop, &stopped);
  ASSERT_TRUE(stop_status.ok()) << stop_status.error_message();
  ASSERT_EQ(stopped.state(), v1::STOPPED);

  // The operator raises the price through svctl: 200,000 per GPU-minute,
  // 16 CNY for the first 10 minutes. A per-hour price that is not a whole
  // number of micro-yuan per minute is refused.
  auto svctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {SvctlPath(), "--token", svd.admin_key(), "admin"});
    return RunCapture(args, {"SVCTL_ENDPOINT=" + svd.endpoint(), "HOME=/nonexistent",
                             "XDG_CONFIG_HOME="});
  };
  RunResult inexact = svctl({"price", "RTX 4090", "--per-gpu-hour", "12.000001"});
  EXPECT_NE(inexact.exit_code, 0);
  EXPECT_NE(inexact.err.find("not a whole number"), std::string::npos) << inexact.err;
  RunResult priced = svctl({"price", "RTX 4090", "--per-gpu-hour", "12"});
  ASSERT_EQ(priced.exit_code, 0) << priced.err;
  EXPECT_NE(priced.out.find("0.200000 CNY per GPU-minute"), std::string::npos) << priced.out;
  // The tenant reads the price list: today's price until the one the
  // operator scheduled, then that one; the replaced 1.98 is gone.
  RunResult scheduled =
      svctl({"price", "RTX 4090", "--per-gpu-hour", "9", "--from", "2099-01-01T00:00:00Z"});
  ASSERT_EQ(scheduled.exit_code, 0) << scheduled.err;
  RunResult storage = svctl({"storage-price", "network", "--per-gib-month", "0.36", "--from",
                             "2099-01-01T00:00:00Z"});
  ASSERT_EQ(storage.exit_code, 0) << storage.err;
  RunResult inexact_storage = svctl({"storage-price", "network", "--per-gib-month", "0.3"});
  EXPECT_NE(inexact_storage.exit_code, 0);
  EXPECT_NE(inexact_storage.err.find("not a whole number"), std::string::npos)
      << inexact_storage.err;
  RunResult listed = RunCapture({SvctlPath(), "--token", token, "prices"},
                                {"SVCTL_ENDPOINT=" + svd.endpoint(), "HOME=/nonexistent",
                                 "XDG_CONFIG_HOME="});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("12.000000 CNY per GPU-hour"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("9.000000 CNY per GPU-hour"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("2099-01-01 00:00:00 UTC"), std::string::npos) << listed.out;
  int rtx_rows = 0;  // The replaced 1.98 is not among them.
  for (size_t at = listed.out.find("\nRTX 4090 "); at != std::string::npos;
       at = listed.out.find("\nRTX 4090 ", at + 1)) {
    ++rtx_rows;
  }
  EXPECT_EQ(rtx_rows, 2) << listed.out;
  EXPECT_NE(listed.out.find("network volume"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("0.288000 CNY per GiB-month"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("0.360000 CNY per GiB-month"), std::string::npos) << listed.out;

  v1::StartInstanceRequest start;
  start.set_id(instance.id());
  v1::Instance started;
  grpc::Status refused = instances->StartInstance(Context(token).get(), start, &started);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "INSUFFICIENT_CREDIT") << refused.error_message();
  v1::GetInstanceRequest get;
  get.set_id(instance.id());
  v1::Instance seen;
  ASSERT_TRUE(instances->GetInstance(Context(token).get(), get, &seen).ok());
  EXPECT_EQ(seen.state(), v1::STOPPED);

  // An unknown id is still NOT_FOUND, not a credit answer.
  start.set_id("ins-doesnotexist00");
  grpc::Status unknown = instances->StartInstance(Context(token).get(), start, &started);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);

  v1::ListTenantBalancesResponse tenants;
  ASSERT_TRUE(admin->ListTenantBalances(Context(svd.admin_key()).get(), {}, &tenants).ok());
  v1::TopUpRequest topup;
  for (const auto& t : tenants.balances()) {
    if (t.tenant_name() == "restarter") topup.set_tenant_id(t.tenant_id());
  }
  topup.set_payment_id("restart-1");
  topup.set_amount_micros(10'000'000);
  v1::Transfer transfer;
  ASSERT_TRUE(admin->TopUp(Context(svd.admin_key()).get(), topup, &transfer).ok());
  start.set_id(instance.id());
  grpc::Status ok = instances->StartInstance(Context(token).get(), start, &started);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_NE(started.state(), v1::STOPPED);

  // Postpaid through svctl: the tenant's balance shows the mode and limit.
  RunResult postpaid =
      svctl({"billing-mode", topup.tenant_id(), "postpaid", "--credit-limit", "5000"});
  ASSERT_EQ(postpaid.exit_code, 0) << postpaid.err;
  auto billing = v1::BillingService::NewStub(svd.channel());
  v1::Balance balance;
  ASSERT_TRUE(billing->GetBalance(Context(token).get(), {}, &balance).ok());
  EXPECT_EQ(balance.mode(), v1::POSTPAID);
  EXPECT_EQ(balance.credit_limit_micros(), 5'000'000'000);
  RunResult unknown_mode = svctl({"billing-mode", topup.tenant_id(), "monthly"});
  EXPECT_NE(unknown_mode.exit_code, 0);
  // A forgotten limit is an error, not a limit of 0; so is a malformed one,
  // and its message shows what was typed. The mode and limit stay.
  RunResult no_limit = svctl({"billing-mode", topup.tenant_id(), "postpaid"});
  EXPECT_NE(no_limit.exit_code, 0);
  EXPECT_NE(no_limit.err.find("--credit-limit"), std::string::npos) << no_limit.err;
  RunResult bad_limit =
      svctl({"billing-mode", topup.tenant_id(), "postpaid", "--credit-limit", "-5"});
  EXPECT_NE(bad_limit.exit_code, 0);
  EXPECT_NE(bad_limit.err.find("got '-5'"), std::string::npos) << bad_limit.err;
  ASSERT_TRUE(billing->GetBalance(Context(token).get(), {}, &balance).ok());
  EXPECT_EQ(balance.mode(), v1::POSTPAID);
  EXPECT_EQ(balance.credit_limit_micros(), 5'000'000'000);
}

TEST(BillingApiTest, KillNineDuringBillingLosesAndDoublesNothing) {
  const std::string url = CreateTestDatabase();
  const absl::Time now = absl::Now();
  const absl::Time start = now - absl::Hours(30) + absl::Seconds(17);
  std::map<std::string, std::pair<absl::Time, absl::Time>> runs;
  {
    store::DatabaseOptions db_options;
    db_options.url = url;
    store::Database db(db_options);
    ASSERT_TRUE(store::ApplyMigrations(db).ok());
    store::Store store(db);
    control::Scheduling scheduling(db, {});
    for (int n = 0; n < 16; ++n) {
      store::NodeRecord node{absl::StrCat("hist-", n), absl::StrCat("hist-", n), "z9", "p9",
                             "leaf-9", "RTX 4090", 8, store::NodeState::kReady, true};
      ASSERT_TRUE(store.UpsertNode(node, start).ok());
    }
    auto tenant = store.CreateTenant({"history", "h@example.com", store::Role::kMember,
                                      "key-history", "salt-history",
                                      std::string(64, 'b')},
                                     start);
    ASSERT_TRUE(tenant.ok());
    FakeClock clock(start);
    billing::BillingOptions bopts;
    bopts.first_run_lookback = absl::Hours(24 * 7);
    billing::Billing billing(db, store, clock, bopts);
    ASSERT_TRUE(billing.TopUp(tenant->tenant.id, "big", 100'000'000'000, start).ok());
    // Sets the metering cursor at the start of the history.
    ASSERT_TRUE(billing.BillMinutesBefore(billing::MinuteOf(start), start).ok());
    for (int i = 0; i < 60; ++i) {
      const absl::Time from = start + absl::Seconds(i * 7);
      const absl::Time to = now - absl::Hours(1) - absl::Seconds(i * 13);
      auto created = store.CreateInstance(tenant->tenant.id, {absl::StrCat("h", i), 1,
                                                              "RTX 4090", "ubuntu"},
                                          absl::StrCat("r", i), absl::StrCat("f", i), from);
      ASSERT_TRUE(created.ok());
      ASSERT_TRUE(scheduling.RunPass(from).ok());
      ASSERT_TRUE(store.AdvanceSimulatedStarts(from).ok());
      ASSERT_TRUE(store.AdvanceSimulatedStarts(from).ok());
      runs[created->id] = {from, to};
    }
    for (const auto& [id, run] : runs) {
      ASSERT_TRUE(store.StopInstance(tenant->tenant.id, id, "done", run.second).ok());
    }
  }
  // An hour per metering transaction: the 30 h catch-up takes 30 of them,
  // so the kill below lands inside it, even on a slow (sanitized) build.
  SvdOptions options{url, 0, 1,
                     {"--billing-interval-ms", "100", "--billing-batch-minutes", "60"}};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const int64_t first = QueryInt(url, "SELECT billed_before_minute FROM billing_cursor");
  int64_t charges_before_kill = 0;
  for (int i = 0; i < 200; ++i) {
    charges_before_kill = QueryInt(url, "SELECT count(*) FROM ledger_charges");
    if (charges_before_kill > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  svd.Kill();
  const int64_t cursor_at_kill = QueryInt(url, "SELECT billed_before_minute FROM billing_cursor");
  EXPECT_LT(cursor_at_kill, billing::MinuteOf(now) - 1) << "the kill came after billing ended";
  EXPECT_GE(cursor_at_kill, first);

  ASSERT_TRUE(svd.Start());
  const int64_t target = billing::MinuteOf(now - absl::Minutes(30));
  for (int i = 0; i < 600; ++i) {
    if (QueryInt(url, "SELECT billed_before_minute FROM billing_cursor") >= target) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(QueryInt(url, "SELECT billed_before_minute FROM billing_cursor"), target);
  int64_t expected_minutes = 0;
  for (const auto& [id, run] : runs) {
    const int64_t minutes = (absl::ToUnixMicros(run.second) - 1) / 60'000'000 -
                            billing::MinuteOf(run.first) + 1;
    expected_minutes += minutes;
    EXPECT_EQ(QueryInt(url, "SELECT count(DISTINCT usage_minute) FROM ledger_charge_legs "
                            "WHERE kind = 'charge' AND instance_id = '" + id + "'"),
              minutes)
        << id;
  }
  EXPECT_EQ(QueryInt(url, "SELECT count(*) FROM ledger_charge_legs WHERE kind = 'charge'"),
            expected_minutes + 1);  // One minute is split between trial and paid.
  EXPECT_EQ(QueryInt(url, "SELECT sum(amount_micros) FROM ledger_charge_legs "
                          "WHERE kind = 'charge'"),
            expected_minutes * kPrice);
  svd.Stop();
  RunResult audit = RunCapture({SvdPath(), "--database-url", url, "audit"}, {});
  EXPECT_EQ(audit.exit_code, 0) << audit.out << audit.err;
}

}  // namespace
}  // namespace sv::testing
