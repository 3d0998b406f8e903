#ifndef SV_STORE_SCHEDULING_STORE_H_
#define SV_STORE_SCHEDULING_STORE_H_

// PostgreSQL side of scheduling: what a queue pass reads (the whole fleet,
// the reservations and the queue) and how its decisions are written, resize,
// node cordon/drain and tenant quotas. The decisions themselves come from a
// caller-supplied function (src/control wraps sv_scheduler), so this file
// holds SQL only. Every method is one transaction; times come from the
// caller.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"
#include "store/store.h"
#include "store/store.h"

namespace sv::store {

// ---- What a pass sees -------------------------------------------------------

struct FleetNodeRow {
  std::string id;
  std::string name;
  std::string zone;
  std::string pod;
  std::string leaf_switch;
  int gpu_count = 8;
  NodeState state = NodeState::kReady;
};

struct ReservationRow {
  std::string node_id;
  int gpu_index = 0;
  std::string instance_id;
  std::string tenant_id;
};

struct PendingRow {
  std::string id;
  std::string tenant_id;
  int gpu_count = 0;
  int max_leaves = 0;
  int priority = 0;
  int64_t queue_seq = 0;
  // The node of its node-local volumes; empty when it has none.
  std::string pinned_node_id;
  // The reason and position the row holds now, so a pass writes only the
  // waiting rows whose verdict changed.
  std::string state_reason;
  int queue_position = 0;
  // Not to be placed yet, and why: a volume it writes may still be mounted
  // on a node it left (migration 0124). Empty: it may be placed.
  std::string held_reason;
};

struct TenantQuotaRow {
  std::string tenant_id;
  int gpus_in_use_max = 0;
  int pending_count_max = 0;
  int instances_max = 0;  // 0: the default (tenant_quotas.instances_max NULL).
};

// Nodes of every state (ordered by name), every GPU reservation, the queue
// (priority, then queue_seq) and the tenants' quota rows.
struct FleetView {
  std::vector<FleetNodeRow> nodes;
  std::vector<ReservationRow> reservations;
  std::vector<PendingRow> pending;
  std::map<std::string, TenantQuotaRow> quotas;
  // RUNNING instances that may be moved now (docs/scheduler.md, "Moving
  // instances"): movable, fewer than 8 GPUs, RUNNING for at least the
  // pass's settle time, no volume attached, no port bound. Read only by
  // queue passes that may move instances and whose queue holds a request
  // of 8 GPUs or more; empty otherwise.
  std::vector<std::string> movable;
};

// ---- What a pass decides ------------------------------------------------------

struct GpuGrant {
  std::string node_id;
  std::vector<int> gpu_indices;
};

// A placed instance has grants; a waiting one has none and a position. A
// moved instance (a RUNNING one of view.movable) has grants and the GPUs it
// leaves in moved_from; its reason says why it moved ("to free ...", after
// "moved from X to Y ").
struct QueueVerdict {
  std::string instance_id;
  std::vector<GpuGrant> grants;
  int queue_position = 0;
  std::string reason;
  std::vector<GpuGrant> moved_from;
};

struct ResizeVerdict {
  std::vector<GpuGrant> added;
  std::vector<GpuGrant> removed;
};

using QueueDecider =
    std::function<absl::StatusOr<std::vector<QueueVerdict>>(const FleetView&)>;
// Arguments: the fleet, the instance, its tenant, the new GPU count, the
// instance's limit on leaf switches (0: none).
using ResizeDecider = std::function<absl::StatusOr<ResizeVerdict>(
    const FleetView&, const std::string&, const std::string&, int, int)>;
// Runs after every decision of a pass is written, right before the commit.
// Tests use it to crash there; in production it is empty.
using BeforeCommitHook = std::function<void()>;

struct PassOutcome {
  int placed = 0;
  int waiting = 0;
  int moved = 0;  // RUNNING instances moved to make room
  // Another pass held the placement lock and this one did not wait
  // (RunQueuePass with wait_for_lock = false); nothing was read or written.
  bool lock_busy = false;
};

// ---- Operator views ------------------------------------------------------------

struct NodeUsage {
  NodeRecord node;
  int free_gpu_count = 0;  // GPUs without a reservation (any node state)
  int instance_count = 0;  // instances holding GPUs on the node
  // A down node: the state it returns to when its agent registers again.
  NodeState state_when_back = NodeState::kReady;
};

struct InstanceOnNode {
  std::string instance_id;
  std::string tenant_id;
  std::string state;
  int gpu_count = 0;
};

struct DrainOutcome {
  NodeUsage node;
  std::vector<InstanceOnNode> instances_to_move;
};

enum class NodeAction { kCordon, kUncordon, kDrain };

// What admission control needs to know about a create.
struct AdmissionView {
  bool request_seen = false;  // a retry of a create that already exists
  int pending_count = 0;
  std::optional<TenantQuotaRow> quota;
};

// Takes the cluster-wide placement lock for the transaction: queue passes,
// resizes, node state changes and a node's death hold it, so none of them
// commits on a view of nodes another is changing.
void TakePlacementLock(pqxx::work& txn);

class SchedulingStore {
 public:
  explicit SchedulingStore(Database& db) : db_(db) {}

