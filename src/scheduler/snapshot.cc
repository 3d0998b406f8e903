// Snapshot: building it from plain rows and keeping its indexes in step.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler {
namespace internal {
namespace {

// Swap-remove from an unordered list whose members remember their position.
template <typename PositionOf>
void ListErase(std::vector<NodeIndex>& list, NodeIndex node, int32_t position,
               PositionOf position_of) {
  assert(position >= 0 && position < static_cast<int32_t>(list.size()));
  assert(list[position] == node);
  NodeIndex last = list.back();
  list[position] = last;
  position_of(last) = position;
  list.pop_back();
}

}  // namespace

void SnapshotState::Detach(NodeIndex node) {
  NodeRecord& record = nodes[node];
  if (record.bucket_position < 0) return;
  std::vector<NodeIndex>& bucket = buckets[GpuCount(record.free)];
  ListErase(bucket, node, record.bucket_position,
            [this](NodeIndex n) -> int32_t& { return nodes[n].bucket_position; });
  record.bucket_position = -1;
  SetFrontValue(node, 0);
  free_gpu_count -= GpuCount(record.free);
  ready_gpu_count -= kGpusPerNode;
  if (record.leaf_free_position < 0) return;
  LeafRecord& leaf = leaves[record.leaf];
  int before = static_cast<int>(leaf.whole_free.size());
  ListErase(leaf.whole_free, node, record.leaf_free_position,
            [this](NodeIndex n) -> int32_t& {
              return nodes[n].leaf_free_position;
            });
  record.leaf_free_position = -1;
  leaves_by_whole_free.erase({before, record.leaf});
  leaves_by_whole_free.insert({before - 1, record.leaf});
  PodRecord& pod = pods[leaf.pod];
  pods_by_whole_free.erase({pod.whole_free_count, leaf.pod});
  pod.whole_free_count--;
  pods_by_whole_free.insert({pod.whole_free_count, leaf.pod});
  zones[pod.zone].whole_free_count--;
}

void SnapshotState::Attach(NodeIndex node) {
  NodeRecord& record = nodes[node];
  assert(record.bucket_position < 0 && record.leaf_free_position < 0);
  if (!Schedulable(node)) return;
  std::vector<NodeIndex>& bucket = buckets[GpuCount(record.free)];
  record.bucket_position = static_cast<int32_t>(bucket.size());
  bucket.push_back(node);
  SetFrontValue(node, GpuCount(record.free));
  free_gpu_count += GpuCount(record.free);
  ready_gpu_count += kGpusPerNode;
  if (record.free != kAllGpus) return;
  LeafRecord& leaf = leaves[record.leaf];
  int before = static_cast<int>(leaf.whole_free.size());
  record.leaf_free_position = before;
  leaf.whole_free.push_back(node);
  leaves_by_whole_free.erase({before, record.leaf});
  leaves_by_whole_free.insert({before + 1, record.leaf});
  PodRecord& pod = pods[leaf.pod];
  pods_by_whole_free.erase({pod.whole_free_count, leaf.pod});
  pod.whole_free_count++;
  pods_by_whole_free.insert({pod.whole_free_count, leaf.pod});
  zones[pod.zone].whole_free_count++;
}

void SnapshotState::SetFrontValue(NodeIndex node, int free) {
  size_t at = static_cast<size_t>(front_leaves + front_rank[node]);
  front_tree[at] = static_cast<uint8_t>(free);
  for (at /= 2; at >= 1; at /= 2) {
    uint8_t value = std::max(front_tree[2 * at], front_tree[2 * at + 1]);
    if (front_tree[at] == value) break;
    front_tree[at] = value;
  }
}

NodeIndex SnapshotState::FirstFitInTopologyOrder(int gpu_count) const {
  if (front_tree[1] < gpu_count) return -1;
  size_t at = 1;
  while (at < static_cast<size_t>(front_leaves)) {
    at = front_tree[2 * at] >= gpu_count ? 2 * at : 2 * at + 1;
  }
  return front_order[at - static_cast<size_t>(front_leaves)];
}

void SnapshotState::AddInstanceNode(InstanceId instance, NodeIndex node) {
  std::vector<NodeIndex>& list = instance_nodes[instance];
  auto it = std::lower_bound(list.begin(), list.end(), node);
  if (it == list.end() || *it != node) list.insert(it, node);
}

void SnapshotState::RemoveInstanceNode(InstanceId instance, NodeIndex node) {
  auto found = instance_nodes.find(instance);
  if (found == instance_nodes.end()) return;
  std::vector<NodeIndex>& list = found->second;
  auto it = std::lower_bound(list.begin(), list.end(), node);
  if (it != list.end() && *it == node) list.erase(it);
  if (list.empty()) instance_nodes.erase(found);
}

void SnapshotState::Hold(NodeIndex node, InstanceId instance, GpuMask gpus) {
  NodeRecord& record = nodes[node];
  assert(instance != kNoInstance);
  assert((record.free & gpus) == gpus);
  Detach(node);
  record.free &= static_cast<GpuMask>(~gpus);
  for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
    if (gpus & (1u << gpu)) record.holders[gpu] = instance;
  }
  Attach(node);
  AddInstanceNode(instance, node);
}

