// The queue pass: order, backfill that cannot starve an older gang, quotas,
// positions, reasons and limits.
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "test_fleet.h"

namespace sv::scheduler {
namespace {

using testing::FleetShape;
using testing::MakeFleet;
using testing::MustBuild;
using testing::Occupy;

PendingRequest Pending(InstanceId id, int gpus, int64_t sequence,
                       int priority = 0, std::string tenant = "t") {
  return PendingRequest{Request{id, gpus, 0}, std::move(tenant), priority,
                        sequence};
}

const QueueDecision& DecisionFor(const QueuePassResult& result, InstanceId id) {
  for (const QueueDecision& decision : result.decisions) {
    if (decision.instance == id) return decision;
  }
  ADD_FAILURE() << "no decision for " << id;
  return result.decisions.front();
}

TEST(QueueTest, OrdersByPriorityThenSequence) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 1, 1}));
  Scheduler scheduler(SchedulerOptions{});
  std::vector<PendingRequest> pending = {
      Pending(1, 8, 30), Pending(2, 8, 10), Pending(3, 8, 20, /*priority=*/5),
      Pending(4, 8, 5)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  ASSERT_EQ(result.decisions.size(), 4u);
  std::vector<InstanceId> order;
  for (const QueueDecision& decision : result.decisions) {
    order.push_back(decision.instance);
  }
  EXPECT_EQ(order, (std::vector<InstanceId>{3, 4, 2, 1}));
  EXPECT_TRUE(result.decisions[0].placed);
  EXPECT_EQ(result.decisions[1].position, 1);
  EXPECT_EQ(result.decisions[3].position, 3);
  EXPECT_EQ(result.placed_count, 1);
}

TEST(QueueTest, BackfillSkipsTheNodesHeldForTheOldestGang) {
  // Two leaves of two nodes. Nodes 0, 1 and 2 each carry one GPU in use, so
  // a 2-node gang cannot fit now; it must get held nodes, and younger small
  // requests may only use the rest.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 2, 2});
  Occupy(nodes, 0, 1, 100);
  Occupy(nodes, 1, 1, 101);
  Occupy(nodes, 2, 1, 102);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  std::vector<PendingRequest> pending = {Pending(1, 16, 1), Pending(2, 1, 2),
                                         Pending(3, 8, 3)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  const QueueDecision& gang = DecisionFor(result, 1);
  EXPECT_FALSE(gang.placed);
  EXPECT_EQ(gang.position, 1);
  EXPECT_EQ(result.held_for, 1);
  ASSERT_EQ(result.held_nodes.size(), 2u);
  EXPECT_EQ(gang.reason,
            "no placement for 16 GPUs as 2 whole nodes: 1 wholly free; 3 nodes "
            "partly used; 2 nodes held for it");
  // The held nodes are one leaf, and nothing new landed on them.
  EXPECT_EQ(snapshot.node(result.held_nodes[0]).leaf,
            snapshot.node(result.held_nodes[1]).leaf);
  for (InstanceId id : {2, 3}) {
    const QueueDecision& decision = DecisionFor(result, id);
    if (!decision.placed) continue;
    for (const NodeAssignment& part : decision.placement.nodes) {
      EXPECT_NE(part.node, result.held_nodes[0]);
      EXPECT_NE(part.node, result.held_nodes[1]);
    }
  }
  // Once the held leaf's own instance ends, the gang is placed first.
  snapshot.Release(snapshot.gpu_holder(result.held_nodes[0], 0) != kNoInstance
                       ? snapshot.gpu_holder(result.held_nodes[0], 0)
                       : snapshot.gpu_holder(result.held_nodes[1], 0));
  std::vector<PendingRequest> still = {Pending(1, 16, 1), Pending(4, 1, 4)};
  QueuePassResult next = scheduler.RunQueuePass(snapshot, still, {});
  EXPECT_TRUE(DecisionFor(next, 1).placed);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(QueueTest, StrictModeLetsNothingPassABlockedRequest) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 2});
  Occupy(nodes, 0, 1, 100);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  QueueOptions options;
  options.backfill = false;
  std::vector<PendingRequest> pending = {Pending(1, 16, 1), Pending(2, 1, 2)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, options);
  EXPECT_FALSE(DecisionFor(result, 2).placed);
  EXPECT_EQ(DecisionFor(result, 2).cause, WaitCause::kHeldForOlder);
  EXPECT_EQ(DecisionFor(result, 2).reason, "waiting behind instance 1");
  EXPECT_EQ(DecisionFor(result, 2).position, 2);
}

