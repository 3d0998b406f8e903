// Candidate generation for small requests and node search for gangs. These
// read only the indexes, so a decision costs about the same at 1k and 10k
// nodes.
#include "scheduler/internal/search.h"

#include <algorithm>
#include <limits>

namespace sv::scheduler::internal {

uint64_t NextRandom(uint64_t& state) {
  // splitmix64: tiny, well mixed, and the same on every platform.
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

NodeIndex FirstByIndex(const SnapshotState& state, int gpu_count) {
  for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size());
       ++node) {
    if (state.nodes[node].bucket_position >= 0 &&
        GpuCount(state.nodes[node].free) >= gpu_count) {
      return node;
    }
  }
  return -1;
}

NodeIndex DrawRandom(const SnapshotState& state, int gpu_count, uint64_t& rng) {
  size_t total = 0;
  for (int free = gpu_count; free <= kGpusPerNode; ++free) {
    total += state.buckets[free].size();
  }
  if (total == 0) return -1;
  size_t pick = NextRandom(rng) % total;
  for (int free = gpu_count; free <= kGpusPerNode; ++free) {
    if (pick < state.buckets[free].size()) return state.buckets[free][pick];
    pick -= state.buckets[free].size();
  }
  return -1;
}

}  // namespace

std::vector<NodeIndex> SmallCandidates(const SnapshotState& state,
                                       int gpu_count, CandidateSource source,
                                       int candidates_max, uint64_t& rng) {
  assert(gpu_count >= 1 && gpu_count <= kGpusPerNode);
  std::vector<NodeIndex> out;
  switch (source) {
    case CandidateSource::kFrontFirst:
      // One stable order for every small request: churn stays on the
      // front of the fleet and the back drains into whole nodes and leaves.
      if (NodeIndex node = state.FirstFitInTopologyOrder(gpu_count);
          node >= 0) {
        out.push_back(node);
      }
      break;
    case CandidateSource::kTightestBucket:
      for (int free = gpu_count; free <= kGpusPerNode && out.empty(); ++free) {
        out = state.buckets[free];
      }
      break;
    case CandidateSource::kLoosest:
      for (int free = kGpusPerNode; free >= gpu_count && out.empty(); --free) {
        out = state.buckets[free];
      }
      break;
    case CandidateSource::kIndexOrder:
      if (NodeIndex node = FirstByIndex(state, gpu_count); node >= 0) {
        out.push_back(node);
      }
      break;
    case CandidateSource::kRandom:
      if (NodeIndex node = DrawRandom(state, gpu_count, rng); node >= 0) {
        out.push_back(node);
      }
      break;
  }
  return out;
}

int CountLeaves(const SnapshotState& state,
                const std::vector<NodeIndex>& nodes) {
  std::vector<int32_t> leaves;
  leaves.reserve(nodes.size());
  for (NodeIndex node : nodes) leaves.push_back(state.nodes[node].leaf);
  std::sort(leaves.begin(), leaves.end());
  return static_cast<int>(std::unique(leaves.begin(), leaves.end()) -
                          leaves.begin());
}

std::vector<NodeIndex> CoverWithLeaves(const SnapshotState& state,
                                       std::vector<int32_t> leaves, int need,
                                       int max_leaves) {
  std::sort(leaves.begin(), leaves.end(), [&](int32_t a, int32_t b) {
    int count_a = state.LeafWholeFree(a);
    int count_b = state.LeafWholeFree(b);
    return count_a != count_b ? count_a > count_b : a < b;
  });
  std::vector<NodeIndex> nodes;
  int remaining = need;
  for (size_t i = 0; i < leaves.size() && remaining > 0; ++i) {
    int count = state.LeafWholeFree(leaves[i]);
    if (count == 0) break;
    size_t chosen = i;
    if (count >= remaining) {
      // Best fit for the last leaf: the smallest leaf that still suffices.
      while (chosen + 1 < leaves.size() &&
             state.LeafWholeFree(leaves[chosen + 1]) >= remaining) {
        chosen++;
      }
    }
    const std::vector<NodeIndex>& free = state.leaves[leaves[chosen]].whole_free;
    int take = std::min(remaining, static_cast<int>(free.size()));
    nodes.insert(nodes.end(), free.begin(), free.begin() + take);
    remaining -= take;
  }
  if (remaining > 0) return {};
  if (max_leaves > 0 && CountLeaves(state, nodes) > max_leaves) return {};
  return nodes;
}