void SnapshotState::Unhold(NodeIndex node, InstanceId instance, GpuMask gpus) {
  NodeRecord& record = nodes[node];
  Detach(node);
  bool still_holds = false;
  for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
    if (record.holders[gpu] != instance) continue;
    if (gpus & (1u << gpu)) {
      record.holders[gpu] = kNoInstance;
      record.free |= static_cast<GpuMask>(1u << gpu);
    } else {
      still_holds = true;
    }
  }
  Attach(node);
  if (!still_holds) RemoveInstanceNode(instance, node);
}

void SnapshotState::SetState(NodeIndex node, NodeState state) {
  Detach(node);
  node_count_by_state[static_cast<int>(nodes[node].state)]--;
  nodes[node].state = state;
  node_count_by_state[static_cast<int>(state)]++;
  Attach(node);
}

void SnapshotState::SetHeld(NodeIndex node, bool held) {
  if (nodes[node].held == held) return;
  Detach(node);
  nodes[node].held = held;
  held_node_count += held ? 1 : -1;
  Attach(node);
}

namespace {

// Interns topology names into dense indexes and checks that the tree is a
// tree: a leaf belongs to one pod, a pod to one zone.
class TopologyBuilder {
 public:
  explicit TopologyBuilder(SnapshotState& state) : state_(state) {}

  absl::StatusOr<int32_t> Leaf(const NodeSpec& spec) {
    auto zone = Intern(zone_ids_, spec.zone);
    int32_t pod_key = Intern(pod_ids_, spec.pod);
    if (pod_key == static_cast<int32_t>(state_.pods.size())) {
      state_.pods.push_back(PodRecord{spec.pod, zone, {}, 0});
      if (zone == static_cast<int32_t>(state_.zones.size())) {
        state_.zones.push_back(ZoneRecord{spec.zone, {}, 0});
      }
      state_.zones[zone].pods.push_back(pod_key);
    } else if (state_.pods[pod_key].zone != zone) {
      return absl::InvalidArgumentError(
          absl::StrCat("pod '", spec.pod, "' appears in two zones"));
    }
    int32_t leaf = Intern(leaf_ids_, spec.leaf);
    if (leaf == static_cast<int32_t>(state_.leaves.size())) {
      state_.leaves.push_back(LeafRecord{spec.leaf, pod_key, {}, {}});
      state_.pods[pod_key].leaves.push_back(leaf);
    } else if (state_.leaves[leaf].pod != pod_key) {
      return absl::InvalidArgumentError(
          absl::StrCat("leaf '", spec.leaf, "' appears in two pods"));
    }
    return leaf;
  }

