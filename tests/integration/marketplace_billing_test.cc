// The app marketplace against a real svd and simulated fleet: a publisher
// registers an image, a buyer launches it, and the metering pass charges
// the GPU rent and the app fee for every RUNNING minute, the fee split
// exactly 70:30 between the publisher's payable and platform revenue. The
// minutes are billed by the real ledger code under a fake clock on the same
// database (simulated hours in milliseconds); an independent model predicts
// every posting and the ledger auditor passes. See docs/marketplace.md.

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>
#include <pqxx/pqxx>
#include <thread>

#include "absl/strings/ascii.h"
#include "api/errors.h"
#include "billing/billing.h"
#include "common/clock.h"
#include "common/status.h"
#include "store/dashboard_store.h"
#include "store/database.h"
#include "store/store.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/billing.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/marketplace.grpc.pb.h"
#include "sv/v1/volume.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

constexpr int64_t kGpuMinuteMicros = 33'000;
constexpr int64_t kAppPerHourMicros = 1'000'000;  // 1 CNY an hour: not a multiple of 60.

// The model: an hourly price spread over the hour by cumulative flooring,
// the publisher's part floor(70%).
int64_t AppFee(int64_t minute) {
  const int64_t k = minute % 60;
  return kAppPerHourMicros * (k + 1) / 60 - kAppPerHourMicros * k / 60;
}
int64_t PublisherPart(int64_t fee) { return fee * 7 / 10; }

// The publisher's image `name` in its namespace of svd's app registry.
std::string PrivateImage(const std::string& tenant_id, const std::string& name) {
  return "registry.sv.internal/" + tenant_id + "/" + name + ":1.0";
}

// Registers `name` 1.0 as the publisher (tenant `publisher_id`), with the
// given size and price.
v1::MarketplaceImage RegisterApp(v1::MarketplaceService::Stub& market,
                                 const std::string& publisher, const std::string& publisher_id,
                                 const std::string& name, int gpus, int64_t per_hour,
                                 std::vector<int> ports) {
  v1::RegisterImageRequest reg;
  reg.mutable_image()->set_name(name);
  reg.mutable_image()->set_version("1.0");
  reg.mutable_image()->set_image(PrivateImage(publisher_id, name));
  for (int p : ports) reg.mutable_image()->add_ports(p);
  reg.mutable_image()->set_gpu_count(gpus);
  reg.mutable_image()->set_price_per_hour_micros(per_hour);
  reg.set_request_id("reg-" + name);
  v1::MarketplaceImage image;
  grpc::Status status = market.RegisterImage(Context(publisher).get(), reg, &image);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return image;
}

// The Unix minute the instance started running in.
int64_t RunningSinceMinute(pqxx::connection& sql, const std::string& id) {
  pqxx::work txn(sql);
  return txn.exec_params1(
      "SELECT floor(extract(epoch from running_since) / 60)::bigint FROM instances WHERE id = $1",
      id)[0].as<int64_t>();
}

// A real svd with a simulated fleet, a publisher and a buyer.
class MarketplaceBillingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = {CreateTestDatabase(), 2, 1, {"--billing-interval-ms", "200"}};
    options_.billing_create_credit_minutes = 10;  // svd's default: the gate is under test.
    svd_ = std::make_unique<SvdProcess>(options_);
    ASSERT_TRUE(svd_->Start());
    publisher_ = CreateTenant(*svd_, "studio");
    publisher_id_ = TenantIdByName(*svd_, "studio");
    buyer_ = CreateTenant(*svd_, "buyer");
    market_ = v1::MarketplaceService::NewStub(svd_->channel());
    instances_ = v1::InstanceService::NewStub(svd_->channel());
  }

  // An operator's top-up of the buyer's paid wallet (payment `payment_id`).
  void TopUpBuyer(const std::string& payment_id, int64_t amount_micros) {
    TopUpTenant(*svd_, "buyer", payment_id, amount_micros);
  }

  // The real metering on the same database, on a fake clock at `start`
  // with no lag (or `lag`), as the billing loop runs it.
  billing::Billing& FakeClockBilling(absl::Time start,
                                     absl::Duration lag = absl::ZeroDuration()) {
    store::DatabaseOptions db_options;
    db_options.url = options_.database_url;
    db_ = std::make_unique<store::Database>(db_options);
    store_ = std::make_unique<store::Store>(*db_);
    clock_ = std::make_unique<FakeClock>(start);
    billing::BillingOptions billing_options;
    billing_options.metering_lag = lag;
    billing_ = std::make_unique<billing::Billing>(*db_, *store_, *clock_, billing_options);
    return *billing_;
  }

  SvdOptions options_;
  std::unique_ptr<SvdProcess> svd_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<FakeClock> clock_;
  std::unique_ptr<billing::Billing> billing_;
  std::string publisher_, buyer_;
  std::string publisher_id_;
  std::unique_ptr<v1::MarketplaceService::Stub> market_;
  std::unique_ptr<v1::InstanceService::Stub> instances_;
};