namespace {

std::vector<NodeIndex> TreeGang(const SnapshotState& state, int node_count,
                                int max_leaves) {
  // One leaf: the smallest leaf that holds the whole gang.
  auto leaf_it = state.leaves_by_whole_free.lower_bound(
      {node_count, std::numeric_limits<int32_t>::min()});
  if (leaf_it != state.leaves_by_whole_free.end()) {
    const std::vector<NodeIndex>& free = state.leaves[leaf_it->second].whole_free;
    return std::vector<NodeIndex>(free.begin(), free.begin() + node_count);
  }
  // One pod: the pod whose cover needs the fewest leaves, then the smallest.
  std::vector<NodeIndex> best;
  int best_leaves = std::numeric_limits<int>::max();
  auto pod_it = state.pods_by_whole_free.lower_bound(
      {node_count, std::numeric_limits<int32_t>::min()});
  for (; pod_it != state.pods_by_whole_free.end(); ++pod_it) {
    std::vector<NodeIndex> nodes = CoverWithLeaves(
        state, state.pods[pod_it->second].leaves, node_count, max_leaves);
    if (nodes.empty()) continue;
    int leaves = CountLeaves(state, nodes);
    if (leaves < best_leaves) {
      best_leaves = leaves;
      best = std::move(nodes);
    }
  }
  if (!best.empty()) return best;
  // One zone: any leaves of the zone, fewest first.
  for (const ZoneRecord& zone : state.zones) {
    if (zone.whole_free_count < node_count) continue;
    std::vector<int32_t> leaves;
    for (int32_t pod : zone.pods) {
      const std::vector<int32_t>& pod_leaves = state.pods[pod].leaves;
      leaves.insert(leaves.end(), pod_leaves.begin(), pod_leaves.end());
    }
    std::vector<NodeIndex> nodes =
        CoverWithLeaves(state, std::move(leaves), node_count, max_leaves);
    if (!nodes.empty()) return nodes;
  }
  return {};
}

std::vector<NodeIndex> IndexOrderGang(const SnapshotState& state,
                                      int node_count) {
  std::vector<NodeIndex> nodes;
  for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size()) &&
                           static_cast<int>(nodes.size()) < node_count;
       ++node) {
    if (state.nodes[node].leaf_free_position >= 0) nodes.push_back(node);
  }
  if (static_cast<int>(nodes.size()) < node_count) return {};
  return nodes;
}

std::vector<NodeIndex> RandomGang(const SnapshotState& state, int node_count,
                                  uint64_t& rng) {
  std::vector<NodeIndex> pool = state.buckets[kGpusPerNode];
  if (static_cast<int>(pool.size()) < node_count) return {};
  for (int i = 0; i < node_count; ++i) {
    size_t j = i + NextRandom(rng) % (pool.size() - i);
    std::swap(pool[i], pool[j]);
  }
  pool.resize(node_count);
  return pool;
}

bool SameZone(const SnapshotState& state, const std::vector<NodeIndex>& nodes) {
  for (NodeIndex node : nodes) {
    if (state.ZoneOf(node) != state.ZoneOf(nodes.front())) return false;
  }
  return true;
}

}  // namespace

std::vector<NodeIndex> FindGangNodes(const SnapshotState& state,
                                     int node_count, int max_leaves,
                                     GangMode mode, uint64_t& rng) {
  assert(node_count >= 2 && node_count <= kGangNodeCountMax);
  if (static_cast<int>(state.buckets[kGpusPerNode].size()) < node_count) {
    return {};
  }
  std::vector<NodeIndex> nodes;
  switch (mode) {
    case GangMode::kTree:
      return TreeGang(state, node_count, max_leaves);
    case GangMode::kIndexOrder:
      nodes = IndexOrderGang(state, node_count);
      break;
    case GangMode::kRandom:
      nodes = RandomGang(state, node_count, rng);
      break;
  }
  if (nodes.empty() || !SameZone(state, nodes)) return {};
  if (max_leaves > 0 && CountLeaves(state, nodes) > max_leaves) return {};
  return nodes;
}

}  // namespace sv::scheduler::internal