 private:
  static int32_t Intern(absl::flat_hash_map<std::string, int32_t>& ids,
                        const std::string& name) {
    auto [it, inserted] =
        ids.try_emplace(name, static_cast<int32_t>(ids.size()));
    return it->second;
  }
  // Zones are interned in the same order as they are appended, because a
  // new zone is only ever seen together with a new pod.
  SnapshotState& state_;
  absl::flat_hash_map<std::string, int32_t> zone_ids_, pod_ids_, leaf_ids_;
};

absl::Status ValidateSpec(const NodeSpec& spec) {
  for (const std::string* name : {&spec.name, &spec.zone, &spec.pod, &spec.leaf}) {
    if (name->empty() || name->size() > kNameLengthMax) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", spec.name, "': empty or overlong name"));
    }
  }
  for (InstanceId holder : spec.gpu_holders) {
    if (holder < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", spec.name, "': negative instance id"));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace internal

using internal::GpuCount;
using internal::SnapshotState;

Snapshot::Snapshot() : state_(std::make_unique<SnapshotState>()) {}
Snapshot::Snapshot(const Snapshot& other)
    : state_(std::make_unique<SnapshotState>(*other.state_)) {}
Snapshot& Snapshot::operator=(const Snapshot& other) {
  if (this != &other) state_ = std::make_unique<SnapshotState>(*other.state_);
  return *this;
}
Snapshot::Snapshot(Snapshot&&) noexcept = default;
Snapshot& Snapshot::operator=(Snapshot&&) noexcept = default;
Snapshot::~Snapshot() = default;

absl::StatusOr<Snapshot> Snapshot::Build(std::span<const NodeSpec> specs) {
  if (specs.size() > static_cast<size_t>(kNodeCountMax)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet of ", specs.size(), " nodes exceeds ",
                     kNodeCountMax));
  }
  Snapshot snapshot;
  SnapshotState& state = *snapshot.state_;
  internal::TopologyBuilder topology(state);
  absl::flat_hash_map<std::string, NodeIndex> names;
  state.nodes.reserve(specs.size());
  for (const NodeSpec& spec : specs) {
    if (absl::Status status = internal::ValidateSpec(spec); !status.ok()) {
      return status;
    }
    if (!names.try_emplace(spec.name, state.nodes.size()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", spec.name, "' appears twice"));
    }
    absl::StatusOr<int32_t> leaf = topology.Leaf(spec);
    if (!leaf.ok()) return leaf.status();
    internal::NodeRecord record;
    record.name = spec.name;
    record.leaf = *leaf;
    record.state = spec.state;
    record.holders = spec.gpu_holders;
    record.free = 0;
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
      if (spec.gpu_holders[gpu] == kNoInstance) {
        record.free |= static_cast<GpuMask>(1u << gpu);
      }
    }
    state.nodes.push_back(std::move(record));
  }
  for (int32_t pod = 0; pod < static_cast<int32_t>(state.pods.size()); ++pod) {
    state.pods_by_whole_free.insert({0, pod});
  }
  for (int32_t leaf = 0; leaf < static_cast<int32_t>(state.leaves.size());
       ++leaf) {
    state.leaves_by_whole_free.insert({0, leaf});
  }
  for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size());
       ++node) {
    state.leaves[state.nodes[node].leaf].nodes.push_back(node);
  }
  // Topology order: zones, their pods and their leaves in order of first
  // appearance, each leaf's nodes in input order.
  for (const internal::ZoneRecord& zone : state.zones) {
    for (int32_t pod : zone.pods) {
      for (int32_t leaf : state.pods[pod].leaves) {
        for (NodeIndex node : state.leaves[leaf].nodes) {
          state.front_order.push_back(node);
        }
      }
    }
  }
  assert(state.front_order.size() == state.nodes.size());
  state.front_rank.assign(state.nodes.size(), 0);
  for (size_t rank = 0; rank < state.front_order.size(); ++rank) {
    state.front_rank[state.front_order[rank]] = static_cast<int32_t>(rank);
  }
  while (state.front_leaves < static_cast<int32_t>(state.nodes.size())) {
    state.front_leaves *= 2;
  }
  state.front_tree.assign(2 * static_cast<size_t>(state.front_leaves), 0);
  for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size());
       ++node) {
    internal::NodeRecord& record = state.nodes[node];
    state.node_count_by_state[static_cast<int>(record.state)]++;
    for (InstanceId holder : record.holders) {
      if (holder != kNoInstance) state.AddInstanceNode(holder, node);
    }
    state.Attach(node);
  }
  return snapshot;
}

