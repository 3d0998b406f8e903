// A move of a movable instance, through the real pass and PostgreSQL with a
// fake clock: it waits for the settle time, moves only when the waiting
// whole-node instance is placed with it, and billing charges the instance's
// RUNNING minutes on both nodes and none of the minutes in between. The
// ledger auditor agrees.
#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "control/scheduling.h"
#include "gtest/gtest.h"
#include "store/agent_store.h"
#include "tests/integration/billed_fleet.h"
#include "tests/integration/harness.h"

namespace sv::billing {
namespace {

constexpr int64_t kPrice = 33'000;

class MoveBillingTest : public sv::testing::BilledFleetTest {
 protected:
  void SetUp() override { SetUpFleet(2, 1); }

  // A tenant with 1,000 CNY paid and no trial.
  std::string Tenant(const std::string& name) {
    return NewTenant(name, 1'000 * kMicrosPerYuan, /*trial=*/false);
  }

  std::string Create(const std::string& tenant, const std::string& name, int gpus) {
    auto created = store_->CreateInstance(tenant, {name, gpus, "RTX 4090", "ubuntu"},
                                          "r-" + name, "f-" + name, clock_.Now());
    EXPECT_TRUE(created.ok()) << created.status();
    return created->id;
  }

  // Runs a pass and the simulated agents' two steps (told, then confirmed).
  void PassAndStart() {
    ASSERT_TRUE(scheduling_->RunPass(clock_.Now()).ok());
    ASSERT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
    ASSERT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
  }

  store::InstanceRecord Get(const std::string& tenant, const std::string& id) {
    auto record = store_->GetInstance(tenant, id);
    EXPECT_TRUE(record.ok()) << record.status();
    return *record;
  }
};

TEST_F(MoveBillingTest, AMoveWaitsForTheSettleTimeAndItsGapIsNotCharged) {
  const std::string small_tenant = Tenant("small");
  const std::string big_tenant = Tenant("big");
  ASSERT_TRUE(billing_->RunOnce(clock_.Now()).ok());
  // x and y fill node 0, z takes half of node 1; y ends: 4 free GPUs on
  // each node and no whole node.
  const std::string x = Create(small_tenant, "x", 4);
  const std::string y = Create(small_tenant, "y", 4);
  const std::string z = Create(small_tenant, "z", 4);
  PassAndStart();
  ASSERT_EQ(Get(small_tenant, z).state, store::InstanceState::kRunning);
  ASSERT_EQ(Get(small_tenant, z).placement.at(0).node_name, "node-1");
  ASSERT_TRUE(store_->DeleteInstance(small_tenant, y, clock_.Now()).ok());
  store::AgentStore agents(*db_);
  ASSERT_TRUE(agents.SetInstanceMovable(small_tenant, z, true, clock_.Now()).ok());
  ASSERT_TRUE(Get(small_tenant, z).movable);

  // Before z has run 10 minutes it does not move: big waits.
  clock_.Advance(absl::Minutes(5));
  const std::string big = Create(big_tenant, "big", 8);
  PassAndStart();
  EXPECT_EQ(Get(big_tenant, big).state, store::InstanceState::kPending);
  EXPECT_EQ(Get(small_tenant, z).state, store::InstanceState::kRunning);

  // At m11 + 20 s z moves and big gets node 1 in the same pass; z's new
  // node confirms it only at m13 + 10 s.
  clock_.Advance(absl::Minutes(6));
  auto outcome = scheduling_->RunPass(clock_.Now());
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->moved, 1);
  EXPECT_EQ(outcome->placed, 1);
  store::InstanceRecord moved = Get(small_tenant, z);
  EXPECT_EQ(moved.state, store::InstanceState::kScheduled);
  EXPECT_NE(moved.state_reason.find("moved from node-1[0,1,2,3] to node-0[4,5,6,7]"),
            std::string::npos)
      << moved.state_reason;
  store::InstanceRecord placed = Get(big_tenant, big);
  EXPECT_EQ(placed.state, store::InstanceState::kScheduled);
  ASSERT_EQ(placed.placement.size(), 1u);
  EXPECT_EQ(placed.placement[0].node_name, "node-1");
  clock_.Advance(absl::Minutes(1) + absl::Seconds(50));
  ASSERT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
  ASSERT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
  EXPECT_EQ(Get(small_tenant, z).state, store::InstanceState::kRunning);
  EXPECT_EQ(Get(big_tenant, big).state, store::InstanceState::kRunning);

  // Stopped at m16 + 50 s (3 min 40 s later), then billed.
  clock_.Advance(absl::Minutes(3) + absl::Seconds(40));
  ASSERT_TRUE(store_->StopInstance(small_tenant, z, "done", clock_.Now()).ok());
  clock_.Advance(absl::Minutes(2));
  ASSERT_TRUE(billing_->RunOnce(clock_.Now()).ok());

  // RUNNING [m0+20 s, m11+20 s) and [m13+10 s, m16+50 s): minutes m0..m11
  // and m13..m16, 16 of them; m12, wholly inside the move, is not charged.
  auto usage = billing_->GetUsage(small_tenant, absl::InfinitePast(), absl::InfiniteFuture(), "");
  ASSERT_TRUE(usage.ok()) << usage.status();
  int64_t z_minutes = 0, z_amount = 0;
  for (const auto& row : *usage) {
    if (row.instance_id != z) continue;
    z_minutes += row.instance_minutes;
    z_amount += row.amount_micros;
  }
  EXPECT_EQ(z_minutes, 16);
  EXPECT_EQ(z_amount, 16 * 4 * kPrice);
  auto failures = billing_->Audit();
  ASSERT_TRUE(failures.ok()) << failures.status();
  for (const auto& f : *failures) ADD_FAILURE() << f;
  (void)x;
}

}  // namespace
}  // namespace sv::billing
