// Elastic resize of a whole-node instance, keeping its id.
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler {
namespace {

using internal::SnapshotState;

absl::Status ValidateResize(int new_gpu_count) {
  if (new_gpu_count < kGpusPerNode || new_gpu_count > kGpuCountMax ||
      new_gpu_count % kGpusPerNode != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resize target must be a multiple of ", kGpusPerNode, " from ",
        kGpusPerNode, " to ", kGpuCountMax, ", got ", new_gpu_count));
  }
  return absl::OkStatus();
}

// Distance tier of a leaf from the instance: 0 its own leaves, 1 its pods,
// 2 its zone; -1 elsewhere (a gang never spans zones).
int Tier(const SnapshotState& state, int32_t leaf,
         const std::map<int32_t, int>& own_leaves, int32_t zone) {
  if (own_leaves.contains(leaf)) return 0;
  int32_t pod = state.leaves[leaf].pod;
  for (const auto& [own, count] : own_leaves) {
    if (state.leaves[own].pod == pod) return 1;
  }
  return state.pods[pod].zone == zone ? 2 : -1;
}

// Whole free nodes to add, nearest first: own leaves (most of the instance
// first), then leaves of its pods, then its zone, each by most free nodes.
// With `nearest` false, the leaves outside its own are taken by most free
// nodes alone, whatever their pod: the fewest new leaves that can hold the
// growth (for a gang with a limit on its leaves).
std::vector<NodeIndex> GrowthNodes(const SnapshotState& state,
                                   const std::vector<NodeAssignment>& parts,
                                   int need, bool nearest) {
  std::map<int32_t, int> own_leaves;
  for (const NodeAssignment& part : parts) {
    own_leaves[state.nodes[part.node].leaf]++;
  }
  int32_t zone = state.ZoneOf(parts.front().node);
  struct Ranked {
    int tier, own, free;
    int32_t leaf;
  };
  std::vector<Ranked> ranked;
  for (int32_t leaf = 0; leaf < static_cast<int32_t>(state.leaves.size());
       ++leaf) {
    int tier = Tier(state, leaf, own_leaves, zone);
    if (tier < 0 || state.LeafWholeFree(leaf) == 0) continue;
    if (!nearest) tier = std::min(tier, 1);
    auto own = own_leaves.find(leaf);
    ranked.push_back({tier, own == own_leaves.end() ? 0 : own->second,
                      state.LeafWholeFree(leaf), leaf});
  }
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.tier != b.tier) return a.tier < b.tier;
    if (a.own != b.own) return a.own > b.own;
    if (a.free != b.free) return a.free > b.free;
    return a.leaf < b.leaf;
  });
  std::vector<NodeIndex> nodes;
  for (const Ranked& entry : ranked) {
    for (NodeIndex node : state.leaves[entry.leaf].whole_free) {
      if (static_cast<int>(nodes.size()) == need) return nodes;
      nodes.push_back(node);
    }
  }
  return nodes;
}

// Leaf switches under the instance's parts plus `added`.
int LeafCount(const SnapshotState& state, const std::vector<NodeAssignment>& parts,
              const std::vector<NodeIndex>& added) {
  std::set<int32_t> leaves;
  for (const NodeAssignment& part : parts) leaves.insert(state.nodes[part.node].leaf);
  for (NodeIndex node : added) leaves.insert(state.nodes[node].leaf);
  return static_cast<int>(leaves.size());
}

// Nodes to give back on shrink: those in the leaves where the instance has
// the fewest nodes go first, so the rest stays as close as it was.
std::vector<NodeAssignment> ShrinkNodes(const SnapshotState& state,
                                        std::vector<NodeAssignment> parts,
                                        int remove) {
  std::map<int32_t, int> per_leaf;
  for (const NodeAssignment& part : parts) per_leaf[state.nodes[part.node].leaf]++;
  std::sort(parts.begin(), parts.end(),
            [&](const NodeAssignment& a, const NodeAssignment& b) {
              int count_a = per_leaf[state.nodes[a.node].leaf];
              int count_b = per_leaf[state.nodes[b.node].leaf];
              return count_a != count_b ? count_a < count_b : a.node > b.node;
            });
  parts.resize(remove);
  return parts;
}

}  // namespace

absl::StatusOr<ResizeResult> Scheduler::Resize(Snapshot& snapshot,
                                               InstanceId instance,
                                               int new_gpu_count,
                                               int max_leaves) {
  if (absl::Status status = ValidateResize(new_gpu_count); !status.ok()) {
    return status;
  }
  std::vector<NodeAssignment> parts = snapshot.InstanceNodes(instance);
  if (parts.empty()) {
    return absl::NotFoundError(
        absl::StrCat("instance ", instance, " holds no GPUs"));
  }
  for (const NodeAssignment& part : parts) {
    if (part.gpus != kAllGpus) {
      return absl::FailedPreconditionError(absl::StrCat(
          "instance ", instance, " does not hold whole nodes; only whole-node "
          "instances (8 GPUs or more) can be resized"));
    }
  }
  const SnapshotState& state = snapshot.state();
  int have = static_cast<int>(parts.size());
  int want = new_gpu_count / kGpusPerNode;
  ResizeResult result;
  if (want < have) {
    result.removed = ShrinkNodes(state, parts, have - want);
    snapshot.ReleasePart(instance, result.removed);
  } else if (want > have) {
    std::vector<NodeIndex> nodes = GrowthNodes(state, parts, want - have, true);
    if (static_cast<int>(nodes.size()) < want - have) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot grow instance ", instance, " from ", have * kGpusPerNode,
          " to ", new_gpu_count, " GPUs: needs ", want - have,
          " more whole free nodes in its zone, ", nodes.size(), " available"));
    }
    // The gang's limit on leaf switches holds after growth as it did at
    // placement: the nearest nodes first, else the fewest new leaves.
    if (max_leaves > 0 && LeafCount(state, parts, nodes) > max_leaves) {
      nodes = GrowthNodes(state, parts, want - have, false);
      if (const int leaves = LeafCount(state, parts, nodes); leaves > max_leaves) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot grow instance ", instance, " from ", have * kGpusPerNode, " to ",
            new_gpu_count, " GPUs: it may span at most ", max_leaves,
            " leaf switches, and the whole free nodes in its zone would put it on ", leaves));
      }
    }
    Placement added{instance, {}, 0};
    for (NodeIndex node : nodes) added.nodes.push_back({node, kAllGpus});
    if (absl::Status status = ReserveAll(snapshot, added); !status.ok()) {
      return status;
    }
    result.added = std::move(added.nodes);
  }
  result.placement.instance = instance;
  result.placement.nodes = snapshot.InstanceNodes(instance);
  result.placement.leaf_count = LeafCount(state, result.placement.nodes, {});
  return result;
}

}  // namespace sv::scheduler
