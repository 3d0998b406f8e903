// Scheduler::EmptyNodes: empties the least used ready nodes by moving movable
// small instances elsewhere, leaves everything else as it was, and undoes a
// node whose instances cannot all move.
#include <array>
#include <bit>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "test_fleet.h"

namespace sv::scheduler {
namespace {

using testing::FleetShape;
using testing::MakeFleet;
using testing::MustBuild;

using Holders = std::vector<std::array<InstanceId, kGpusPerNode>>;

Holders AllHolders(const Snapshot& snapshot) {
  Holders holders(snapshot.node_count());
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
      holders[node][gpu] = snapshot.gpu_holder(node, gpu);
    }
  }
  return holders;
}

std::vector<NodeState> AllStates(const Snapshot& snapshot) {
  std::vector<NodeState> states;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    states.push_back(snapshot.node(node).state);
  }
  return states;
}

int EmptyReadyNodeCount(const Snapshot& snapshot) {
  int count = 0;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    NodeInfo info = snapshot.node(node);
    count += info.state == NodeState::kReady && info.free_gpus == kAllGpus;
  }
  return count;
}

int GpuCount(const std::vector<NodeAssignment>& parts) {
  int count = 0;
  for (const NodeAssignment& part : parts) count += std::popcount(part.gpus);
  return count;
}

constexpr Policy kPolicies[] = {Policy::kDefault, Policy::kFirstFit,
                                Policy::kBestFit, Policy::kSpread,
                                Policy::kRandom,  Policy::kTopologyTree};

// `gpu_count` GPUs of `node` from `first_gpu` on, held by `instance`.
struct Holding {
  NodeIndex node;
  int first_gpu;
  int gpu_count;
  InstanceId instance;
};

struct ExpectedMove {
  InstanceId instance;
  NodeIndex from;
  NodeIndex to;
};

struct Case {
  std::string name;
  int node_count;
  std::vector<Holding> holdings;
  std::map<NodeIndex, NodeState> states;  // nodes not listed are ready
  // Movable instances; nullopt leaves EmptyNodesOptions::movable empty.
  std::optional<std::set<InstanceId>> movable;
  int nodes_wanted;
  int moves_max = 64;
  std::vector<ExpectedMove> moves;  // in order
};

std::vector<NodeSpec> BuildSpecs(const Case& test_case) {
  std::vector<NodeSpec> nodes =
      MakeFleet(FleetShape{1, 1, 1, test_case.node_count});
  for (const Holding& holding : test_case.holdings) {
    for (int gpu = holding.first_gpu;
         gpu < holding.first_gpu + holding.gpu_count; ++gpu) {
      nodes[holding.node].gpu_holders[gpu] = holding.instance;
    }
  }
  for (const auto& [node, state] : test_case.states) nodes[node].state = state;
  return nodes;
}

