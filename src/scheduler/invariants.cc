// Snapshot::CheckInvariants: rebuilds every index from the node records and
// compares, so tests and debug builds catch any drift.
#include <algorithm>

#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler {
namespace {

using internal::SnapshotState;

bool NodeRecordsConsistent(const SnapshotState& state) {
  std::array<int, 4> by_state{};
  int free_gpus = 0;
  for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size());
       ++node) {
    const internal::NodeRecord& record = state.nodes[node];
    by_state[static_cast<int>(record.state)]++;
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
      bool free = record.free & (1u << gpu);
      if (free != (record.holders[gpu] == kNoInstance)) return false;
      InstanceId holder = record.holders[gpu];
      if (holder == kNoInstance) continue;
      auto found = state.instance_nodes.find(holder);
      if (found == state.instance_nodes.end() ||
          !std::binary_search(found->second.begin(), found->second.end(),
                              node)) {
        return false;
      }
    }
    bool schedulable = state.Schedulable(node);
    if (schedulable != (record.bucket_position >= 0)) return false;
    if (schedulable) {
      const std::vector<NodeIndex>& bucket =
          state.buckets[internal::GpuCount(record.free)];
      if (bucket[record.bucket_position] != node) return false;
      free_gpus += internal::GpuCount(record.free);
    }
    bool whole = schedulable && record.free == kAllGpus;
    if (whole != (record.leaf_free_position >= 0)) return false;
    if (whole &&
        state.leaves[record.leaf].whole_free[record.leaf_free_position] != node) {
      return false;
    }
  }
  return by_state == state.node_count_by_state &&
         free_gpus == state.free_gpu_count;
}

// The topology-order max-tree: a leaf per node holding its free GPU count
// when schedulable (else 0), each inner entry the max of its children.
bool FrontTreeConsistent(const SnapshotState& state) {
  const size_t leaves = static_cast<size_t>(state.front_leaves);
  if (state.front_order.size() != state.nodes.size() ||
      state.front_rank.size() != state.nodes.size() ||
      state.front_tree.size() != 2 * leaves || leaves < state.nodes.size()) {
    return false;
  }
  for (size_t rank = 0; rank < leaves; ++rank) {
    int expected = 0;
    if (rank < state.front_order.size()) {
      NodeIndex node = state.front_order[rank];
      if (state.front_rank[node] != static_cast<int32_t>(rank)) return false;
      if (state.Schedulable(node)) {
        expected = internal::GpuCount(state.nodes[node].free);
      }
    }
    if (state.front_tree[leaves + rank] != expected) return false;
  }
  for (size_t at = leaves; at-- > 1;) {
    if (state.front_tree[at] !=
        std::max(state.front_tree[2 * at], state.front_tree[2 * at + 1])) {
      return false;
    }
  }
  return true;
}

bool AggregatesConsistent(const SnapshotState& state) {
  size_t bucketed = 0;
  for (const auto& bucket : state.buckets) bucketed += bucket.size();
  if (static_cast<int>(bucketed) * kGpusPerNode != state.ready_gpu_count) {
    return false;
  }
  for (int32_t leaf = 0; leaf < static_cast<int32_t>(state.leaves.size());
       ++leaf) {
    if (!state.leaves_by_whole_free.contains({state.LeafWholeFree(leaf), leaf})) {
      return false;
    }
  }
  if (state.leaves_by_whole_free.size() != state.leaves.size()) return false;
  for (int32_t pod = 0; pod < static_cast<int32_t>(state.pods.size()); ++pod) {
    int whole = 0;
    for (int32_t leaf : state.pods[pod].leaves) whole += state.LeafWholeFree(leaf);
    if (whole != state.pods[pod].whole_free_count) return false;
    if (!state.pods_by_whole_free.contains({whole, pod})) return false;
  }
  for (const auto& [instance, nodes] : state.instance_nodes) {
    if (nodes.empty() || !std::is_sorted(nodes.begin(), nodes.end())) {
      return false;
    }
    for (NodeIndex node : nodes) {
      const auto& holders = state.nodes[node].holders;
      if (std::find(holders.begin(), holders.end(), instance) == holders.end()) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool Snapshot::CheckInvariants() const {
  return NodeRecordsConsistent(*state_) && AggregatesConsistent(*state_) &&
         FrontTreeConsistent(*state_);
}

}  // namespace sv::scheduler