// A registration of app "nul-text" whose description holds a NUL byte.
v1::RegisterImageRequest RequestForNul(const std::string& publisher_id) {
  v1::RegisterImageRequest reg;
  reg.mutable_image()->set_name("nul-text");
  reg.mutable_image()->set_version("1.0");
  reg.mutable_image()->set_image(PrivateImage(publisher_id, "nul-text"));
  reg.mutable_image()->set_gpu_count(1);
  reg.mutable_image()->set_description(std::string("fast\0 model", 11));
  reg.set_request_id("reg-nul-text");
  return reg;
}

// Goal: a marketplace launch pays rent plus the app fee every minute, the
// fee split exactly 70:30 in the ledger; the publisher's earnings report
// and a payout agree with the ledger, and the auditor passes.
TEST_F(MarketplaceBillingTest, LaunchChargesRentAndSplitAppFeeEveryMinute) {
  SvdProcess& svd = *svd_;
  const SvdOptions& options = options_;
  const std::string& publisher = publisher_;
  const std::string& buyer = buyer_;
  auto& market = market_;
  auto& instances = instances_;

  const v1::MarketplaceImage image =
      RegisterApp(*market, publisher, publisher_id_, "sd-webui", 8, kAppPerHourMicros, {7860});
  // Versions are immutable: the same name and version again is refused.
  v1::RegisterImageRequest reg;
  reg.mutable_image()->set_name("sd-webui");
  reg.mutable_image()->set_version("1.0");
  reg.mutable_image()->set_image("ghcr.io/example/sd-webui:1.0");
  reg.mutable_image()->set_gpu_count(8);
  reg.set_request_id("reg-2");
  v1::MarketplaceImage dup;
  EXPECT_EQ(market->RegisterImage(Context(publisher).get(), reg, &dup).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  // The first registration's request_id with another description is not a
  // retry of it: it used to return the first image, the new text dropped.
  v1::RegisterImageRequest retold;
  retold.mutable_image()->set_name("sd-webui");
  retold.mutable_image()->set_version("1.0");
  retold.mutable_image()->set_image(PrivateImage(publisher_id_, "sd-webui"));
  retold.mutable_image()->add_ports(7860);
  retold.mutable_image()->set_gpu_count(8);
  retold.mutable_image()->set_price_per_hour_micros(kAppPerHourMicros);
  retold.set_request_id("reg-sd-webui");
  ASSERT_TRUE(market->RegisterImage(Context(publisher).get(), retold, &dup).ok())
      << "the same body again is a retry";
  EXPECT_EQ(dup.id(), image.id());
  retold.mutable_image()->set_description("another text");
  grpc::Status reused = market->RegisterImage(Context(publisher).get(), retold, &dup);
  EXPECT_EQ(reused.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(api::ReasonOf(reused), "REQUEST_ID_REUSED") << reused.error_message();
  // Text with a NUL is refused: stored, it was cut at the NUL, and the same
  // request again was then told its request_id was reused.
  v1::RegisterImageRequest with_nul = RequestForNul(publisher_id_);
  grpc::Status nul = market->RegisterImage(Context(publisher).get(), with_nul, &dup);
  EXPECT_EQ(nul.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << nul.error_message();
  EXPECT_EQ(api::ReasonOf(nul), "INVALID_DESCRIPTION") << nul.error_message();

  // App fees are paid from paid credit only, so the launch needs some.
  TopUpBuyer("pay-1", 100 * billing::kMicrosPerYuan);
  v1::LaunchAppRequest launch;
  launch.set_app("sd-webui");
  launch.set_request_id("launch-1");
  v1::Instance app;
  ASSERT_TRUE(market->LaunchApp(Context(buyer).get(), launch, &app).ok());
  EXPECT_EQ(app.app_image_id(), image.id());
  EXPECT_EQ(app.gpu_count(), 8);
  v1::LaunchAppRequest unknown;
  unknown.set_app("no-such-app");
  v1::Instance none;
  EXPECT_EQ(market->LaunchApp(Context(buyer).get(), unknown, &none).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // The app's port gets a node port and a URL once it runs.
  v1::Instance running;
  ASSERT_TRUE(WaitFor([&] {
    v1::GetInstanceRequest get;
    get.set_id(app.id());
    instances->GetInstance(Context(buyer).get(), get, &running);
    return running.state() == v1::RUNNING && running.ports_size() == 1 &&
           !running.ports(0).url().empty();
  }));
  EXPECT_EQ(running.ports(0).container_port(), 7860);
  EXPECT_GE(running.ports(0).node_port(), 30000);
  EXPECT_EQ(running.ports(0).url(),
            "http://127.0.0.1:" + std::to_string(running.ports(0).node_port()));

  // A 100 GiB network disk of the buyer, billed per GiB-hour (400 micro-yuan).
  auto volumes = v1::VolumeService::NewStub(svd.channel());
  v1::CreateVolumeRequest create_volume;
  create_volume.mutable_volume()->set_size_gib(100);
  v1::Volume volume;
  ASSERT_TRUE(volumes->CreateVolume(Context(buyer).get(), create_volume, &volume).ok());

  // Bill 125 simulated minutes (always a whole clock hour) with the real metering.
  pqxx::connection sql(options.database_url);
  const int64_t running_since_minute = RunningSinceMinute(sql, app.id());
  billing::Billing& billing =
      FakeClockBilling(absl::FromUnixSeconds((running_since_minute + 125) * 60 + 5));
  FakeClock& clock = *clock_;
  store::Database& db = *db_;
  // The trial (10 CNY) pays rent until it runs out within the hour; the app
  // fee is paid from the top-up from the first minute: trial credit never
  // pays app fees (docs/marketplace.md).
  // Minute by minute, as the billing loop runs.
  const absl::Time end = clock.Now();
  for (absl::Time t = absl::FromUnixSeconds(running_since_minute * 60 + 5); t <= end;
       t += absl::Minutes(1)) {
    clock.Set(t);
    ASSERT_TRUE(billing.RunOnce(clock.Now()).ok());
  }
  ASSERT_TRUE(billing.RunOnce(clock.Now()).ok()) << "a second pass is a no-op";

  // Every billed minute: 8 GPUs of rent and the app fee, split 70:30.
  std::map<int64_t, std::map<std::string, int64_t>> by_minute;  // minute -> kind/to -> amount
  {
    pqxx::work txn(sql);
    for (const auto& r : txn.exec_params(
             "SELECT t.usage_minute, t.kind || '/' || a.kind, sum(t.amount_micros)::bigint "
             "FROM ledger_all_transfers t JOIN ledger_accounts a ON a.id = t.to_account_id "
             "WHERE t.instance_id = $1 GROUP BY 1, 2",
             app.id())) {
      by_minute[r[0].as<int64_t>()][r[1].as<std::string>()] = r[2].as<int64_t>();
    }
  }
  ASSERT_GE(by_minute.size(), 124u);
  int64_t publisher_total = 0, fees_total = 0;
  for (const auto& [minute, legs] : by_minute) {
    const int64_t fee = AppFee(minute);
    EXPECT_EQ(legs.at("charge/platform_revenue"), 8 * kGpuMinuteMicros) << minute;
    EXPECT_EQ(legs.at("app_fee/publisher_payable"), PublisherPart(fee)) << minute;
    EXPECT_EQ(legs.at("app_fee/platform_revenue"), fee - PublisherPart(fee)) << minute;
    publisher_total += PublisherPart(fee);
    fees_total += fee;
  }
  // A whole clock hour of app fees sums to the hourly price exactly.
  int64_t hour_sum = 0;
  const int64_t first_full_hour = (by_minute.begin()->first / 60 + 1) * 60;
  for (int64_t m = first_full_hour; m < first_full_hour + 60; ++m) {
    ASSERT_TRUE(by_minute.count(m)) << m;
    hour_sum += by_minute[m]["app_fee/publisher_payable"] + by_minute[m]["app_fee/platform_revenue"];
  }
  EXPECT_EQ(hour_sum, kAppPerHourMicros);

  {
    pqxx::work txn(sql);
    // Every app fee came from the paid wallet, none from the trial wallet,
    // which paid rent.
    EXPECT_EQ(txn.exec_params1("SELECT string_agg(DISTINCT f.kind, ',') FROM ledger_transfers t "
                               "JOIN ledger_accounts f ON f.id = t.from_account_id WHERE "
                               "t.instance_id = $1 AND t.kind = 'app_fee'",
                               app.id())[0].as<std::string>(),
              "paid_wallet");
    EXPECT_GT(txn.exec_params1("SELECT count(*) FROM ledger_charge_legs c JOIN "
                               "ledger_accounts f ON f.id = c.from_account_id WHERE "
                               "c.instance_id = $1 AND f.kind = 'trial_wallet'",
                               app.id())[0].as<int>(), 0);
    // Storage: a whole clock hour of the disk costs 100 GiB x 400 exactly.
    EXPECT_EQ(txn.exec_params1("SELECT sum(amount_micros)::bigint FROM ledger_transfers "
                               "WHERE kind = 'storage' AND idempotency_key LIKE $1 "
                               "AND usage_minute >= $2 AND usage_minute < $2 + 60",
                               "storage:" + volume.id() + ":%", first_full_hour)[0]
                  .as<int64_t>(),
              100 * 400);
  }
  auto audit = billing.Audit();
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE(audit->empty()) << (audit->empty() ? "" : audit->front());

  // The operator's revenue summary shows the app fees and storage, and its
  // lines add up to the platform revenue account.
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->app_fees_micros, fees_total);
  EXPECT_EQ(summary->app_fees_to_publishers_micros, publisher_total);
  {
    pqxx::work txn(sql);
    EXPECT_EQ(summary->storage_micros,
              txn.exec1("SELECT coalesce(sum(amount_micros), 0)::bigint FROM ledger_transfers "
                        "WHERE kind = 'storage'")[0].as<int64_t>());
  }
  EXPECT_GT(summary->storage_micros, 0);
  EXPECT_EQ(summary->platform_revenue_micros, summary->platform_revenue_balance_micros);
  EXPECT_EQ(summary->platform_revenue_micros,
            summary->charged_micros + summary->app_fees_micros -
                summary->app_fees_to_publishers_micros + summary->storage_micros +
                summary->adjustments_net_micros);
  // The operator's dashboard counts the platform's part of the app fees and
  // the storage in its revenue series.
  {
    store::DashboardStore dashboard(db);
    auto points = dashboard.RevenueSeries(absl::UnixEpoch(), end + absl::Hours(1), false);
    ASSERT_TRUE(points.ok()) << points.status();
    int64_t app_fees = 0, storage = 0;
    for (const auto& p : *points) {
      app_fees += p.app_fees_micros;
      storage += p.storage_micros;
    }
    EXPECT_EQ(app_fees, fees_total - publisher_total);
    EXPECT_EQ(storage, summary->storage_micros);
  }

  // The publisher's report agrees with the ledger.
  v1::PublisherEarnings earnings;
  v1::PublisherEarningsRequest window;  // The simulated minutes lie ahead of the real clock.
  window.mutable_end_time()->set_seconds(absl::ToUnixSeconds(end) + 3600);
  ASSERT_TRUE(market->GetPublisherEarnings(Context(publisher).get(), window, &earnings).ok());
  EXPECT_EQ(earnings.fees_micros(), fees_total);
  // A time PostgreSQL cannot take is the caller's error, as in every other
  // service (it was INTERNAL / DATABASE_ERROR over gRPC).
  for (int64_t seconds : {int64_t{-100'000'000'000}, int64_t{300'000'000'000}}) {
    v1::PublisherEarningsRequest bad = window;
    bad.mutable_start_time()->set_seconds(seconds);
    v1::PublisherEarnings none;
    grpc::Status refused = market->GetPublisherEarnings(Context(publisher).get(), bad, &none);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << seconds;
    EXPECT_EQ(api::ReasonOf(refused), "INVALID_TIME") << refused.error_message();
  }
  EXPECT_EQ(earnings.publisher_share_micros(), publisher_total);
  EXPECT_EQ(earnings.platform_share_micros(), fees_total - publisher_total);
  EXPECT_EQ(earnings.payable_balance_micros(), publisher_total);
  ASSERT_EQ(earnings.images_size(), 1);
  EXPECT_EQ(earnings.images(0).billed_minutes(), static_cast<int64_t>(by_minute.size()));

  // Payouts: never beyond what is owed; idempotent by reference.
  auto admin = v1::MarketplaceAdminService::NewStub(svd.channel());
  v1::RecordPayoutRequest payout;
  payout.set_publisher_tenant_id(earnings.publisher_tenant_id());
  payout.set_amount_micros(publisher_total + 1);
  payout.set_reference("bank-2026-11-001");
  v1::Payout recorded;
  grpc::Status too_much = admin->RecordPayout(Context(svd.admin_key()).get(), payout, &recorded);
  EXPECT_EQ(too_much.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(too_much), "INSUFFICIENT_PAYABLE");
  EXPECT_NE(too_much.error_message().find(absl::StrCat("owed ", Yuan(publisher_total),
                                                       ", less than the payout of ",
                                                       Yuan(publisher_total + 1))),
            std::string::npos)
      << too_much.error_message();
  payout.set_amount_micros(publisher_total - 1000);
  ASSERT_TRUE(admin->RecordPayout(Context(svd.admin_key()).get(), payout, &recorded).ok());
  ASSERT_TRUE(admin->RecordPayout(Context(svd.admin_key()).get(), payout, &recorded).ok());
  EXPECT_EQ(admin->RecordPayout(Context(publisher).get(), payout, &recorded).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(market->GetPublisherEarnings(Context(publisher).get(), window, &earnings).ok());
  EXPECT_EQ(earnings.paid_out_micros(), publisher_total - 1000);
  EXPECT_EQ(earnings.payable_balance_micros(), 1000);
  v1::ListPayoutsResponse payouts;
  ASSERT_TRUE(market->ListPayouts(Context(publisher).get(), {}, &payouts).ok());
  ASSERT_EQ(payouts.payouts_size(), 1);

  audit = billing.Audit();
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE(audit->empty()) << (audit->empty() ? "" : audit->front());
}

// Goal: trial credit never reaches a publisher, and a buyer learns so
// before launching, not a minute after. (Trial credit used to pay app fees:
// anyone could publish an app and turn each new tenant's trial into 70%
// cash. Then a buyer with only its trial got an instance that ran a minute
// on the trial and stopped for its unpaid fee.)
//
// 600 CNY an hour is 10 CNY a minute. With trial credit only the launch is
// refused; with 100 CNY paid it starts, the trial pays the rent and the
// paid wallet the fees for ten minutes; the eleventh fee is not collected
// (app_fee_shortfalls) and the instance stops. The publisher's payable,
// money it can be paid out, holds 70% of the paid 100 CNY and not a micro
// more. Started again with the trial alone, it is refused; a retry of the
// launch gets its instance back.
TEST_F(MarketplaceBillingTest, TrialCreditPaysNoAppFee) {
  constexpr int64_t kPerMinute = 10 * billing::kMicrosPerYuan;
  const v1::MarketplaceImage pricey =
      RegisterApp(*market_, publisher_, publisher_id_, "pricey", 1, 60 * kPerMinute, {});
  v1::LaunchAppRequest launch;
  launch.set_app("pricey");
  launch.set_request_id("launch-p");
  v1::Instance app;
  grpc::Status refused = market_->LaunchApp(Context(buyer_).get(), launch, &app);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "INSUFFICIENT_CREDIT");
  EXPECT_NE(refused.error_message().find("trial credit pays rent only"), std::string::npos)
      << refused.error_message();
  pqxx::connection sql(options_.database_url);
  auto count = [&](const std::string& query) {
    pqxx::work txn(sql);
    return txn.exec1(query)[0].as<int64_t>();
  };
  EXPECT_EQ(count("SELECT count(*) FROM instances"), 0) << "a refused launch writes nothing";

  // Ten minutes of fees are needed (the trial covers the rent): a micro
  // short is refused, the full amount launches.
  TopUpBuyer("pay-1", 10 * kPerMinute - 1);
  refused = market_->LaunchApp(Context(buyer_).get(), launch, &app);
  EXPECT_EQ(api::ReasonOf(refused), "INSUFFICIENT_CREDIT") << refused.error_message();
  TopUpBuyer("pay-2", 1);
  ASSERT_TRUE(market_->LaunchApp(Context(buyer_).get(), launch, &app).ok());
  ASSERT_TRUE(WaitFor([&] {
    v1::GetInstanceRequest get;
    get.set_id(app.id());
    v1::Instance i;
    return instances_->GetInstance(Context(buyer_).get(), get, &i).ok() &&
           i.state() == v1::RUNNING;
  }));

  const int64_t running_since_minute = RunningSinceMinute(sql, app.id());
  billing::Billing& billing =
      FakeClockBilling(absl::FromUnixSeconds(running_since_minute * 60 + 5));
  FakeClock& clock = *clock_;
  for (int k = 1; k <= 13; ++k) {
    clock.Set(absl::FromUnixSeconds((running_since_minute + k) * 60 + 5));
    ASSERT_TRUE(billing.RunOnce(clock.Now()).ok());
  }
  EXPECT_EQ(count("SELECT coalesce(sum(amount_micros), 0)::bigint FROM ledger_transfers "
                  "WHERE kind = 'app_fee'"),
            10 * kPerMinute);
  EXPECT_EQ(count("SELECT coalesce(sum(balance_micros), 0)::bigint FROM ledger_accounts "
                  "WHERE kind = 'publisher_payable'"),
            7 * kPerMinute);
  EXPECT_EQ(count("SELECT balance_micros FROM ledger_accounts a JOIN tenants t "
                  "ON t.id = a.tenant_id WHERE t.name = 'buyer' AND a.kind = 'paid_wallet'"),
            0);
  EXPECT_GT(count("SELECT count(*) FROM app_fee_shortfalls"), 0);
  // The operator's revenue summary shows the fees that went uncollected.
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(summary.ok());
  EXPECT_GE(summary->app_fee_shortfall_micros, kPerMinute);
  EXPECT_EQ(summary->app_fee_shortfall_micros,
            count("SELECT sum(fee_micros - charged_micros)::bigint FROM app_fee_shortfalls"));
  {
    pqxx::work txn(sql);
    EXPECT_EQ(txn.exec_params1("SELECT state FROM instances WHERE id = $1", app.id())[0]
                  .as<std::string>(),
              "STOPPED");
  }
  // The trial paid every minute's rent and still holds most of its 10 CNY.
  const int64_t trial_left =
      count("SELECT balance_micros FROM ledger_accounts a JOIN tenants t "
            "ON t.id = a.tenant_id WHERE t.name = 'buyer' AND a.kind = 'trial_wallet'");
  EXPECT_GT(trial_left, 9 * billing::kMicrosPerYuan);
  EXPECT_LT(trial_left, 10 * billing::kMicrosPerYuan);

  v1::StartInstanceRequest start;
  start.set_id(app.id());
  v1::Instance started;
  refused = instances_->StartInstance(Context(buyer_).get(), start, &started);
  EXPECT_EQ(api::ReasonOf(refused), "INSUFFICIENT_CREDIT") << refused.error_message();
  v1::Instance again;
  grpc::Status retried = market_->LaunchApp(Context(buyer_).get(), launch, &again);
  ASSERT_TRUE(retried.ok()) << retried.error_message();
  EXPECT_EQ(again.id(), app.id());
  // Delisted since, the retry is still answered with its launch (by name,
  // which now resolves to no listed version); a new launch is refused.
  v1::DelistImageRequest delist;
  delist.set_id(pricey.id());
  v1::MarketplaceImage delisted;
  ASSERT_TRUE(market_->DelistImage(Context(publisher_).get(), delist, &delisted).ok());
  retried = market_->LaunchApp(Context(buyer_).get(), launch, &again);
  ASSERT_TRUE(retried.ok()) << retried.error_message();
  EXPECT_EQ(again.id(), app.id());
  launch.set_request_id("launch-q");
  EXPECT_EQ(api::ReasonOf(market_->LaunchApp(Context(buyer_).get(), launch, &again)),
            "IMAGE_NOT_FOUND");
  launch.set_app("pricey:1.0");
  EXPECT_EQ(api::ReasonOf(market_->LaunchApp(Context(buyer_).get(), launch, &again)),
            "IMAGE_DELISTED");
  EXPECT_EQ(count("SELECT count(*) FROM instances"), 1);

  // A request_id already taken is refused as such, before the catalog and
  // the wallet are asked: by a launch of another app (which the empty paid
  // wallet could not pay for), and by a plain create (whose request_id now
  // names a delisted app).
  RegisterApp(*market_, publisher_, publisher_id_, "pricier", 1, 90 * kPerMinute, {});
  v1::LaunchAppRequest other = launch;
  other.set_app("pricier");
  other.set_request_id("launch-p");
  grpc::Status reused = market_->LaunchApp(Context(buyer_).get(), other, &again);
  EXPECT_EQ(reused.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(api::ReasonOf(reused), "REQUEST_ID_REUSED") << reused.error_message();
  EXPECT_NE(reused.error_message().find(app.id()), std::string::npos) << reused.error_message();
  v1::CreateInstanceRequest plain;
  plain.set_request_id("plain-1");
  plain.mutable_instance()->set_gpu_count(1);
  v1::Instance created;
  ASSERT_TRUE(instances_->CreateInstance(Context(buyer_).get(), plain, &created).ok());
  launch.set_request_id("plain-1");
  reused = market_->LaunchApp(Context(buyer_).get(), launch, &again);
  EXPECT_EQ(api::ReasonOf(reused), "REQUEST_ID_REUSED") << reused.error_message();
  EXPECT_EQ(count("SELECT count(*) FROM instances"), 2);

  auto audit = billing.Audit();
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE(audit->empty()) << (audit->empty() ? "" : audit->front());
}

// Goal: while its publisher is suspended an app is out of the catalog and
// cannot be launched (FAILED_PRECONDITION / PUBLISHER_SUSPENDED), and the
// publisher registers nothing new; once resumed, both work again.
// Goal: registrations that race are answered as if one came first. A
// retry racing its original (one request_id), or two publishers taking one
// app name at once, used to find no row, and then the second failed on a
// unique key with INTERNAL, or both publishers got the name.
TEST_F(MarketplaceBillingTest, RacingRegistrationsAreAnsweredAsIfOneCameFirst) {
  const std::string buyer_id = TenantIdByName(*svd_, "buyer");
  auto request = [](const std::string& tenant_id, const std::string& name,
                    const std::string& version, const std::string& request_id) {
    v1::RegisterImageRequest reg;
    reg.mutable_image()->set_name(name);
    reg.mutable_image()->set_version(version);
    reg.mutable_image()->set_image(PrivateImage(tenant_id, name));
    reg.mutable_image()->set_gpu_count(1);
    reg.mutable_image()->set_price_per_hour_micros(kAppPerHourMicros);
    reg.set_request_id(request_id);
    return reg;
  };
  for (int round = 0; round < 4; ++round) {
    const std::string name = absl::StrCat("race-", round);
    // One request sent by eight clients at once.
    std::vector<grpc::Status> statuses(8);
    std::vector<v1::MarketplaceImage> images(8);
    const v1::RegisterImageRequest same =
        request(publisher_id_, name, "1.0", absl::StrCat("reg-race-", round));
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        statuses[i] = market_->RegisterImage(Context(publisher_).get(), same, &images[i]);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(statuses[i].ok()) << round << ": " << statuses[i].error_message();
      EXPECT_EQ(images[i].id(), images[0].id());
    }
    // Two publishers take one new name at once: one gets it.
    const std::string contested = absl::StrCat("contested-", round);
    grpc::Status first, second;
    v1::MarketplaceImage a, b;
    std::thread one([&] {
      first = market_->RegisterImage(Context(publisher_).get(),
                                     request(publisher_id_, contested, "1.0", "c-" + contested),
                                     &a);
    });
    std::thread two([&] {
      second = market_->RegisterImage(Context(buyer_).get(),
                                      request(buyer_id, contested, "2.0", "c-" + contested), &b);
    });
    one.join();
    two.join();
    EXPECT_NE(first.ok(), second.ok()) << first.error_message() << " / "
                                       << second.error_message();
    const grpc::Status& lost = first.ok() ? second : first;
    EXPECT_EQ(api::ReasonOf(lost), "IMAGE_NAME_TAKEN") << lost.error_message();
  }
}

TEST_F(MarketplaceBillingTest, SuspendedPublishersAppsAreNotOffered) {
  const v1::MarketplaceImage image =
      RegisterApp(*market_, publisher_, publisher_id_, "comfy", 1, kAppPerHourMicros, {8188});
  TopUpBuyer("pay-suspend", 100 * billing::kMicrosPerYuan);
  auto catalog_has = [&](const std::string& id) {
    v1::ListImagesResponse listed;
    EXPECT_TRUE(market_->ListImages(Context(buyer_).get(), {}, &listed).ok());
    for (const auto& i : listed.images()) {
      if (i.id() == id) return true;
    }
    return false;
  };
  EXPECT_TRUE(catalog_has(image.id()));
  v1::AdminService::Stub admin(svd_->channel());
  v1::SuspendTenantRequest suspend;
  suspend.set_tenant_id(TenantIdByName(*svd_, "studio"));
  suspend.set_reason("malware in a published image");
  v1::SuspendTenantResponse suspended;
  ASSERT_TRUE(admin.SuspendTenant(Context(svd_->admin_key()).get(), suspend, &suspended).ok());

  EXPECT_FALSE(catalog_has(image.id()));
  v1::LaunchAppRequest launch;
  launch.set_app("comfy");
  launch.set_request_id("launch-suspended");
  v1::Instance app;
  grpc::Status refused = market_->LaunchApp(Context(buyer_).get(), launch, &app);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "PUBLISHER_SUSPENDED");
  // A launch whose API check ran before the suspension committed reaches
  // the create with the image: the create checks again (it launched a
  // suspended publisher's image, which then ran on for good).
  FakeClockBilling(absl::Now());
  store::CreateRequest late;
  late.tenant_id = TenantIdByName(*svd_, "buyer");
  late.spec = {"comfy-late", 1, "RTX 4090", "ghcr.io/example/comfy:1.0"};
  late.spec.extras.app_image_id = image.id();
  late.request_id = "launch-checked-before";
  late.fingerprint = "f-late";
  late.now = absl::Now();
  auto created = store_->CreateInstances({late});
  ASSERT_EQ(created.size(), 1u);
  EXPECT_EQ(sv::ReasonOf(created[0].status()), "PUBLISHER_SUSPENDED") << created[0].status();
  v1::RegisterImageRequest reg;
  reg.mutable_image()->set_name("comfy");
  reg.mutable_image()->set_version("2.0");
  reg.mutable_image()->set_image("ghcr.io/example/comfy:2.0");
  reg.mutable_image()->set_gpu_count(1);
  reg.set_request_id("reg-comfy-2");
  v1::MarketplaceImage second;
  refused = market_->RegisterImage(Context(publisher_).get(), reg, &second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "TENANT_SUSPENDED");
  // The publisher still sees its own images.
  v1::ListImagesRequest mine;
  mine.set_mine(true);
  v1::ListImagesResponse own;
  ASSERT_TRUE(market_->ListImages(Context(publisher_).get(), mine, &own).ok());
  EXPECT_EQ(own.images_size(), 1);
  // Its payouts are held.
  v1::MarketplaceAdminService::Stub payouts(svd_->channel());
  v1::RecordPayoutRequest payout;
  payout.set_publisher_tenant_id(suspend.tenant_id());
  payout.set_amount_micros(1);
  payout.set_reference("held-1");
  v1::Payout recorded;
  refused = payouts.RecordPayout(Context(svd_->admin_key()).get(), payout, &recorded);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "PUBLISHER_SUSPENDED");

  v1::ResumeTenantRequest resume;
  resume.set_tenant_id(suspend.tenant_id());
  resume.set_reason("image removed");
  v1::ResumeTenantResponse resumed;
  ASSERT_TRUE(admin.ResumeTenant(Context(svd_->admin_key()).get(), resume, &resumed).ok());
  EXPECT_TRUE(catalog_has(image.id()));
  grpc::Status status = market_->LaunchApp(Context(buyer_).get(), launch, &app);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(app.app_image_id(), image.id());
}

// Goal: an app's instance stops in the first minute whose fee its paid
// credit cannot pay, although metering, 60 s behind, learns of it two
// minutes later; and not a turn earlier. (It used to run on until metering
// capped the fee, two minutes later: three minutes of fees, 30 CNY here,
// went unpaid, 70% of them the publisher's.)
//
// 100 CNY of paid credit pays ten minutes of a 600 CNY/h app; the trial
// pays the rent. The loop's turns fall every 5 s from 2 s into a minute.
TEST_F(MarketplaceBillingTest, StopsAsPaidCreditRunsOutForTheAppFee) {
  constexpr int64_t kPerMinute = 10 * billing::kMicrosPerYuan;
  RegisterApp(*market_, publisher_, publisher_id_, "metered", 1, 60 * kPerMinute, {});
  TopUpBuyer("pay-m", 10 * kPerMinute);
  v1::LaunchAppRequest launch;
  launch.set_app("metered");
  launch.set_request_id("launch-m");
  v1::Instance app;
  grpc::Status launched = market_->LaunchApp(Context(buyer_).get(), launch, &app);
  ASSERT_TRUE(launched.ok()) << launched.error_message();
  pqxx::connection sql(options_.database_url);
  ASSERT_TRUE(WaitFor([&] {
    pqxx::work txn(sql);
    return txn.exec_params1("SELECT state FROM instances WHERE id = $1", app.id())[0]
               .as<std::string>() == "RUNNING";
  }));
  const int64_t r = RunningSinceMinute(sql, app.id());
  billing::Billing& billing =
      FakeClockBilling(absl::FromUnixSeconds((r + 1) * 60 + 2), absl::Seconds(60));
  FakeClock& clock = *clock_;
  while (clock.Now() < absl::FromUnixSeconds((r + 14) * 60)) {
    ASSERT_TRUE(billing.RunOnce(clock.Now()).ok());
    clock.Advance(absl::Seconds(5));
  }
  auto count = [&](const std::string& query) {
    pqxx::work txn(sql);
    return txn.exec_params1(query, app.id())[0].as<int64_t>();
  };
  // Minutes r to r + 9 paid their fees; the first turn in minute r + 10
  // stopped the instance.
  EXPECT_EQ(count("SELECT (extract(epoch from max(at)) * 1000)::bigint FROM instance_events "
                  "WHERE instance_id = $1 AND to_state = 'STOPPED'"),
            ((r + 10) * 60 + 2) * 1000);
  EXPECT_EQ(count("SELECT coalesce(sum(amount_micros), 0)::bigint FROM ledger_transfers "
                  "WHERE kind = 'app_fee' AND instance_id = $1"),
            10 * kPerMinute);
  EXPECT_EQ(count("SELECT count(*) FROM app_fee_shortfalls WHERE instance_id = $1"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM billing_notices WHERE instance_id = $1 "
                  "AND kind = 'credit_exhausted' AND message LIKE '%app fee%'"),
            1);
  auto audit = billing.Audit();
  ASSERT_TRUE(audit.ok());
  EXPECT_TRUE(audit->empty()) << (audit->empty() ? "" : audit->front());
}

// Goal: a priced app runs only through LaunchApp, which charges its fee.
// Its image must be in the publisher's namespace of the app registry
// (not a public image anyone could run, or any publisher could price),
// and no other tenant may create an instance of, or publish, an image in
// that namespace, however the registry host is spelt. (Before, a buyer
// read the app's image from the catalog and created it directly: the
// publisher's software ran and nobody paid a fee.)
TEST_F(MarketplaceBillingTest, PricedAppsRunOnlyThroughTheMarketplace) {
  v1::RegisterImageRequest pub;
  pub.mutable_image()->set_name("trainer");
  pub.mutable_image()->set_version("1.0");
  pub.mutable_image()->set_image("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime");
  pub.mutable_image()->set_gpu_count(1);
  pub.mutable_image()->set_price_per_hour_micros(kAppPerHourMicros);
  pub.set_request_id("reg-public");
  v1::MarketplaceImage none;
  grpc::Status refused = market_->RegisterImage(Context(publisher_).get(), pub, &none);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(refused), "IMAGE_NOT_IN_NAMESPACE");
  EXPECT_NE(refused.error_message().find("registry.sv.internal/" + publisher_id_ + "/"),
            std::string::npos)
      << refused.error_message();
  // The same image as a free app is fine: it is anyone's to run.
  pub.mutable_image()->set_price_per_hour_micros(0);
  pub.set_request_id("reg-public-free");
  EXPECT_TRUE(market_->RegisterImage(Context(publisher_).get(), pub, &none).ok());

  const v1::MarketplaceImage app =
      RegisterApp(*market_, publisher_, publisher_id_, "trainer-pro", 1, kAppPerHourMicros, {});
  // The catalog shows the reference; knowing it does not let one run it.
  v1::GetImageRequest get;
  get.set_id(app.id());
  v1::MarketplaceImage seen;
  ASSERT_TRUE(market_->GetImage(Context(buyer_).get(), get, &seen).ok());
  const std::string ref = PrivateImage(publisher_id_, "trainer-pro");
  EXPECT_EQ(seen.image(), ref);
  const std::string tail = ref.substr(std::string("registry.sv.internal").size());
  for (const std::string& image :
       {ref, "REGISTRY.sv.Internal" + tail, "registry.sv.internal:443" + tail,
        "registry.sv.internal." + tail,
        "registry.sv.internal/" + absl::AsciiStrToUpper(publisher_id_) + "/other:2"}) {
    v1::CreateInstanceRequest create;
    create.mutable_instance()->set_gpu_count(1);
    create.mutable_instance()->set_image(image);
    create.set_request_id("direct-" + std::to_string(image.size()) + image.substr(0, 4));
    v1::Instance instance;
    refused = instances_->CreateInstance(Context(buyer_).get(), create, &instance);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << image;
    EXPECT_EQ(api::ReasonOf(refused), "IMAGE_NOT_YOURS") << image;
    // Nor as the buyer's own app, free or priced.
    v1::RegisterImageRequest copy;
    copy.mutable_image()->set_name("copy");
    copy.mutable_image()->set_version(std::to_string(image.size()));
    copy.mutable_image()->set_image(image);
    copy.mutable_image()->set_gpu_count(1);
    copy.set_request_id(create.request_id());
    refused = market_->RegisterImage(Context(buyer_).get(), copy, &none);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << image;
    EXPECT_EQ(api::ReasonOf(refused), "IMAGE_NOT_YOURS") << image;
  }
  v1::ListInstancesRequest list;
  v1::ListInstancesResponse buyers;
  ASSERT_TRUE(instances_->ListInstances(Context(buyer_).get(), list, &buyers).ok());
  EXPECT_EQ(buyers.instances_size(), 0);

  // Launched, it runs that image and is billed as the app.
  TopUpBuyer("pay-ns", 100 * billing::kMicrosPerYuan);
  v1::LaunchAppRequest launch;
  launch.set_app("trainer-pro");
  launch.set_request_id("launch-ns");
  v1::Instance launched;
  grpc::Status status = market_->LaunchApp(Context(buyer_).get(), launch, &launched);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(launched.image(), ref);
  EXPECT_EQ(launched.app_image_id(), app.id());
  // The publisher runs its own images as it likes.
  v1::CreateInstanceRequest own;
  own.mutable_instance()->set_gpu_count(1);
  own.mutable_instance()->set_image(ref);
  own.set_request_id("own-image");
  v1::Instance mine;
  status = instances_->CreateInstance(Context(publisher_).get(), own, &mine);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace sv::testing
