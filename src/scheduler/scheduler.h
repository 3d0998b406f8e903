// Public interface of the sv scheduler: pure placement logic over an
// in-memory snapshot of the fleet. Nothing here does I/O; the server builds a
// Snapshot from the database, asks for decisions, and persists them itself.
//
// Typical use by svd's scheduling loop:
//   auto snapshot = Snapshot::Build(node_specs);          // from PostgreSQL
//   Scheduler scheduler(SchedulerOptions{});
//   QueuePassResult pass = scheduler.RunQueuePass(*snapshot, pending, queue);
//   // persist pass.decisions (placements and wait reasons) in one transaction.
#ifndef SV_SCHEDULER_SCHEDULER_H_
#define SV_SCHEDULER_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sv::scheduler {

inline constexpr int kGpusPerNode = 8;
inline constexpr int kGpusPerGroup = 4;  // one PCIe/NUMA half of a node
inline constexpr int kGpuCountMax = 128;
inline constexpr int kGangNodeCountMax = kGpuCountMax / kGpusPerNode;
inline constexpr int kNodeCountMax = 65536;
inline constexpr int kNameLengthMax = 256;

// Instances are identified by a positive integer chosen by the server (its
// database key). kNoInstance marks a free GPU.
using InstanceId = int64_t;
inline constexpr InstanceId kNoInstance = 0;

using NodeIndex = int32_t;
// Bit i set means GPU i. GPUs 0-3 form group 0 and GPUs 4-7 form group 1.
using GpuMask = uint8_t;
inline constexpr GpuMask kAllGpus = 0xFF;

enum class NodeState { kReady, kCordoned, kDraining, kDown };
absl::string_view NodeStateName(NodeState state);

// Plain input row, one per node, as the server reads it from the database.
struct NodeSpec {
  std::string name;
  std::string zone;
  std::string pod;
  std::string leaf;
  NodeState state = NodeState::kReady;
  std::array<InstanceId, kGpusPerNode> gpu_holders{};  // kNoInstance = free
};

struct NodeInfo {
  absl::string_view name;
  absl::string_view zone;
  absl::string_view pod;
  absl::string_view leaf;
  NodeState state;
  GpuMask free_gpus;
  int32_t leaf_index;
  int32_t pod_index;
};

struct NodeAssignment {
  NodeIndex node = -1;
  GpuMask gpus = 0;
  friend bool operator==(const NodeAssignment&, const NodeAssignment&) = default;
};

struct Placement {
  InstanceId instance = kNoInstance;
  std::vector<NodeAssignment> nodes;
  int leaf_count = 0;
  int gpu_count() const;
};

// 1-8 GPUs go on one node; 16-128 GPUs (multiples of 8) are a gang of whole
// nodes. max_leaves limits how many leaf switches a gang may span (0: none).
// pinned_node (1-8 GPUs only) allows that one node and no other: the
// instance's node-local volumes live there.
struct Request {
  InstanceId instance = kNoInstance;
  int gpu_count = 0;
  int max_leaves = 0;
  NodeIndex pinned_node = -1;
};
absl::Status ValidateRequest(const Request& request);

namespace internal {
class SnapshotState;
}

// The fleet at one instant, with indexes for fast search. Copyable, so that
// "what-if" runs can work on a copy.
class Snapshot {
 public:
  // Fails with InvalidArgument on malformed input (bad names, a leaf in two
  // pods, too many nodes); never asserts on it.
  static absl::StatusOr<Snapshot> Build(std::span<const NodeSpec> nodes);

  Snapshot(const Snapshot& other);
  Snapshot& operator=(const Snapshot& other);
  Snapshot(Snapshot&&) noexcept;
  Snapshot& operator=(Snapshot&&) noexcept;
  ~Snapshot();

  int node_count() const;
  NodeInfo node(NodeIndex index) const;
  absl::StatusOr<NodeIndex> FindNode(absl::string_view name) const;
  InstanceId gpu_holder(NodeIndex index, int gpu) const;
  int free_gpu_count() const;      // free GPUs on ready nodes
  int ready_gpu_count() const;     // all GPUs on ready nodes
  int leaf_count() const;
  // Nodes and GPUs an instance holds, in node order; empty when unknown.
  std::vector<NodeAssignment> InstanceNodes(InstanceId instance) const;
  std::vector<InstanceId> Instances() const;

  // Marks the placement's GPUs as held. FailedPrecondition if any GPU is
  // already held or a node is not ready; nothing changes then.
  absl::Status Reserve(const Placement& placement);
  // Frees every GPU the instance holds. Idempotent.
  void Release(InstanceId instance);
  // Frees only the listed GPUs if they are held by the instance. Idempotent.
  void ReleasePart(InstanceId instance, std::span<const NodeAssignment> part);
  void SetNodeState(NodeIndex index, NodeState state);

  // Recomputes every index from scratch and compares (tests, debug checks).
  bool CheckInvariants() const;

  const internal::SnapshotState& state() const { return *state_; }
  internal::SnapshotState& mutable_state() { return *state_; }

 private:
  Snapshot();
  std::unique_ptr<internal::SnapshotState> state_;
};

// Placement policies. kDefault is ours; the others are the baselines the
// replay benchmark compares against, built from the same plugins.
enum class Policy {
  kDefault,       // front-first packing in topology order, NUMA-group fit, tree gangs
  kFirstFit,      // lowest-index node that fits; gangs by node index
  kBestFit,       // fewest free GPUs that still fit; gangs by node index
  kSpread,        // Kubernetes LeastAllocated; gangs by node index
  kRandom,        // uniform over nodes that fit (seeded)
  kTopologyTree,  // best fit per node, gangs as Slurm's topology/tree
};
absl::string_view PolicyName(Policy policy);

