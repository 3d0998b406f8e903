// Scheduler::EmptyNodes: moves small instances off the least used ready nodes
// so that a request for whole nodes can start.
#include <algorithm>
#include <bit>
#include <cassert>
#include <functional>
#include <vector>

#include "scheduler/scheduler.h"

namespace sv::scheduler {
namespace {

int UsedGpuCount(const Snapshot& snapshot, NodeIndex node) {
  return kGpusPerNode -
         std::popcount(static_cast<unsigned>(snapshot.node(node).free_gpus));
}

int EmptyReadyNodeCount(const Snapshot& snapshot) {
  int count = 0;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    count += snapshot.node(node).state == NodeState::kReady &&
             UsedGpuCount(snapshot, node) == 0;
  }
  return count;
}

// The distinct instances on `node`, in order of their first GPU. Returns
// false when one of them may not move: not movable, 8 GPUs or more, or GPUs
// on another node too (moving it would change its shape).
bool MovableHolders(const Snapshot& snapshot, NodeIndex node,
                    const std::function<bool(InstanceId)>& movable,
                    std::vector<InstanceId>& holders) {
  holders.clear();
  for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
    InstanceId id = snapshot.gpu_holder(node, gpu);
    if (id == kNoInstance) continue;
    if (std::find(holders.begin(), holders.end(), id) != holders.end()) {
      continue;
    }
    if (!movable(id)) return false;
    std::vector<NodeAssignment> parts = snapshot.InstanceNodes(id);
    if (parts.size() != 1 ||
        std::popcount(parts.front().gpus) >= kGpusPerNode) {
      return false;
    }
    holders.push_back(id);
  }
  return true;
}

// The least used ready node not tried yet whose instances may all move (ties:
// lowest index), with those instances; -1 when there is none.
NodeIndex NextCandidate(const Snapshot& snapshot,
                        const std::vector<bool>& tried,
                        const std::function<bool(InstanceId)>& movable,
                        std::vector<InstanceId>& best_holders) {
  NodeIndex best = -1;
  int best_used = 0;
  std::vector<InstanceId> holders;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    if (tried[node] || snapshot.node(node).state != NodeState::kReady) continue;
    const int used = UsedGpuCount(snapshot, node);
    if (used == 0 || (best >= 0 && used >= best_used)) continue;
    if (!MovableHolders(snapshot, node, movable, holders)) continue;
    best = node;
    best_used = used;
    best_holders.swap(holders);
  }
  return best;
}

}  // namespace

std::vector<Move> Scheduler::EmptyNodes(Snapshot& snapshot,
                                        const EmptyNodesOptions& options) {
  std::vector<Move> moves;
  if (!options.movable || options.nodes_wanted <= 0) return moves;
  const size_t moves_max = static_cast<size_t>(std::max(options.moves_max, 0));
  std::vector<bool> tried(snapshot.node_count(), false);
  std::vector<InstanceId> holders;
  // Each round marks one node tried, so the loop ends after node_count rounds.
  while (EmptyReadyNodeCount(snapshot) < options.nodes_wanted) {
    const NodeIndex node =
        NextCandidate(snapshot, tried, options.movable, holders);
    if (node < 0) break;
    tried[node] = true;
    if (moves.size() + holders.size() > moves_max) continue;
    // Cordoned, the node receives none of its own instances back.
    snapshot.SetNodeState(node, NodeState::kCordoned);
    std::vector<Placement> before;
    std::vector<Placement> after;
    for (InstanceId id : holders) {
      before.push_back(Placement{id, snapshot.InstanceNodes(id), 1});
      snapshot.Release(id);
      absl::StatusOr<Placement> placed =
          Place(snapshot, Request{id, before.back().gpu_count(), 0});
      if (!placed.ok()) break;
      after.push_back(*std::move(placed));
    }
    if (after.size() < holders.size()) {
      // Undo: every instance tried goes back where it was.
      for (const Placement& placement : before) {
        snapshot.Release(placement.instance);
      }
      snapshot.SetNodeState(node, NodeState::kReady);
      for (const Placement& placement : before) {
        [[maybe_unused]] absl::Status status = snapshot.Reserve(placement);
        assert(status.ok());
      }
      continue;
    }
    snapshot.SetNodeState(node, NodeState::kReady);
    for (size_t i = 0; i < holders.size(); ++i) {
      moves.push_back(
          Move{holders[i], std::move(before[i].nodes), std::move(after[i])});
    }
  }
  assert(moves.size() <= moves_max);
  return moves;
}

}  // namespace sv::scheduler
