// Placement of single requests: packing, NUMA groups, gangs over the switch
// tree, validation, explanations, cordon and drain, baseline policies.
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"
#include "test_fleet.h"

namespace sv::scheduler {
namespace {

using testing::FleetShape;
using testing::MakeFleet;
using testing::MustBuild;
using testing::Occupy;

std::set<std::string> LeavesOf(const Snapshot& snapshot, const Placement& p) {
  std::set<std::string> leaves;
  for (const NodeAssignment& part : p.nodes) {
    leaves.insert(std::string(snapshot.node(part.node).leaf));
  }
  return leaves;
}

TEST(PlacementTest, SmallRequestsTakeTheFirstNodeInTopologyOrder) {
  // Rows interleave two leaves: l0-n0, l1-n0, l0-n1, l1-n1. Topology order
  // is leaf by leaf (indexes 0, 2, 1, 3), whatever the row order.
  std::vector<NodeSpec> rows = MakeFleet(FleetShape{1, 1, 2, 2});
  std::vector<NodeSpec> nodes = {rows[0], rows[2], rows[1], rows[3]};
  Occupy(nodes, 0, 8, 100);  // l0-n0 full
  Occupy(nodes, 1, 6, 101);  // l1-n0: 2 free, but in the second leaf
  Occupy(nodes, 2, 5, 102);  // l0-n1: 3 free
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> two = scheduler.Place(snapshot, Request{1, 2, 0});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->nodes[0].node, 2);
  // l0-n1 now has one free GPU; a 2-GPU request moves on to l1-n0.
  absl::StatusOr<Placement> again = scheduler.Place(snapshot, Request{2, 2, 0});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->nodes, (std::vector<NodeAssignment>{{1, 0xC0}}));
  absl::StatusOr<Placement> one = scheduler.Place(snapshot, Request{3, 1, 0});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->nodes[0].node, 2);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(PlacementTest, TwoGpusStayInsideOneGroup) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 1});
  // GPUs 1, 2, 3 and 6, 7 held: group 0 has one free, group 1 has two.
  for (int gpu : {1, 2, 3, 6, 7}) nodes[0].gpu_holders[gpu] = 100;
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> placement = scheduler.Place(snapshot, Request{1, 2, 0});
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->nodes[0].gpus, 0x30);
}

TEST(PlacementTest, SmallRequestsFillTheFrontAndLeaveBackLeavesWhole) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 2, 4});
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  for (InstanceId id = 1; id <= 33; ++id) {
    ASSERT_TRUE(scheduler.Place(snapshot, Request{id, 1, 0}).ok());
  }
  // Leaf 0 is full; the 33rd request broke one node of leaf 1.
  EXPECT_EQ(snapshot.state().LeafWholeFree(0), 0);
  EXPECT_EQ(snapshot.state().LeafWholeFree(1), 3);
  EXPECT_EQ(snapshot.InstanceNodes(33)[0].node, 4);
  // A GPU freed at the front is used before the back is touched again.
  snapshot.Release(9);  // on node 1
  absl::StatusOr<Placement> next = scheduler.Place(snapshot, Request{34, 1, 0});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->nodes[0].node, 1);
  EXPECT_EQ(snapshot.state().LeafWholeFree(1), 3);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(PlacementTest, GangTakesTheSmallestLeafThatHoldsIt) {
  // Leaves with 4, 6 and 8 whole free nodes; a 5-node gang fits the 6.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 3, 8});
  for (int n = 0; n < 4; ++n) Occupy(nodes, n, 1, 100 + n);
  for (int n = 8; n < 10; ++n) Occupy(nodes, n, 1, 100 + n);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> gang = scheduler.Place(snapshot, Request{1, 40, 0});
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(gang->nodes.size(), 5u);
  EXPECT_EQ(gang->leaf_count, 1);
  EXPECT_EQ(LeavesOf(snapshot, *gang), std::set<std::string>{"z0-p0-l1"});
  for (const NodeAssignment& part : gang->nodes) EXPECT_EQ(part.gpus, kAllGpus);
}

TEST(PlacementTest, GangSpansLeavesOfOnePodWithBestFitForTheLast) {
  // Pod 0 leaves hold 5, 3 and 2 whole free nodes; pod 1 holds only 4.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 2, 3, 5});
  for (int n = 5; n < 7; ++n) Occupy(nodes, n, 1, 100 + n);    // leaf 1: 3
  for (int n = 10; n < 13; ++n) Occupy(nodes, n, 1, 100 + n);  // leaf 2: 2
  for (int n = 19; n < 30; ++n) Occupy(nodes, n, 1, 100 + n);  // pod 1: 4
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> gang = scheduler.Place(snapshot, Request{1, 56, 0});
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(gang->leaf_count, 2);
  EXPECT_EQ(LeavesOf(snapshot, *gang),
            (std::set<std::string>{"z0-p0-l0", "z0-p0-l2"}));
}

TEST(PlacementTest, MaxLeavesIsHonoured) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 2, 4});
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> gang = scheduler.Place(snapshot, Request{1, 48, 1});
  EXPECT_EQ(gang.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(gang.status().message(),
            "no placement for 48 GPUs as 6 whole nodes: 8 wholly free, but "
            "not within 1 leaf switches");
  EXPECT_EQ(testing::HeldGpus(snapshot, 1), 0);
  EXPECT_TRUE(scheduler.Place(snapshot, Request{1, 48, 2}).ok());
}

TEST(PlacementTest, GangUsesTheZoneWhenNoPodHoldsIt) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 2, 1, 4});
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> gang = scheduler.Place(snapshot, Request{1, 48, 0});
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_EQ(gang->leaf_count, 2);
}

