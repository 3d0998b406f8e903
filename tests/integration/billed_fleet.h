// A fixture for integration tests that drive billing directly: a fresh
// migrated database, the store, the scheduler and billing on a fake clock,
// and simulated nodes. Header-only: the tests that use it link sv_billing
// and sv_control themselves; the harness library does not.
#ifndef SV_TESTS_INTEGRATION_BILLED_FLEET_H_
#define SV_TESTS_INTEGRATION_BILLED_FLEET_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "billing/billing.h"
#include "common/clock.h"
#include "control/scheduling.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace sv::testing {

class BilledFleetTest : public ::testing::Test {
 protected:
  // `nodes` simulated nodes under `leaves` leaf switches; metering with no
  // lag, looking back a day on its first run.
  void SetUpFleet(int nodes, int leaves) {
    db_ = CreateMigratedDatabase(nullptr);
    ASSERT_NE(db_, nullptr);
    store_ = std::make_unique<store::Store>(*db_);
    scheduling_ = std::make_unique<control::Scheduling>(*db_, control::SchedulingOptions{});
    ASSERT_TRUE(AddSimulatedNodes(*store_, nodes, leaves, clock_.Now()).ok());
    billing::BillingOptions options;
    options.metering_lag = absl::ZeroDuration();
    options.first_run_lookback = absl::Hours(24);
    billing_ = std::make_unique<billing::Billing>(*db_, *store_, clock_, options);
  }

  // A tenant with one member user and `paid` micro-yuan in its paid wallet;
  // with `trial`, the user's trial grant (10 CNY).
  std::string NewTenant(const std::string& name, int64_t paid, bool trial) {
    auto created = store_->CreateTenant(
        {name, name + "@example.com", store::Role::kMember, "key-" + name, "salt-" + name,
         std::string(64, 'a')},
        clock_.Now());
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return "";
    if (paid > 0) {
      EXPECT_TRUE(billing_->TopUp(created->tenant.id, "pay-" + name, paid, clock_.Now()).ok());
    }
    if (trial) {
      EXPECT_TRUE(billing_->EnsureTrialGrant(created->user_id, clock_.Now()).ok());
    }
    return created->tenant.id;
  }

  // On a minute boundary plus 20 s, so that every change falls mid-minute.
  FakeClock clock_{absl::FromUnixSeconds(1'790'000'000 / 60 * 60 + 20)};
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<control::Scheduling> scheduling_;
  std::unique_ptr<billing::Billing> billing_;
};

}  // namespace sv::testing

#endif  // SV_TESTS_INTEGRATION_BILLED_FLEET_H_