  // One queue pass under the cluster-wide placement lock: reads the fleet
  // and at most `queue_max` pending instances, asks `decide`, and writes
  // every verdict in the same transaction. A GPU reserved twice violates
  // the gpu_reservations primary key and rolls the whole pass back.
  // With `movable_running_min` set, a queue that holds a request of 8 GPUs
  // or more also reads view.movable (instances RUNNING for at least that
  // long). Moves are written first; a moved instance that is no longer
  // RUNNING and movable, or whose row another transaction holds, aborts the
  // pass (retried from its read), so a move never acts on a stale view.
  absl::StatusOr<PassOutcome> RunQueuePass(
      const QueueDecider& decide, int queue_max, absl::Time now,
      const BeforeCommitHook& before_commit = {}, bool wait_for_lock = true,
      std::optional<absl::Duration> movable_running_min = std::nullopt);

  // Resizes a RUNNING instance of the tenant in place (same id, same
  // running_since), under the placement lock. `decide` sees the queue too
  // (at most `queue_max`), so growth can leave the queue its due. Returns
  // the old GPU count. Growth is held to `gate` (the create's credit gate
  // for the added GPUs, with the rent of the tenant's unfinished instances,
  // and the monthly spend cap) under the tenant's lock, as a start is
  // (Store::StartInstance); a refusal writes nothing and goes to `refusal`.
  absl::StatusOr<int> ResizeInstance(const std::string& tenant_id, const std::string& id,
                                     int new_gpu_count, int queue_max,
                                     const ResizeDecider& decide, absl::Time now,
                                     const CreateGate& gate = {},
                                     std::optional<CreateRefusal>* refusal = nullptr);

  // Queue positions of the tenant's PENDING instances among `ids`.
  absl::StatusOr<std::map<std::string, int>> QueuePositions(
      const std::string& tenant_id, const std::vector<std::string>& ids);

  absl::StatusOr<AdmissionView> LoadAdmission(const std::string& tenant_id,
                                              const std::string& request_id);

  // Operators: nodes ordered by name after `after_name`, at most `limit`.
  absl::StatusOr<std::vector<NodeUsage>> ListNodes(const std::string& after_name,
                                                   int limit);
  // Cordon: ready -> cordoned. Uncordon: cordoned/draining -> ready.
  // Drain: ready/cordoned -> draining, and lists what must move. A DOWN node
  // stays down (that is the heartbeat's); the action sets the state it
  // returns to when its agent registers again (state_when_back).
  absl::StatusOr<DrainOutcome> ChangeNode(const std::string& name, NodeAction action);
  // A down node only (FAILED_PRECONDITION / NODE_NOT_DOWN): ends its fences
  // on every volume attachment (migration 0124), as a heartbeat of its
  // agent listing nothing would. `released` is how many it ended.
  absl::StatusOr<NodeUsage> ForgetNodeMounts(const std::string& name, absl::Time now,
                                             int* released);

  // Operators only (the API checks): any tenant's instance that is not
  // DELETED or FAILED. Returns the instance's tenant and state.
  absl::StatusOr<InstanceOnNode> SetInstancePriority(const std::string& id, int priority,
                                                     absl::Time now);

  absl::StatusOr<TenantQuotaRow> SetTenantQuota(const TenantQuotaRow& quota, absl::Time now);
  // Empty when the tenant has no quota row; NOT_FOUND for an unknown tenant.
  absl::StatusOr<std::optional<TenantQuotaRow>> GetTenantQuota(const std::string& tenant_id);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_SCHEDULING_STORE_H_