struct SchedulerOptions {
  Policy policy = Policy::kDefault;
  // Reserved: the current policies no longer cap their candidates (ours
  // yields one node, the baselines a whole bucket). Kept for callers.
  int candidates_max = 32;
  uint64_t seed = 1;
};

// Queue input: one row per PENDING instance.
struct PendingRequest {
  Request request;
  std::string tenant;
  int priority = 0;      // higher first
  int64_t sequence = 0;  // FIFO key within a priority, e.g. submit order
};

struct TenantQuota {
  int gpus_in_use_max = 1024;
  int pending_count_max = 100;
};

struct QueueOptions {
  TenantQuota default_quota;
  std::map<std::string, TenantQuota> tenant_quotas;
  std::map<std::string, int> tenant_gpus_in_use;  // from the database
  // Hold nodes for the oldest blocked request so that backfill cannot
  // starve it. false: strict order, nothing passes a blocked request.
  bool backfill = true;
  bool explain = true;  // build reason strings (the replay turns it off)
  int pending_items_max = 100000;
  int placements_per_pass_max = 10000;
};

enum class WaitCause {
  kNone,           // placed
  kNoCapacity,     // nothing fits now
  kHeldForOlder,   // strict order: an older request is blocked
  kQuota,          // the tenant's GPU quota would be exceeded
  kPassLimit,      // beyond this pass's limits; retried next pass
  kInvalid,        // request fails validation
};
absl::string_view WaitCauseName(WaitCause cause);

struct QueueDecision {
  InstanceId instance = kNoInstance;
  bool placed = false;
  Placement placement;
  int position = 0;  // 1-based rank among waiting requests; 0 when placed
  WaitCause cause = WaitCause::kNone;
  std::string reason;
};

struct QueuePassResult {
  std::vector<QueueDecision> decisions;  // in queue order
  int placed_count = 0;
  InstanceId held_for = kNoInstance;  // the request nodes are held for
  std::vector<NodeIndex> held_nodes;
};

struct ResizeResult {
  Placement placement;                 // the whole instance after resize
  std::vector<NodeAssignment> added;
  std::vector<NodeAssignment> removed;
};

// One instance that Scheduler::EmptyNodes moved to make room: the GPUs it
// held, and where it holds GPUs now (always one node, never the one it left).
struct Move {
  InstanceId instance = kNoInstance;
  std::vector<NodeAssignment> from;
  Placement to;
};

struct EmptyNodesOptions {
  // Stop once the fleet has this many ready nodes with every GPU free.
  int nodes_wanted = 0;
  // Which instances may be moved. A node is emptied only when every
  // instance on it may move and holds fewer than 8 GPUs; others are never
  // touched. Empty: nothing moves.
  std::function<bool(InstanceId)> movable;
  // At most this many instances move in one call; a node whose instances
  // would pass the limit is left as it was.
  int moves_max = 64;
};

struct DrainReport {
  NodeIndex node = -1;
  std::vector<InstanceId> instances_to_move;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Finds a placement without changing the snapshot. InvalidArgument for a
  // bad request; ResourceExhausted, with the explanation, when nothing fits.
  absl::StatusOr<Placement> Find(const Snapshot& snapshot,
                                 const Request& request);
  // Find, then Reserve through the reserve plugins.
  absl::StatusOr<Placement> Place(Snapshot& snapshot, const Request& request);
  // Human-readable reason why the request does not fit now, with the
  // number of nodes each filter rejected.
  std::string Explain(const Snapshot& snapshot, const Request& request) const;

  // Grows or shrinks a whole-node instance (8, 16, ... 128 GPUs) in place,
  // keeping its id; growth prefers the instance's own leaves, then pods.
  // A gang placed with a limit on its leaf switches (max_leaves > 0) stays
  // within it: when the nearest free nodes would pass it, the leaves with
  // the most free nodes are taken instead, and if those pass it too the
  // resize fails (ResourceExhausted) and nothing changes.
  absl::StatusOr<ResizeResult> Resize(Snapshot& snapshot, InstanceId instance,
                                      int new_gpu_count, int max_leaves = 0);
  void Cordon(Snapshot& snapshot, NodeIndex node);
  // Empties ready nodes by moving movable small instances elsewhere, for a
  // waiting request that needs whole nodes. Nodes are tried least used
  // first (ties: lowest index), each at most once: its instances are placed
  // again by this scheduler's policy with the node cordoned, and if any of
  // them does not fit, every one goes back where it was and the node is
  // left alone. The moves stay reserved in the snapshot and are returned
  // in the order they were made; nothing else changes.
  std::vector<Move> EmptyNodes(Snapshot& snapshot, const EmptyNodesOptions& options);
  DrainReport Drain(Snapshot& snapshot, NodeIndex node);

  // One pass of the queue: orders pending requests by priority then
  // sequence, places what fits (reserving in the snapshot), and explains
  // the rest with their position.
  QueuePassResult RunQueuePass(Snapshot& snapshot,
                               std::span<const PendingRequest> pending,
                               const QueueOptions& options);

  const SchedulerOptions& options() const { return options_; }

  struct Plugins;  // opaque; defined in scheduler.cc

 private:
  // Runs every reserve plugin; on failure unreserves all and changes nothing.
  absl::Status ReserveAll(Snapshot& snapshot, const Placement& placement);

  SchedulerOptions options_;
  std::unique_ptr<Plugins> plugins_;
  uint64_t rng_state_;
};

// Admission check at create time: ResourceExhausted when the tenant already
// has pending_count_max requests waiting.
absl::Status CheckPendingQuota(const QueueOptions& options,
                               absl::string_view tenant, int pending_count);

}  // namespace sv::scheduler

#endif  // SV_SCHEDULER_SCHEDULER_H_