// Every case has exactly one possible outcome, so it must hold for every
// policy.
TEST(EmptyNodesTest, Table) {
  const std::set<InstanceId> all = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<Case> cases = {
      {.name = "the less used of two half-full nodes empties onto the other",
       .node_count = 2,
       .holdings = {{0, 0, 2, 1}, {0, 2, 2, 2}, {1, 0, 3, 3}},
       .movable = all,
       .nodes_wanted = 1,
       .moves = {{3, 1, 0}}},
      {.name = "a tie goes to the lowest index; holders move in GPU order",
       .node_count = 2,
       .holdings = {{0, 0, 1, 5}, {0, 1, 3, 4}, {1, 4, 4, 3}},
       .movable = all,
       .nodes_wanted = 1,
       .moves = {{5, 0, 1}, {4, 0, 1}}},
      {.name = "a node with a non-movable instance is passed over",
       .node_count = 2,
       .holdings = {{0, 0, 1, 1}, {1, 0, 4, 2}, {1, 4, 2, 3}},
       .movable = std::set<InstanceId>{2, 3},
       .nodes_wanted = 1,
       .moves = {{2, 1, 0}, {3, 1, 0}}},
      {.name = "a non-movable instance keeps its only candidate node",
       .node_count = 2,
       .holdings = {{0, 0, 1, 1}, {0, 1, 1, 2}},
       .movable = std::set<InstanceId>{1},
       .nodes_wanted = 2},
      {.name = "an 8-GPU instance never moves",
       .node_count = 2,
       .holdings = {{0, 0, 8, 1}},
       .movable = all,
       .nodes_wanted = 2},
      {.name = "a gang never moves",
       .node_count = 4,
       .holdings = {{0, 0, 8, 1}, {1, 0, 8, 1}},
       .movable = all,
       .nodes_wanted = 4},
      {.name = "nodes that are not ready neither count, empty nor receive",
       .node_count = 5,
       .holdings = {{1, 0, 1, 1}, {3, 0, 2, 2}, {4, 0, 4, 3}},
       .states = {{0, NodeState::kCordoned},
                  {1, NodeState::kDraining},
                  {2, NodeState::kDown}},
       .movable = all,
       .nodes_wanted = 1,
       .moves = {{2, 3, 4}}},
      {.name = "an empty cordoned node is no destination",
       .node_count = 3,
       .holdings = {{1, 0, 2, 1}, {2, 0, 8, 2}},
       .states = {{0, NodeState::kCordoned}},
       .movable = all,
       .nodes_wanted = 1},
      {.name = "nothing fits elsewhere",
       .node_count = 2,
       .holdings = {{0, 0, 4, 1}, {0, 4, 3, 2}, {1, 0, 4, 3}, {1, 4, 3, 4}},
       .movable = all,
       .nodes_wanted = 1},
      {.name = "the first instance fits, the second does not: both go back",
       .node_count = 2,
       .holdings = {{0, 0, 1, 1}, {0, 4, 4, 2}, {1, 0, 6, 3}},
       .movable = all,
       .nodes_wanted = 1},
      {.name = "a node needing more moves than allowed is skipped",
       .node_count = 3,
       .holdings = {{0, 0, 1, 1}, {0, 1, 1, 2}, {1, 0, 2, 3}, {2, 0, 8, 4}},
       .movable = all,
       .nodes_wanted = 1,
       .moves_max = 1,
       .moves = {{3, 1, 0}}},
      {.name = "moves up to the limit are allowed",
       .node_count = 3,
       .holdings = {{0, 0, 1, 1}, {0, 1, 1, 2}, {1, 0, 2, 3}, {2, 0, 8, 4}},
       .movable = all,
       .nodes_wanted = 1,
       .moves_max = 2,
       .moves = {{1, 0, 1}, {2, 0, 1}}},
      {.name = "no moves allowed",
       .node_count = 3,
       .holdings = {{0, 0, 1, 1}, {0, 1, 1, 2}, {1, 0, 2, 3}, {2, 0, 8, 4}},
       .movable = all,
       .nodes_wanted = 1,
       .moves_max = 0},
      {.name = "enough empty nodes already",
       .node_count = 3,
       .holdings = {{1, 0, 1, 1}, {2, 0, 1, 2}},
       .movable = all,
       .nodes_wanted = 1},
      {.name = "no nodes wanted",
       .node_count = 2,
       .holdings = {{0, 0, 1, 1}, {1, 0, 1, 2}},
       .movable = all,
       .nodes_wanted = 0},
      {.name = "no movable function: nothing moves",
       .node_count = 2,
       .holdings = {{0, 0, 1, 1}, {1, 0, 1, 2}},
       .movable = std::nullopt,
       .nodes_wanted = 1},
  };
  for (const Case& test_case : cases) {
    for (Policy policy : kPolicies) {
      SCOPED_TRACE(test_case.name + ", policy " +
                   std::string(PolicyName(policy)));
      Snapshot snapshot = MustBuild(BuildSpecs(test_case));
      const Holders holders_before = AllHolders(snapshot);
      const std::vector<NodeState> states_before = AllStates(snapshot);
      Scheduler scheduler(SchedulerOptions{policy});
      EmptyNodesOptions options{test_case.nodes_wanted, nullptr,
                                test_case.moves_max};
      if (test_case.movable.has_value()) {
        const std::set<InstanceId> movable = *test_case.movable;
        options.movable = [movable](InstanceId id) {
          return movable.contains(id);
        };
      }
      const std::vector<Move> moves = scheduler.EmptyNodes(snapshot, options);

      ASSERT_TRUE(snapshot.CheckInvariants());
      EXPECT_EQ(AllStates(snapshot), states_before);
      ASSERT_EQ(moves.size(), test_case.moves.size());
      std::set<InstanceId> moved;
      for (size_t i = 0; i < moves.size(); ++i) {
        const ExpectedMove& expected = test_case.moves[i];
        const Move& move = moves[i];
        EXPECT_EQ(move.instance, expected.instance) << "move " << i;
        ASSERT_EQ(move.from.size(), 1u);
        EXPECT_EQ(move.from[0].node, expected.from);
        EXPECT_EQ(move.to.instance, expected.instance);
        ASSERT_EQ(move.to.nodes.size(), 1u);
        EXPECT_EQ(move.to.nodes[0].node, expected.to);
        EXPECT_EQ(move.to.gpu_count(), GpuCount(move.from));
        EXPECT_EQ(snapshot.InstanceNodes(move.instance), move.to.nodes);
        moved.insert(move.instance);
      }
      // Instances that did not move hold exactly the GPUs they held.
      const Holders holders_after = AllHolders(snapshot);
      for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
        for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
          InstanceId before = holders_before[node][gpu];
          InstanceId after = holders_after[node][gpu];
          if (before != kNoInstance && !moved.contains(before)) {
            EXPECT_EQ(after, before) << "node " << node << " gpu " << gpu;
          }
          if (after != kNoInstance && !moved.contains(after)) {
            EXPECT_EQ(after, before) << "node " << node << " gpu " << gpu;
          }
        }
      }
      if (test_case.moves.empty()) {
        EXPECT_EQ(holders_after, holders_before);
      }
    }
  }
}

