// Snapshot building, validation and index upkeep.
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

TEST(SnapshotTest, BuildsIndexesFromPlainRows) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 2, 2, 3});
  testing::Occupy(nodes, 0, 8, 1);
  testing::Occupy(nodes, 1, 3, 2);
  nodes[2].state = NodeState::kCordoned;
  Snapshot snapshot = MustBuild(nodes);
  EXPECT_EQ(snapshot.node_count(), 12);
  EXPECT_EQ(snapshot.leaf_count(), 4);
  EXPECT_EQ(snapshot.ready_gpu_count(), 11 * 8);
  EXPECT_EQ(snapshot.free_gpu_count(), 11 * 8 - 8 - 3);
  EXPECT_EQ(snapshot.node(1).free_gpus, 0xF8);
  EXPECT_EQ(snapshot.node(5).leaf, "z0-p0-l1");
  EXPECT_EQ(snapshot.node(7).pod, "z0-p1");
  EXPECT_EQ(snapshot.InstanceNodes(2),
            (std::vector<NodeAssignment>{{1, 0x07}}));
  EXPECT_EQ(snapshot.Instances(), (std::vector<InstanceId>{1, 2}));
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(SnapshotTest, RejectsMalformedInput) {
  struct Case {
    const char* what;
    void (*mutate)(std::vector<NodeSpec>&);
  };
  const Case cases[] = {
      {"duplicate name", [](std::vector<NodeSpec>& n) { n[1].name = n[0].name; }},
      {"empty leaf", [](std::vector<NodeSpec>& n) { n[0].leaf = ""; }},
      {"leaf in two pods",
       [](std::vector<NodeSpec>& n) { n[4].leaf = n[0].leaf; }},
      {"pod in two zones",
       [](std::vector<NodeSpec>& n) { n[0].zone = "elsewhere"; }},
      {"negative holder",
       [](std::vector<NodeSpec>& n) { n[0].gpu_holders[0] = -5; }},
      {"overlong name",
       [](std::vector<NodeSpec>& n) {
         n[0].name = std::string(kNameLengthMax + 1, 'x');
       }},
  };
  for (const Case& c : cases) {
    std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 2, 1, 4});
    c.mutate(nodes);
    absl::StatusOr<Snapshot> snapshot = Snapshot::Build(nodes);
    EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
  }
}

TEST(SnapshotTest, RejectsFleetAboveNodeLimit) {
  std::vector<NodeSpec> nodes(kNodeCountMax + 1);
  absl::StatusOr<Snapshot> snapshot = Snapshot::Build(nodes);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SnapshotTest, ReserveIsAllOrNothing) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 4});
  testing::Occupy(nodes, 2, 1, 9);
  Snapshot snapshot = MustBuild(nodes);
  Placement clash{5, {{0, kAllGpus}, {1, kAllGpus}, {2, kAllGpus}}, 1};
  EXPECT_EQ(snapshot.Reserve(clash).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(testing::HeldGpus(snapshot, 5), 0);
  Placement twice{5, {{0, 0x01}, {0, 0x02}}, 1};
  EXPECT_EQ(snapshot.Reserve(twice).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(SnapshotTest, ReserveRefusesNodesThatAreNotReady) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 2});
  nodes[0].state = NodeState::kDown;
  Snapshot snapshot = MustBuild(nodes);
  EXPECT_EQ(snapshot.Reserve(Placement{5, {{0, 0x01}}, 1}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SnapshotTest, ReleaseIsIdempotentAndRestoresIndexes) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 2, 2}));
  const Snapshot before = snapshot;
  ASSERT_TRUE(snapshot.Reserve(Placement{5, {{0, kAllGpus}, {3, 0x0F}}, 2}).ok());
  EXPECT_EQ(snapshot.free_gpu_count(), 32 - 12);
  snapshot.Release(5);
  snapshot.Release(5);
  EXPECT_EQ(snapshot.free_gpu_count(), 32);
  EXPECT_TRUE(snapshot.InstanceNodes(5).empty());
  EXPECT_EQ(snapshot.state().leaves_by_whole_free,
            before.state().leaves_by_whole_free);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(SnapshotTest, StateChangesMoveNodesInAndOutOfIndexes) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 1, 4}));
  snapshot.SetNodeState(1, NodeState::kCordoned);
  snapshot.SetNodeState(2, NodeState::kDown);
  EXPECT_EQ(snapshot.free_gpu_count(), 16);
  EXPECT_EQ(snapshot.state().LeafWholeFree(0), 2);
  EXPECT_TRUE(snapshot.CheckInvariants());
  snapshot.SetNodeState(1, NodeState::kReady);
  EXPECT_EQ(snapshot.free_gpu_count(), 24);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(SnapshotTest, CopyIsIndependent) {
  Snapshot original = MustBuild(MakeFleet(FleetShape{1, 1, 1, 2}));
  Snapshot copy = original;
  ASSERT_TRUE(copy.Reserve(Placement{5, {{0, kAllGpus}}, 1}).ok());
  EXPECT_EQ(original.free_gpu_count(), 16);
  EXPECT_EQ(copy.free_gpu_count(), 8);
}

TEST(SnapshotTest, FindNodeByName) {
  Snapshot snapshot = MustBuild(MakeFleet(FleetShape{1, 1, 1, 3}));
  EXPECT_EQ(*snapshot.FindNode("z0-p0-l0-n2"), 2);
  EXPECT_EQ(snapshot.FindNode("nope").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sv::scheduler