TEST(QueueTest, HoldsAreLiftedAfterThePass) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 2});
  Occupy(nodes, 0, 1, 100);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  std::vector<PendingRequest> pending = {Pending(1, 16, 1)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  EXPECT_EQ(result.held_nodes.size(), 2u);
  EXPECT_EQ(snapshot.free_gpu_count(), 15);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(QueueTest, NoHoldThatTheRequestsLeafLimitCouldNeverUse) {
  // Four leaves of two nodes, all partly used: six nodes for a gang limited
  // to two leaves would have to span three, so nothing is held.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 4, 2});
  for (int n = 0; n < 8; ++n) Occupy(nodes, n, 1, 100 + n);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  std::vector<PendingRequest> pending = {
      PendingRequest{Request{1, 48, 2}, "t", 0, 1}, Pending(2, 1, 2)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  EXPECT_EQ(result.held_for, kNoInstance);
  EXPECT_TRUE(result.held_nodes.empty());
  EXPECT_TRUE(DecisionFor(result, 2).placed);
}

// A gang that no set of nodes could serve holds nothing and leaves the one
// gang-sized hold to the next gang, which younger small requests then
// cannot starve. (It used to take the hold and hold nothing.)
TEST(QueueTest, AGangThatCanNeverFitLeavesTheHoldToTheNext) {
  // One leaf of two nodes, each with a GPU in use: a 24-GPU gang can never
  // fit, a 16-GPU gang can once the nodes empty.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 2});
  Occupy(nodes, 0, 1, 100);
  Occupy(nodes, 1, 1, 101);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  std::vector<PendingRequest> pending = {Pending(1, 24, 1), Pending(2, 16, 2),
                                         Pending(3, 1, 3)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  EXPECT_FALSE(DecisionFor(result, 1).placed);
  EXPECT_EQ(result.held_for, 2);
  EXPECT_EQ(result.held_nodes.size(), 2u);
  EXPECT_FALSE(DecisionFor(result, 3).placed) << "backfill onto the 16-GPU gang's held nodes";
}

TEST(QueueTest, GpuQuotaKeepsATenantWaitingButNotOthers) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 1, 4}));
  Scheduler scheduler(SchedulerOptions{});
  QueueOptions options;
  options.tenant_quotas["small"] = TenantQuota{8, 10};
  options.tenant_gpus_in_use["small"] = 4;
  std::vector<PendingRequest> pending = {
      Pending(1, 4, 1, 0, "small"), Pending(2, 1, 2, 0, "small"),
      Pending(3, 8, 3, 0, "big")};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, options);
  EXPECT_TRUE(DecisionFor(result, 1).placed);
  EXPECT_EQ(DecisionFor(result, 2).cause, WaitCause::kQuota);
  EXPECT_EQ(DecisionFor(result, 2).reason,
            "tenant small GPU quota: 8 in use + 1 requested > 8");
  EXPECT_EQ(DecisionFor(result, 2).position, 1);
  EXPECT_TRUE(DecisionFor(result, 3).placed);
  EXPECT_EQ(result.held_for, kNoInstance);  // quota waits hold nothing
}

TEST(QueueTest, PendingCountQuotaAtAdmission) {
  QueueOptions options;
  options.tenant_quotas["t"] = TenantQuota{64, 2};
  EXPECT_TRUE(CheckPendingQuota(options, "t", 1).ok());
  EXPECT_EQ(CheckPendingQuota(options, "t", 2).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckPendingQuota(options, "other", 2).ok());  // default 100
}

TEST(QueueTest, PassLimitsDeferTheRest) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 1, 4}));
  Scheduler scheduler(SchedulerOptions{});
  QueueOptions options;
  options.placements_per_pass_max = 2;
  options.pending_items_max = 3;
  std::vector<PendingRequest> pending;
  for (InstanceId id = 1; id <= 5; ++id) pending.push_back(Pending(id, 1, id));
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, options);
  EXPECT_EQ(result.placed_count, 2);
  EXPECT_EQ(DecisionFor(result, 3).cause, WaitCause::kPassLimit);
  EXPECT_EQ(DecisionFor(result, 5).cause, WaitCause::kPassLimit);
  EXPECT_EQ(DecisionFor(result, 5).position, 3);
}

TEST(QueueTest, InvalidRequestsAreReportedNotPlaced) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{}));
  Scheduler scheduler(SchedulerOptions{});
  std::vector<PendingRequest> pending = {Pending(1, 12, 1), Pending(2, 1, 2)};
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  EXPECT_EQ(DecisionFor(result, 1).cause, WaitCause::kInvalid);
  EXPECT_TRUE(DecisionFor(result, 2).placed);
}

