// Table-driven tests of each scheduler plugin on its own.
#include "scheduler/internal/plugins.h"

#include <vector>

#include "gtest/gtest.h"
#include "test_fleet.h"

namespace sv::scheduler::internal {
namespace {

using testing::FleetShape;
using testing::MakeFleet;
using testing::MustBuild;

// One leaf of four nodes; node 0 gets `free` GPUs free (held from the top)
// and the given state.
struct NodeCase {
  GpuMask free;
  NodeState state;
};

Snapshot SnapshotWithNode0(const NodeCase& node_case) {
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 1, 4});
  for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
    if (!(node_case.free & (1u << gpu))) nodes[0].gpu_holders[gpu] = 99;
  }
  nodes[0].state = node_case.state;
  return MustBuild(nodes);
}

TEST(NodeStateFilterTest, KeepsOnlyReadyNodes) {
  struct Case {
    NodeState state;
    bool kept;
    absl::string_view reason;
  };
  const Case cases[] = {
      {NodeState::kReady, true, ""},
      {NodeState::kCordoned, false, "cordoned"},
      {NodeState::kDraining, false, "draining"},
      {NodeState::kDown, false, "down"},
  };
  NodeStateFilter filter;
  for (const Case& c : cases) {
    Snapshot snapshot = SnapshotWithNode0({kAllGpus, c.state});
    FilterResult result = filter.Filter(snapshot.state(), Request{1, 1, 0}, 0);
    EXPECT_EQ(result.kept, c.kept) << NodeStateName(c.state);
    EXPECT_EQ(result.reason, c.reason);
  }
}

TEST(NodeStateFilterTest, RejectsHeldNode) {
  Snapshot snapshot = SnapshotWithNode0({kAllGpus, NodeState::kReady});
  snapshot.mutable_state().SetHeld(0, true);
  FilterResult result =
      NodeStateFilter().Filter(snapshot.state(), Request{1, 1, 0}, 0);
  EXPECT_FALSE(result.kept);
  EXPECT_EQ(result.reason, "held for an older request");
}

TEST(FreeGpusFilterTest, NeedsEnoughFreeGpusOrAWholeNodeForGangs) {
  struct Case {
    GpuMask free;
    int gpu_count;
    bool kept;
  };
  const Case cases[] = {
      {0xFF, 8, true},  {0x7F, 8, false}, {0x0F, 4, true}, {0x07, 4, false},
      {0x01, 1, true},  {0x00, 1, false}, {0xFF, 16, true}, {0xFE, 16, false},
      {0x33, 4, true},
  };
  FreeGpusFilter filter;
  for (const Case& c : cases) {
    Snapshot snapshot = SnapshotWithNode0({c.free, NodeState::kReady});
    FilterResult result =
        filter.Filter(snapshot.state(), Request{1, c.gpu_count, 0}, 0);
    EXPECT_EQ(result.kept, c.kept)
        << "free=" << int{c.free} << " gpus=" << c.gpu_count;
  }
}

TEST(ScorePluginsTest, RawScoresPerPlugin) {
  struct Case {
    GpuMask free;
    int gpu_count;
    int64_t most_allocated;
    int64_t least_allocated;
    int64_t group_fit;
  };
  const Case cases[] = {
      // free mask, request, used-after, free-after, group fit
      {0xFF, 1, 1, 7, 1},
      {0x01, 1, 8, 0, 2},   // fills group 0 exactly
      {0x33, 2, 6, 2, 2},   // 2 free in each group: exact fit
      {0x37, 2, 5, 3, 2},   // group 1 has exactly 2
      {0x3F, 4, 6, 2, 2},   // group 0 has exactly 4
      {0x77, 4, 6, 2, 0},   // 3 + 3: must span groups
      {0xFF, 8, 8, 0, 0},   // above a group: neutral
  };
  for (const Case& c : cases) {
    Snapshot snapshot = SnapshotWithNode0({c.free, NodeState::kReady});
    Request request{1, c.gpu_count, 0};
    const SnapshotState& state = snapshot.state();
    EXPECT_EQ(MostAllocatedScore().Score(state, request, 0), c.most_allocated)
        << int{c.free};
    EXPECT_EQ(LeastAllocatedScore().Score(state, request, 0), c.least_allocated)
        << int{c.free};
    EXPECT_EQ(GroupFitScore().Score(state, request, 0), c.group_fit)
        << int{c.free};
  }
}

