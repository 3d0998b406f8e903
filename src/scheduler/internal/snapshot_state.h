// Private: the data and indexes behind Snapshot. Only src/scheduler and its
// tests include this.
#ifndef SV_SCHEDULER_INTERNAL_SNAPSHOT_STATE_H_
#define SV_SCHEDULER_INTERNAL_SNAPSHOT_STATE_H_

#include <array>
#include <bit>
#include <cassert>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler::internal {

inline int GpuCount(GpuMask mask) { return std::popcount(mask); }
inline constexpr GpuMask kGroupMask[2] = {0x0F, 0xF0};

struct NodeRecord {
  std::string name;
  int32_t leaf = -1;
  NodeState state = NodeState::kReady;
  bool held = false;  // set during a queue pass: kept for an older request
  GpuMask free = kAllGpus;
  std::array<InstanceId, kGpusPerNode> holders{};
  int32_t bucket_position = -1;      // in buckets[free count], if indexed
  int32_t leaf_free_position = -1;   // in its leaf's whole_free, if indexed
};

struct LeafRecord {
  std::string name;
  int32_t pod = -1;
  std::vector<NodeIndex> nodes;
  std::vector<NodeIndex> whole_free;  // schedulable nodes with 8 free GPUs
};

struct PodRecord {
  std::string name;
  int32_t zone = -1;
  std::vector<int32_t> leaves;
  int whole_free_count = 0;
};

struct ZoneRecord {
  std::string name;
  std::vector<int32_t> pods;
  int whole_free_count = 0;
};

// Invariant: a node is "schedulable" when Ready and not held; exactly the
// schedulable nodes appear in buckets[popcount(free)], and the schedulable
// nodes with all GPUs free appear in their leaf's whole_free list.
class SnapshotState {
 public:
  std::vector<NodeRecord> nodes;
  std::vector<LeafRecord> leaves;
  std::vector<PodRecord> pods;
  std::vector<ZoneRecord> zones;
  std::array<std::vector<NodeIndex>, kGpusPerNode + 1> buckets;
  // (whole free nodes, leaf) and (whole free nodes, pod), for best fit.
  std::set<std::pair<int, int32_t>> leaves_by_whole_free;
  std::set<std::pair<int, int32_t>> pods_by_whole_free;
  absl::flat_hash_map<InstanceId, std::vector<NodeIndex>> instance_nodes;
  std::array<int, 4> node_count_by_state{};
  // Topology order ("front first"): nodes ranked leaf by leaf (leaves in
  // pod order, pods in zone order), and a max-tree over that order holding
  // each schedulable node's free GPU count (0 otherwise), so the first node
  // in topology order with at least k free GPUs is found in O(log n).
  std::vector<int32_t> front_rank;       // node -> position
  std::vector<NodeIndex> front_order;    // position -> node
  std::vector<uint8_t> front_tree;       // heap layout, leaves at front_leaves
  int32_t front_leaves = 1;
  int held_node_count = 0;
  int free_gpu_count = 0;   // on schedulable nodes
  int ready_gpu_count = 0;

  bool Schedulable(NodeIndex node) const {
    const NodeRecord& record = nodes[node];
    return record.state == NodeState::kReady && !record.held;
  }
  int32_t PodOf(NodeIndex node) const { return leaves[nodes[node].leaf].pod; }
  int32_t ZoneOf(NodeIndex node) const { return pods[PodOf(node)].zone; }
  int LeafWholeFree(int32_t leaf) const {
    return static_cast<int>(leaves[leaf].whole_free.size());
  }

  // First schedulable node in topology order with at least gpu_count free
  // GPUs, or -1.
  NodeIndex FirstFitInTopologyOrder(int gpu_count) const;
  void SetFrontValue(NodeIndex node, int free);

  // Every mutation goes through Detach, change, Attach so that the indexes
  // never drift from the node records.
  void Detach(NodeIndex node);
  void Attach(NodeIndex node);
  void Hold(NodeIndex node, InstanceId instance, GpuMask gpus);
  void Unhold(NodeIndex node, InstanceId instance, GpuMask gpus);
  void SetState(NodeIndex node, NodeState state);
  void SetHeld(NodeIndex node, bool held);
  void AddInstanceNode(InstanceId instance, NodeIndex node);
  void RemoveInstanceNode(InstanceId instance, NodeIndex node);
};

}  // namespace sv::scheduler::internal

#endif  // SV_SCHEDULER_INTERNAL_SNAPSHOT_STATE_H_