// Goal: under a steady stream of younger 1-GPU requests that would keep
// every node partly busy, an older gang still starts within a bounded
// number of passes, because its held nodes only drain.
TEST(QueueTest, StreamOfSmallRequestsNeverStarvesAnOlderGang) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 2, 4});
  for (int n = 0; n < 8; ++n) Occupy(nodes, n, 1, 100 + n);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  std::vector<InstanceId> running;
  for (int n = 0; n < 8; ++n) running.push_back(100 + n);
  InstanceId next_id = 1000;
  bool gang_placed = false;
  for (int pass = 0; pass < 40 && !gang_placed; ++pass) {
    // Each pass the oldest running instance ends and a new small one asks.
    if (!running.empty()) {
      snapshot.Release(running.front());
      running.erase(running.begin());
    }
    std::vector<PendingRequest> pending = {Pending(1, 32, 0)};
    for (int k = 0; k < 3; ++k) pending.push_back(Pending(next_id + k, 1, next_id + k));
    next_id += 3;
    QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
    gang_placed = DecisionFor(result, 1).placed;
    for (const QueueDecision& decision : result.decisions) {
      if (decision.placed && decision.instance != 1) {
        running.push_back(decision.instance);
      }
    }
    ASSERT_TRUE(snapshot.CheckInvariants());
  }
  EXPECT_TRUE(gang_placed);
  EXPECT_EQ(testing::HeldGpus(snapshot, 1), 32);
}

// Node-local volumes pin an instance to their node: it goes there or
// nowhere, waits with a reason naming that, and its node is held against
// younger requests so small backfills cannot starve it.
TEST(QueueTest, PinnedRequestGoesOnlyToItsNodeAndHoldsIt) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 3});
  Occupy(nodes, 2, 6, 100);  // node 2: two free GPUs
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});

  PendingRequest fits = Pending(1, 2, 1);
  fits.request.pinned_node = 2;
  QueuePassResult result = scheduler.RunQueuePass(snapshot, std::vector{fits}, {});
  ASSERT_TRUE(DecisionFor(result, 1).placed);
  ASSERT_EQ(DecisionFor(result, 1).placement.nodes.size(), 1u);
  EXPECT_EQ(DecisionFor(result, 1).placement.nodes[0].node, 2);

  // Node 2 is now full; nodes 0 and 1 are empty. A pinned 4-GPU request
  // waits, the reason says why, and a younger 1-GPU request may not take
  // node 2 (nothing free there anyway) but also not be starved elsewhere.
  PendingRequest waits = Pending(2, 4, 2);
  waits.request.pinned_node = 2;
  std::vector<PendingRequest> pending = {waits, Pending(3, 1, 3)};
  result = scheduler.RunQueuePass(snapshot, pending, {});
  const QueueDecision& pinned = DecisionFor(result, 2);
  EXPECT_FALSE(pinned.placed);
  EXPECT_EQ(pinned.cause, WaitCause::kNoCapacity);
  EXPECT_NE(pinned.reason.find("2 nodes not the node that holds its node-local volumes"),
            std::string::npos)
      << pinned.reason;
  EXPECT_NE(pinned.reason.find("its node is held for it"), std::string::npos) << pinned.reason;
  ASSERT_TRUE(DecisionFor(result, 3).placed);
  EXPECT_NE(DecisionFor(result, 3).placement.nodes[0].node, 2);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(QueueTest, PinnedNodeHoldKeepsYoungerSmallRequestsOff) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 2});
  Occupy(nodes, 1, 5, 100);  // node 1: three free GPUs
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  PendingRequest pinned = Pending(1, 4, 1);
  pinned.request.pinned_node = 1;
  // Younger 1-GPU requests: the front-first policy would put the first on
  // node 0 anyway, so fill node 0 first to make node 1 the only room.
  std::vector<PendingRequest> pending = {pinned};
  for (InstanceId id = 2; id <= 10; ++id) pending.push_back(Pending(id, 1, id));
  QueuePassResult result = scheduler.RunQueuePass(snapshot, pending, {});
  EXPECT_FALSE(DecisionFor(result, 1).placed);
  int placed = 0;
  for (InstanceId id = 2; id <= 10; ++id) {
    const QueueDecision& d = DecisionFor(result, id);
    if (!d.placed) continue;
    ++placed;
    EXPECT_EQ(d.placement.nodes[0].node, 0) << "instance " << id << " took the pinned node";
  }
  EXPECT_EQ(placed, 8);  // node 0 only
  EXPECT_EQ(testing::HeldGpus(snapshot, 100), 5);  // node 1 unchanged
}

TEST(QueueTest, PinnedGangIsInvalid) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 1, 4}));
  Scheduler scheduler(SchedulerOptions{});
  PendingRequest gang = Pending(1, 16, 1);
  gang.request.pinned_node = 0;
  QueuePassResult result = scheduler.RunQueuePass(snapshot, std::vector{gang}, {});
  EXPECT_EQ(DecisionFor(result, 1).cause, WaitCause::kInvalid);
  // An index past the fleet (a node gone since) waits without crashing.
  PendingRequest gone = Pending(2, 1, 2);
  gone.request.pinned_node = 99;
  result = scheduler.RunQueuePass(snapshot, std::vector{gone}, {});
  EXPECT_FALSE(DecisionFor(result, 2).placed);
}

}  // namespace
}  // namespace sv::scheduler