TEST(PlacementTest, GangNeverSpansZones) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{2, 1, 1, 4});
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> gang = scheduler.Place(snapshot, Request{1, 48, 0});
  EXPECT_EQ(gang.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(gang.status().message(),
            "no placement for 48 GPUs as 6 whole nodes: 8 wholly free, but "
            "not within one zone; the fleet has 4 ready nodes at most in one "
            "zone, fewer than the 6 it needs, so it waits until nodes are "
            "added or return");
}

TEST(PlacementTest, ValidatesCounts) {
  struct Case {
    Request request;
    bool ok;
  };
  const Case cases[] = {
      {{1, 1, 0}, true},    {{1, 8, 0}, true},    {{1, 16, 0}, true},
      {{1, 128, 0}, true},  {{1, 0, 0}, false},   {{1, -8, 0}, false},
      {{1, 12, 0}, false},  {{1, 129, 0}, false}, {{1, 136, 0}, false},
      {{0, 8, 0}, false},   {{1, 16, -1}, false}, {{1, 16, 17}, false},
  };
  for (const Case& c : cases) {
    absl::Status status = ValidateRequest(c.request);
    EXPECT_EQ(status.ok(), c.ok) << c.request.gpu_count;
    if (!c.ok) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    }
  }
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{}));
  Scheduler scheduler(SchedulerOptions{});
  EXPECT_EQ(scheduler.Place(snapshot, Request{1, 12, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlacementTest, ExplainsWithPerFilterCounts) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 15});
  for (int n = 0; n < 12; ++n) Occupy(nodes, n, 1 + n % 7, 100 + n);
  nodes[12].state = NodeState::kCordoned;
  nodes[13].state = NodeState::kCordoned;
  nodes[14].state = NodeState::kDown;
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<Placement> placement = scheduler.Place(snapshot, Request{1, 8, 0});
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(placement.status().message(),
            "no node fits 8 GPUs: 12 nodes short of free GPUs, 2 cordoned, "
            "1 down");
  EXPECT_EQ(scheduler.Explain(snapshot, Request{1, 32, 0}),
            "no placement for 32 GPUs as 4 whole nodes: 0 wholly free; 12 "
            "nodes partly used, 2 cordoned, 1 down");
  // More whole nodes than the fleet has ready: it says the wait is for
  // capacity, not for other instances.
  EXPECT_EQ(scheduler.Explain(snapshot, Request{1, 128, 0}),
            "no placement for 128 GPUs as 16 whole nodes: 0 wholly free; 12 "
            "nodes partly used, 2 cordoned, 1 down; the fleet has 12 ready "
            "nodes, fewer than the 16 it needs, so it waits until nodes are "
            "added or return");
}

TEST(PlacementTest, CordonedAndDrainingNodesTakeNothingNew) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 3});
  Occupy(nodes, 0, 2, 7);
  nodes[0].gpu_holders[5] = 8;
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  DrainReport report = scheduler.Drain(snapshot, 0);
  EXPECT_EQ(report.instances_to_move, (std::vector<InstanceId>{7, 8}));
  EXPECT_EQ(snapshot.node(0).state, NodeState::kDraining);
  scheduler.Cordon(snapshot, 1);
  for (InstanceId id = 20; id < 28; ++id) {
    absl::StatusOr<Placement> placement = scheduler.Place(snapshot, Request{id, 1, 0});
    ASSERT_TRUE(placement.ok());
    EXPECT_EQ(placement->nodes[0].node, 2);
  }
  EXPECT_EQ(scheduler.Place(snapshot, Request{30, 1, 0}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(testing::HeldGpus(snapshot, 7), 2);  // drain moves nothing itself
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(PlacementTest, FindDoesNotChangeTheSnapshot) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{}));
  Scheduler scheduler(SchedulerOptions{});
  ASSERT_TRUE(scheduler.Find(snapshot, Request{1, 16, 0}).ok());
  EXPECT_EQ(snapshot.free_gpu_count(), 32);
}

TEST(PlacementTest, BaselinePoliciesBehaveAsNamed) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 4});
  Occupy(nodes, 1, 4, 100);  // node 1 half full, others empty
  Occupy(nodes, 3, 2, 101);
  struct Case {
    Policy policy;
    NodeIndex expected;
  };
  const Case cases[] = {
      {Policy::kFirstFit, 0},
      {Policy::kBestFit, 1},
      {Policy::kTopologyTree, 1},
      {Policy::kDefault, 0},  // first in topology order
      {Policy::kSpread, 0},
  };
  for (const Case& c : cases) {
    Snapshot snapshot = MustBuild(nodes);
    Scheduler scheduler(SchedulerOptions{c.policy, 32, 1});
    absl::StatusOr<Placement> placement = scheduler.Place(snapshot, Request{1, 1, 0});
    ASSERT_TRUE(placement.ok());
    EXPECT_EQ(placement->nodes[0].node, c.expected) << PolicyName(c.policy);
  }
}

TEST(PlacementTest, RandomPolicyIsDeterministicForASeed) {
  Snapshot first = MustBuild(MakeFleet(FleetShape{1, 2, 2, 8}));
  Snapshot second = first;
  Scheduler a(SchedulerOptions{Policy::kRandom, 32, 42});
  Scheduler b(SchedulerOptions{Policy::kRandom, 32, 42});
  for (InstanceId id = 1; id <= 20; ++id) {
    int gpus = id % 3 == 0 ? 16 : 1 + id % 8;
    absl::StatusOr<Placement> x = a.Place(first, Request{id, gpus, 0});
    absl::StatusOr<Placement> y = b.Place(second, Request{id, gpus, 0});
    ASSERT_EQ(x.ok(), y.ok());
    if (x.ok()) {
      EXPECT_EQ(x->nodes, y->nodes);
    }
  }
}

}  // namespace
}  // namespace sv::scheduler