TEST(LeafPackingScoreTest, PrefersLeavesWithFewerWholeFreeNodes) {
  // Leaf 0 has 1 whole free node (node 0); leaf 1 has 4.
  std::vector<NodeSpec> nodes = MakeFleet(FleetShape{1, 1, 2, 4});
  for (int n = 1; n < 4; ++n) testing::Occupy(nodes, n, 1, 50 + n);
  Snapshot snapshot = MustBuild(nodes);
  LeafPackingScore score;
  Request request{1, 1, 0};
  // Not counting the candidate itself: leaf 0 keeps 0 whole nodes, leaf 1
  // keeps 3; a used node of leaf 0 leaves its one whole node.
  EXPECT_EQ(score.Score(snapshot.state(), request, 0), 0);
  EXPECT_EQ(score.Score(snapshot.state(), request, 4), -3);
  EXPECT_EQ(score.Score(snapshot.state(), request, 1), -1);
}

TEST(LowestIndexScoreTest, LowerIndexScoresHigher) {
  Snapshot snapshot = SnapshotWithNode0({kAllGpus, NodeState::kReady});
  LowestIndexScore score;
  EXPECT_GT(score.Score(snapshot.state(), Request{1, 1, 0}, 0),
            score.Score(snapshot.state(), Request{1, 1, 0}, 3));
}

TEST(NormalizeTest, MinMaxToZeroToHundredTimesWeight) {
  struct Case {
    std::vector<int64_t> raw;
    int weight;
    std::vector<int64_t> expected;
  };
  const Case cases[] = {
      {{1, 2, 3}, 1, {0, 50, 100}},
      {{5, 5}, 3, {0, 0}},
      {{-4, 0}, 2, {0, 200}},
      {{}, 1, {}},
  };
  for (const Case& c : cases) {
    std::vector<int64_t> totals(c.raw.size(), 0);
    AddNormalizedScores(c.raw, c.weight, totals);
    EXPECT_EQ(totals, c.expected);
  }
}

TEST(PickGpusTest, KeepsSmallRequestsInsideOneGroup) {
  struct Case {
    GpuMask free;
    int gpu_count;
    bool group_aware;
    GpuMask expected;
  };
  const Case cases[] = {
      {0xFF, 1, true, 0x01},
      {0xF1, 1, true, 0x01},   // group 0 is tighter
      {0xF1, 2, true, 0x30},   // only group 1 holds 2
      {0x3F, 4, true, 0x0F},   // group 0 exactly
      {0x77, 4, true, 0x17},   // 3 + 3: spans, fuller group first
      {0xFF, 8, true, 0xFF},
      {0x8F, 1, false, 0x01},
      {0x31, 2, false, 0x11},  // group-blind takes lowest bits
      {0x31, 2, true, 0x30},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PickGpus(c.free, c.gpu_count, c.group_aware), c.expected)
        << "free=" << int{c.free} << " gpus=" << c.gpu_count;
  }
}

TEST(GpuReservePluginTest, ReserveThenUnreserveTwiceIsIdempotent) {
  Snapshot snapshot = SnapshotWithNode0({kAllGpus, NodeState::kReady});
  GpuReservePlugin plugin;
  Placement placement{7, {{1, 0x0F}}, 1};
  ASSERT_TRUE(plugin.Reserve(snapshot, placement).ok());
  EXPECT_EQ(testing::HeldGpus(snapshot, 7), 4);
  EXPECT_FALSE(plugin.Reserve(snapshot, placement).ok());  // already held
  plugin.Unreserve(snapshot, placement);
  plugin.Unreserve(snapshot, placement);
  EXPECT_EQ(testing::HeldGpus(snapshot, 7), 0);
  EXPECT_EQ(snapshot.free_gpu_count(), 4 * kGpusPerNode);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

TEST(GpuReservePluginTest, UnreserveLeavesOtherInstancesAlone) {
  Snapshot snapshot = SnapshotWithNode0({0xF0, NodeState::kReady});  // 99 holds 0-3
  GpuReservePlugin plugin;
  plugin.Unreserve(snapshot, Placement{7, {{0, 0xFF}}, 1});
  EXPECT_EQ(testing::HeldGpus(snapshot, 99), 4);
  EXPECT_TRUE(snapshot.CheckInvariants());
}

}  // namespace
}  // namespace sv::scheduler::internal