int Snapshot::node_count() const {
  return static_cast<int>(state_->nodes.size());
}

NodeInfo Snapshot::node(NodeIndex index) const {
  assert(index >= 0 && index < node_count());
  const internal::NodeRecord& record = state_->nodes[index];
  const internal::LeafRecord& leaf = state_->leaves[record.leaf];
  const internal::PodRecord& pod = state_->pods[leaf.pod];
  return NodeInfo{record.name, state_->zones[pod.zone].name, pod.name,
                  leaf.name,   record.state, record.free,
                  record.leaf, leaf.pod};
}

absl::StatusOr<NodeIndex> Snapshot::FindNode(absl::string_view name) const {
  for (NodeIndex node = 0; node < node_count(); ++node) {
    if (state_->nodes[node].name == name) return node;
  }
  return absl::NotFoundError(absl::StrCat("no node named '", name, "'"));
}

InstanceId Snapshot::gpu_holder(NodeIndex index, int gpu) const {
  assert(index >= 0 && index < node_count());
  assert(gpu >= 0 && gpu < kGpusPerNode);
  return state_->nodes[index].holders[gpu];
}

int Snapshot::free_gpu_count() const { return state_->free_gpu_count; }
int Snapshot::ready_gpu_count() const { return state_->ready_gpu_count; }
int Snapshot::leaf_count() const {
  return static_cast<int>(state_->leaves.size());
}

std::vector<NodeAssignment> Snapshot::InstanceNodes(InstanceId instance) const {
  std::vector<NodeAssignment> result;
  auto found = state_->instance_nodes.find(instance);
  if (found == state_->instance_nodes.end()) return result;
  for (NodeIndex node : found->second) {
    GpuMask mask = 0;
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
      if (state_->nodes[node].holders[gpu] == instance) {
        mask |= static_cast<GpuMask>(1u << gpu);
      }
    }
    result.push_back({node, mask});
  }
  return result;
}

std::vector<InstanceId> Snapshot::Instances() const {
  std::vector<InstanceId> result;
  result.reserve(state_->instance_nodes.size());
  for (const auto& [instance, nodes] : state_->instance_nodes) {
    result.push_back(instance);
  }
  std::sort(result.begin(), result.end());
  return result;
}

absl::Status Snapshot::Reserve(const Placement& placement) {
  if (placement.instance <= kNoInstance) {
    return absl::InvalidArgumentError("placement has no instance id");
  }
  // Check everything first so that a failed reserve changes nothing.
  for (size_t i = 0; i < placement.nodes.size(); ++i) {
    const NodeAssignment& part = placement.nodes[i];
    if (part.node < 0 || part.node >= node_count() || part.gpus == 0) {
      return absl::InvalidArgumentError("placement names a bad node or no GPUs");
    }
    for (size_t j = 0; j < i; ++j) {
      if (placement.nodes[j].node == part.node) {
        return absl::InvalidArgumentError("placement names a node twice");
      }
    }
    const internal::NodeRecord& record = state_->nodes[part.node];
    if (!state_->Schedulable(part.node) &&
        !(record.state == NodeState::kReady && record.held)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", record.name, " is ", NodeStateName(record.state)));
    }
    if ((record.free & part.gpus) != part.gpus) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GPUs on node ", record.name, " are already reserved"));
    }
  }
  for (const NodeAssignment& part : placement.nodes) {
    state_->Hold(part.node, placement.instance, part.gpus);
  }
  return absl::OkStatus();
}

void Snapshot::Release(InstanceId instance) {
  std::vector<NodeAssignment> parts = InstanceNodes(instance);
  ReleasePart(instance, parts);
}

void Snapshot::ReleasePart(InstanceId instance,
                           std::span<const NodeAssignment> parts) {
  for (const NodeAssignment& part : parts) {
    if (part.node < 0 || part.node >= node_count()) continue;
    state_->Unhold(part.node, instance, part.gpus);
  }
}

void Snapshot::SetNodeState(NodeIndex index, NodeState state) {
  assert(index >= 0 && index < node_count());
  state_->SetState(index, state);
}

}  // namespace sv::scheduler
