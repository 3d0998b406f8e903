// Elastic resize of a running gang: keeps the id, grows near, shrinks
// cleanly, fails without side effects when short.
#include <map>
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

std::map<std::string, int> NodesPerLeaf(const Snapshot& snapshot,
                                        InstanceId instance) {
  std::map<std::string, int> per_leaf;
  for (const NodeAssignment& part : snapshot.InstanceNodes(instance)) {
    per_leaf[std::string(snapshot.node(part.node).leaf)]++;
  }
  return per_leaf;
}

TEST(ResizeTest, GrowsFrom8To64To128AndBack) {
  // Two pods of two 8-node leaves each: 32 nodes, 256 GPUs.
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 2, 2, 8}));
  Scheduler scheduler(SchedulerOptions{});
  ASSERT_TRUE(scheduler.Place(snapshot, Request{7, 8, 0}).ok());
  struct Step {
    int gpus;
    int leaves_max;
  };
  const Step steps[] = {{64, 1}, {128, 2}, {64, 1}, {8, 1}, {128, 2}};
  for (const Step& step : steps) {
    absl::StatusOr<ResizeResult> result = scheduler.Resize(snapshot, 7, step.gpus);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->placement.instance, 7);
    EXPECT_EQ(result->placement.gpu_count(), step.gpus);
    EXPECT_EQ(testing::HeldGpus(snapshot, 7), step.gpus);
    EXPECT_LE(result->placement.leaf_count, step.leaves_max) << step.gpus;
    ASSERT_TRUE(snapshot.CheckInvariants());
  }
}

TEST(ResizeTest, GrowthPrefersTheInstancesOwnLeafThenPod) {
  // Leaf 0 (pod 0) holds the instance on one node and has 3 more free;
  // leaf 1 (pod 0) has 4 free; pod 1 has 4 free, all in its leaf 1.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 2, 2, 4});
  Occupy(nodes, 0, 8, 7);
  for (int n = 8; n < 12; ++n) Occupy(nodes, n, 1, 100 + n);  // pod 1 leaf 0
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<ResizeResult> result = scheduler.Resize(snapshot, 7, 48);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->added.size(), 5u);
  EXPECT_EQ(NodesPerLeaf(snapshot, 7),
            (std::map<std::string, int>{{"z0-p0-l0", 4}, {"z0-p0-l1", 2}}));
}

TEST(ResizeTest, ShrinkGivesBackTheOutlyingNodesFirst) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 2, 4});
  for (int n : {0, 1, 2, 4}) Occupy(nodes, n, 8, 7);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<ResizeResult> result = scheduler.Resize(snapshot, 7, 24);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->removed, (std::vector<NodeAssignment>{{4, kAllGpus}}));
  EXPECT_EQ(result->placement.leaf_count, 1);
}

TEST(ResizeTest, FailsCleanlyWhenShort) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 4});
  Occupy(nodes, 0, 8, 7);
  Occupy(nodes, 3, 1, 8);
  Snapshot snapshot = MustBuild(nodes);
  const Snapshot before = snapshot;
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<ResizeResult> result = scheduler.Resize(snapshot, 7, 64);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(result.status().message(),
            "cannot grow instance 7 from 8 to 64 GPUs: needs 7 more whole free "
            "nodes in its zone, 2 available");
  EXPECT_EQ(testing::HeldGpus(snapshot, 7), 8);
  EXPECT_EQ(snapshot.free_gpu_count(), before.free_gpu_count());
}

TEST(ResizeTest, RejectsBadTargetsAndPartialNodes) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 4});
  Occupy(nodes, 0, 8, 7);
  Occupy(nodes, 1, 4, 8);
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  for (int gpus : {0, 4, 12, 136}) {
    EXPECT_EQ(scheduler.Resize(snapshot, 7, gpus).status().code(),
              absl::StatusCode::kInvalidArgument)
        << gpus;
  }
  EXPECT_EQ(scheduler.Resize(snapshot, 8, 16).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(scheduler.Resize(snapshot, 99, 16).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ResizeTest, GrowthSkipsCordonedNodes) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 3});
  Occupy(nodes, 0, 8, 7);
  nodes[1].state = NodeState::kCordoned;
  Snapshot snapshot = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});
  absl::StatusOr<ResizeResult> result = scheduler.Resize(snapshot, 7, 16);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->added, (std::vector<NodeAssignment>{{2, kAllGpus}}));
  EXPECT_EQ(scheduler.Resize(snapshot, 7, 24).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ResizeTest, GrowthKeepsAGangWithinItsLeafLimit) {
  // Instance 7: two nodes of z0-p0-l0, whose other nodes are busy. Free
  // whole nodes: one in z0-p0-l1 (nearest, same pod), four in z0-p1-l0.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 2, 2, 4});
  Occupy(nodes, 0, 8, 7);
  Occupy(nodes, 1, 8, 7);
  for (int n : {2, 3, 4, 5, 6, 12, 13, 14, 15}) Occupy(nodes, n, 1, 100 + n);
  const Snapshot fleet = MustBuild(nodes);
  Scheduler scheduler(SchedulerOptions{});

  // No limit: the nearest nodes, on three leaves.
  Snapshot unlimited = fleet;
  absl::StatusOr<ResizeResult> near = scheduler.Resize(unlimited, 7, 32);
  ASSERT_TRUE(near.ok()) << near.status();
  EXPECT_EQ(near->placement.leaf_count, 3);

  // At most two leaves: both new nodes from the leaf with the most free.
  Snapshot limited = fleet;
  absl::StatusOr<ResizeResult> within = scheduler.Resize(limited, 7, 32, 2);
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(within->placement.leaf_count, 2);
  EXPECT_EQ(NodesPerLeaf(limited, 7),
            (std::map<std::string, int>{{"z0-p0-l0", 2}, {"z0-p1-l0", 2}}));
  ASSERT_TRUE(limited.CheckInvariants());

  // One leaf cannot hold 32 GPUs here: refused, nothing held or freed.
  Snapshot one_leaf = fleet;
  absl::StatusOr<ResizeResult> refused = scheduler.Resize(one_leaf, 7, 32, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "cannot grow instance 7 from 16 to 32 GPUs: it may span at most 1 leaf switches, "
            "and the whole free nodes in its zone would put it on 2");
  EXPECT_EQ(testing::HeldGpus(one_leaf, 7), 16);
  EXPECT_EQ(one_leaf.free_gpu_count(), fleet.free_gpu_count());
  // A shrink needs no room and honours the limit by itself.
  EXPECT_TRUE(scheduler.Resize(one_leaf, 7, 8, 1).ok());
}

}  // namespace
}  // namespace sv::scheduler