// Random fleets: node states, small, 8-GPU and gang instances, and a random
// movable subset.
struct RandomFleet {
  std::vector<NodeSpec> nodes;
  std::set<InstanceId> movable;
};

RandomFleet DrawFleet(std::mt19937_64& rng) {
  auto below = [&rng](int n) { return static_cast<int>(rng() % n); };
  RandomFleet fleet;
  fleet.nodes =
      MakeFleet(FleetShape{1, 1 + below(2), 1 + below(3), 2 + below(7)});
  const int node_count = static_cast<int>(fleet.nodes.size());
  InstanceId next_id = 1;
  for (int node = 0; node < node_count; ++node) {
    NodeSpec& spec = fleet.nodes[node];
    const int kind = below(10);
    if (kind == 0) continue;  // empty
    if (kind == 1 && node + 1 < node_count) {
      // A gang of two whole nodes.
      spec.gpu_holders.fill(next_id);
      fleet.nodes[++node].gpu_holders.fill(next_id);
      if (below(2) == 0) fleet.movable.insert(next_id);
      next_id++;
      continue;
    }
    if (kind == 2) {
      spec.gpu_holders.fill(next_id);
      if (below(2) == 0) fleet.movable.insert(next_id);
      next_id++;
      continue;
    }
    // Small instances on random free GPUs, not necessarily contiguous.
    const int instance_count = 1 + below(4);
    for (int i = 0; i < instance_count; ++i) {
      const int gpu_count = 1 + below(4);
      int placed = 0;
      for (int gpu = below(kGpusPerNode), tries = 0;
           placed < gpu_count && tries < kGpusPerNode;
           gpu = (gpu + 1) % kGpusPerNode, ++tries) {
        if (spec.gpu_holders[gpu] != kNoInstance) continue;
        spec.gpu_holders[gpu] = next_id;
        placed++;
      }
      if (placed == 0) break;
      if (below(4) != 0) fleet.movable.insert(next_id);
      next_id++;
    }
  }
  for (NodeSpec& spec : fleet.nodes) {
    const int draw = below(10);
    if (draw == 0) spec.state = NodeState::kCordoned;
    if (draw == 1) spec.state = NodeState::kDraining;
    if (draw == 2) spec.state = NodeState::kDown;
  }
  return fleet;
}

