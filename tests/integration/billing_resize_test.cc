// A resize keeps the instance and its billing: each minute is charged at the
// largest GPU count the instance held during that minute (each started
// GPU-minute is charged, so growing just after a minute starts and
// shrinking before it ends saves nothing), and earlier minutes are never
// charged retroactively at the new size. Real PostgreSQL, fake clock.
#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "control/scheduling.h"
#include "gtest/gtest.h"
#include "store/migrations.h"
#include "tests/integration/harness.h"

namespace sv::billing {
namespace {

constexpr int64_t kPrice = 33'000;

TEST(BillingResizeTest, MinutesAreChargedAtTheLargestSizeHeldInThem) {
  store::DatabaseOptions options;
  options.url = sv::testing::CreateTestDatabase();
  store::Database db(options);
  ASSERT_TRUE(store::ApplyMigrations(db).ok());
  store::Store store(db);
  control::Scheduling scheduling(db, control::SchedulingOptions{});
  // On a minute boundary plus 20 s, so that every change falls mid-minute.
  FakeClock clock(absl::FromUnixSeconds(1'790'000'000 / 60 * 60 + 20));
  ASSERT_TRUE(sv::testing::AddSimulatedNodes(store, 4, 1, clock.Now()).ok());
  BillingOptions billing_options;
  billing_options.metering_lag = absl::ZeroDuration();
  billing_options.first_run_lookback = absl::Hours(24);
  Billing billing(db, store, clock, billing_options);
  auto tenant = store.CreateTenant(
      {"resizer", "resizer@example.com", store::Role::kMember, "key-resizer",
       "salt-resizer", std::string(64, 'a')},
      clock.Now());
  ASSERT_TRUE(tenant.ok());
  const std::string tenant_id = tenant->tenant.id;
  ASSERT_TRUE(billing.TopUp(tenant_id, "pay-1", 1'000 * kMicrosPerYuan, clock.Now()).ok());
  ASSERT_TRUE(billing.RunOnce(clock.Now()).ok());
  const int64_t before = billing.GetBalance(tenant_id, clock.Now())->paid_micros +
                         billing.GetBalance(tenant_id, clock.Now())->trial_micros;

  auto created = store.CreateInstance(tenant_id, {"grow", 8, "RTX 4090", "ubuntu"}, "r1", "f1",
                                      clock.Now());
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(scheduling.RunPass(clock.Now()).ok());
  ASSERT_TRUE(store.AdvanceSimulatedStarts(clock.Now()).ok());
  ASSERT_TRUE(store.AdvanceSimulatedStarts(clock.Now()).ok());
  ASSERT_EQ(store.GetInstance(tenant_id, created->id)->state, store::InstanceState::kRunning);

  // 8 GPUs for 10 minutes, then 16 for 10 more, then 8 for 5.
  clock.Advance(absl::Minutes(10));
  ASSERT_TRUE(scheduling.Resize(tenant_id, created->id, 16, clock.Now()).ok());
  clock.Advance(absl::Minutes(10));
  ASSERT_TRUE(scheduling.Resize(tenant_id, created->id, 8, clock.Now()).ok());
  // Grown and shrunk back within one minute (m0+22, from 20 s to 50 s).
  clock.Advance(absl::Minutes(2));
  ASSERT_TRUE(scheduling.Resize(tenant_id, created->id, 16, clock.Now()).ok());
  clock.Advance(absl::Seconds(30));
  ASSERT_TRUE(scheduling.Resize(tenant_id, created->id, 8, clock.Now()).ok());
  clock.Advance(absl::Minutes(3) - absl::Seconds(30));
  ASSERT_TRUE(store.StopInstance(tenant_id, created->id, "done", clock.Now()).ok());
  clock.Advance(absl::Minutes(2));
  ASSERT_TRUE(billing.RunOnce(clock.Now()).ok());

  // Started at m0 + 20 s, grown at m0+10 + 20 s, shrunk at m0+20 + 20 s,
  // grown and shrunk within m0+22, stopped at m0+25 + 20 s. Minutes
  // m0..m0+9 held 8 GPUs (10); m0+10..m0+20 held 16 at some point (11: the
  // grow's and the shrink's minutes are charged at the larger size); m0+21
  // held 8; m0+22 held 16 for 30 s; m0+23..m0+25 held 8 (3).
  const int64_t expected = (10 * 8 + 11 * 16 + 8 + 16 + 3 * 8) * kPrice;
  auto after = billing.GetBalance(tenant_id, clock.Now());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(before - (after->paid_micros + after->trial_micros), expected);
  // Usage shows the GPU-minutes charged, each minute at its own size (not
  // 26 minutes at today's 8 GPUs).
  auto usage = billing.GetUsage(tenant_id, absl::InfinitePast(), absl::InfiniteFuture(), "");
  ASSERT_TRUE(usage.ok()) << usage.status();
  int64_t gpu_minutes = 0, instance_minutes = 0, amount = 0;
  for (const auto& row : *usage) {
    EXPECT_EQ(row.instance_id, created->id);
    gpu_minutes += row.gpu_minutes;
    instance_minutes += row.instance_minutes;
    amount += row.amount_micros;
  }
  EXPECT_EQ(gpu_minutes, 10 * 8 + 11 * 16 + 8 + 16 + 3 * 8);
  EXPECT_EQ(instance_minutes, 26);
  EXPECT_EQ(amount, expected);
  auto failures = billing.Audit();
  ASSERT_TRUE(failures.ok());
  for (const auto& f : *failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace sv::billing
