// The built-in filter, score and reserve plugins.
#include "scheduler/internal/plugins.h"

#include <algorithm>

namespace sv::scheduler::internal {
namespace {

bool IsGang(const Request& request) {
  return request.gpu_count > kGpusPerNode;
}

int NeededOnNode(const Request& request) {
  return IsGang(request) ? kGpusPerNode : request.gpu_count;
}

}  // namespace

FilterResult PinnedNodeFilter::Filter(const SnapshotState& state,
                                      const Request& request,
                                      NodeIndex node) const {
  (void)state;
  if (request.pinned_node >= 0 && node != request.pinned_node) {
    return {false, "not the node that holds its node-local volumes"};
  }
  return {true, {}};
}

FilterResult NodeStateFilter::Filter(const SnapshotState& state,
                                     const Request& request,
                                     NodeIndex node) const {
  const NodeRecord& record = state.nodes[node];
  switch (record.state) {
    case NodeState::kReady:
      break;
    case NodeState::kCordoned:
      return {false, "cordoned"};
    case NodeState::kDraining:
      return {false, "draining"};
    case NodeState::kDown:
      return {false, "down"};
  }
  if (record.held) return {false, "held for an older request"};
  return {true, {}};
}

FilterResult FreeGpusFilter::Filter(const SnapshotState& state,
                                    const Request& request,
                                    NodeIndex node) const {
  GpuMask free = state.nodes[node].free;
  if (IsGang(request)) {
    if (free != kAllGpus) return {false, "partly used"};
    return {true, {}};
  }
  if (GpuCount(free) < request.gpu_count) {
    return {false, "short of free GPUs"};
  }
  return {true, {}};
}

int64_t MostAllocatedScore::Score(const SnapshotState& state,
                                  const Request& request,
                                  NodeIndex node) const {
  return kGpusPerNode - GpuCount(state.nodes[node].free) +
         NeededOnNode(request);
}

int64_t LeastAllocatedScore::Score(const SnapshotState& state,
                                   const Request& request,
                                   NodeIndex node) const {
  return GpuCount(state.nodes[node].free) - NeededOnNode(request);
}

int64_t GroupFitScore::Score(const SnapshotState& state, const Request& request,
                             NodeIndex node) const {
  if (request.gpu_count > kGpusPerGroup) return 0;
  GpuMask free = state.nodes[node].free;
  int64_t best = 0;
  for (GpuMask group : kGroupMask) {
    int group_free = GpuCount(free & group);
    if (group_free == request.gpu_count) return 2;
    if (group_free > request.gpu_count) best = 1;
  }
  return best;
}

int64_t LeafPackingScore::Score(const SnapshotState& state,
                                const Request& request, NodeIndex node) const {
  const NodeRecord& record = state.nodes[node];
  int whole_free = state.LeafWholeFree(record.leaf);
  if (record.free == kAllGpus && record.leaf_free_position >= 0) whole_free--;
  return -whole_free;
}

int64_t LowestIndexScore::Score(const SnapshotState& state,
                                const Request& request, NodeIndex node) const {
  return -static_cast<int64_t>(node);
}

absl::Status GpuReservePlugin::Reserve(Snapshot& snapshot,
                                       const Placement& placement) {
  return snapshot.Reserve(placement);
}

void GpuReservePlugin::Unreserve(Snapshot& snapshot,
                                 const Placement& placement) {
  snapshot.ReleasePart(placement.instance, placement.nodes);
}

void AddNormalizedScores(const std::vector<int64_t>& raw, int weight,
                         std::vector<int64_t>& totals) {
  assert(raw.size() == totals.size());
  if (raw.empty()) return;
  auto [min_it, max_it] = std::minmax_element(raw.begin(), raw.end());
  int64_t low = *min_it;
  int64_t span = *max_it - low;
  if (span == 0) return;
  for (size_t i = 0; i < raw.size(); ++i) {
    totals[i] += weight * ((raw[i] - low) * kScoreMax / span);
  }
}

namespace {

GpuMask LowestBits(GpuMask free, int gpu_count) {
  GpuMask picked = 0;
  for (int gpu = 0; gpu < kGpusPerNode && gpu_count > 0; ++gpu) {
    GpuMask bit = static_cast<GpuMask>(1u << gpu);
    if (free & bit) {
      picked |= bit;
      gpu_count--;
    }
  }
  assert(gpu_count == 0);
  return picked;
}

}  // namespace

GpuMask PickGpus(GpuMask free, int gpu_count, bool group_aware) {
  assert(gpu_count >= 1 && gpu_count <= GpuCount(free));
  if (!group_aware) return LowestBits(free, gpu_count);
  // Tightest single group that holds the request, so the other group keeps
  // as many free GPUs as possible for a later 4-GPU request.
  int best_group = -1;
  int best_free = kGpusPerGroup + 1;
  for (int group = 0; group < 2; ++group) {
    int group_free = GpuCount(free & kGroupMask[group]);
    if (group_free >= gpu_count && group_free < best_free) {
      best_group = group;
      best_free = group_free;
    }
  }
  if (best_group >= 0) {
    return LowestBits(free & kGroupMask[best_group], gpu_count);
  }
  // It must span both groups: fill the fuller group first.
  int first = GpuCount(free & kGroupMask[0]) <= GpuCount(free & kGroupMask[1])
                  ? 0
                  : 1;
  GpuMask first_free = free & kGroupMask[first];
  int from_first = std::min(GpuCount(first_free), gpu_count);
  GpuMask picked = from_first > 0 ? LowestBits(first_free, from_first) : 0;
  int rest = gpu_count - from_first;
  if (rest > 0) picked |= LowestBits(free & kGroupMask[1 - first], rest);
  return picked;
}

}  // namespace sv::scheduler::internal