TEST(EmptyNodesTest, RandomFleetsKeepEveryPromise) {
  std::mt19937_64 rng(20261201);
  int moved_total = 0;
  int instances_moved_twice = 0;
  for (int round = 0; round < 400; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const RandomFleet fleet = DrawFleet(rng);
    Snapshot snapshot = MustBuild(fleet.nodes);
    const Snapshot before = snapshot;
    const Policy policy = kPolicies[rng() % std::size(kPolicies)];
    Scheduler scheduler(SchedulerOptions{policy, 32, rng()});
    const EmptyNodesOptions options{
        static_cast<int>(rng() % 5),
        [&fleet](InstanceId id) { return fleet.movable.contains(id); },
        static_cast<int>(rng() % 3 == 0 ? rng() % 4 : 64)};
    const std::vector<Move> moves = scheduler.EmptyNodes(snapshot, options);

    ASSERT_TRUE(snapshot.CheckInvariants());
    EXPECT_EQ(AllStates(snapshot), AllStates(before));
    EXPECT_LE(static_cast<int>(moves.size()), options.moves_max);
    // A packing policy puts a node's instances on at most one node that was
    // empty, so emptying a node never loses one. Spread and random may scatter
    // them over several empty nodes: the count can drop, and is not checked.
    if (policy != Policy::kSpread && policy != Policy::kRandom) {
      EXPECT_GE(EmptyReadyNodeCount(snapshot), EmptyReadyNodeCount(before))
          << PolicyName(policy);
    }
    if (EmptyReadyNodeCount(before) >= options.nodes_wanted) {
      EXPECT_TRUE(moves.empty());
    }

    // An independent model: the GPUs before, with the moves applied in
    // order, must be exactly the snapshot after. Booking a GPU that is not
    // free in the model is a double booking.
    Holders model = AllHolders(before);
    std::map<InstanceId, const Move*> last_move;
    for (const Move& move : moves) {
      ASSERT_TRUE(fleet.movable.contains(move.instance)) << move.instance;
      ASSERT_EQ(move.to.instance, move.instance);
      ASSERT_EQ(move.to.nodes.size(), 1u);
      const NodeIndex to = move.to.nodes[0].node;
      EXPECT_EQ(snapshot.node(to).state, NodeState::kReady);
      EXPECT_EQ(move.to.gpu_count(), GpuCount(move.from));
      EXPECT_EQ(GpuCount(move.from),
                GpuCount(before.InstanceNodes(move.instance)));
      for (const NodeAssignment& part : move.from) {
        EXPECT_NE(part.node, to);
        for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
          if (!(part.gpus & (1u << gpu))) continue;
          ASSERT_EQ(model[part.node][gpu], move.instance);
          model[part.node][gpu] = kNoInstance;
        }
      }
      for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
        if (!(move.to.nodes[0].gpus & (1u << gpu))) continue;
        ASSERT_EQ(model[to][gpu], kNoInstance) << "double-booked";
        model[to][gpu] = move.instance;
      }
      instances_moved_twice += last_move.contains(move.instance);
      last_move[move.instance] = &move;
    }
    ASSERT_EQ(AllHolders(snapshot), model);
    for (const auto& [instance, move] : last_move) {
      EXPECT_EQ(snapshot.InstanceNodes(instance), move->to.nodes);
    }
    moved_total += static_cast<int>(moves.size());
  }
  // The rounds must exercise moving, not only the early exits.
  EXPECT_GT(moved_total, 100);
  RecordProperty("moved_total", moved_total);
  RecordProperty("instances_moved_twice", instances_moved_twice);
}

}  // namespace
}  // namespace sv::scheduler
