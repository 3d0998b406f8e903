#ifndef SV_STORE_AGENT_STORE_H_
#define SV_STORE_AGENT_STORE_H_

// PostgreSQL access for node agents and the instance lifecycle they drive:
// node credentials, registration and heartbeats, what each node must run,
// start confirmations, exits, node death, telemetry aggregates and idle
// auto-stop. Every method is one transaction; times come from the caller.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/create_batch.h"
#include "store/database.h"
#include "store/node_resources.h"
#include "store/store.h"

namespace sv::store {

struct NodeCredentialRecord {
  std::string id;
  std::string node_name;
  std::string secret_sha256;
  bool revoked = false;
  std::optional<absl::Time> revoked_at;  // Filled by RevokeNodeCredential.
};

// One instance a node must run, with the GPUs of that node it holds.
struct AgentAssignment {
  std::string instance_id;
  std::vector<int> gpu_indices;
  std::string image;
  bool starting = false;  // Not yet RUNNING: svd waits for confirmations.
  // Changes with every start of the instance (its queue sequence), so a
  // stop and start between two polls still changes the desired set.
  int64_t run = 0;
  // Volumes and library items to mount, and published ports with their
  // node ports (store/node_resources.h).
  std::vector<AssignedMount> mounts;
  std::vector<AssignedPort> ports;
  // The tenant's SSH public keys, for the instance's authorized_keys.
  std::vector<std::string> authorized_keys;
};

struct InstanceEventRecord {
  int64_t id = 0;
  absl::Time at;
  std::optional<InstanceState> from_state;
  InstanceState to_state = InstanceState::kPending;
  std::string reason;
};

// A GPU of a node held by a RUNNING instance, for attributing the node's
// telemetry (docs/sla.md): the instance's size, this GPU's number among the
// instance's GPUs (ordered by node id, then GPU index), and its idle policy.
struct NodeGpuHolder {
  int node_gpu_index = 0;
  std::string instance_id;
  int instance_gpu_count = 0;
  int instance_gpu_ordinal = 0;
  int idle_seconds = 0;
  int idle_utilization_pct = 0;
  // When the instance's current run began (Unix seconds): telemetry stamped
  // earlier is not this node's to report (after a move, the time was served
  // by the old node).
  int64_t running_since_s = 0;
};

// A node that was declared down, with the instances it took with it.
struct DownedNode {
  std::string node_id;
  std::string node_name;
  absl::Time last_heartbeat_at;
  std::vector<std::string> stopped_instance_ids;
};

// One node's report that instances run (AgentStore::ConfirmStartedMany's
// arguments), and its answer: one result per id, in order.
struct StartConfirmation {
  std::string node_id;
  std::vector<std::string> instance_ids;
  absl::Time now;
};
using StartConfirmationResult = absl::StatusOr<std::vector<absl::StatusOr<bool>>>;

// A read of one node's desired set (AgentStore::DesiredForNode's
// arguments), and its answer.
struct DesiredSetRequest {
  std::string node_id;
  absl::Time now;
};
using DesiredSetResult = absl::StatusOr<std::vector<AgentAssignment>>;

class AgentStore {
 public:
  explicit AgentStore(Database& db) : db_(db) {}
  AgentStore(const AgentStore&) = delete;
  AgentStore& operator=(const AgentStore&) = delete;

  // Group commit of start confirmations (docs/reliability.md, "Start
  // confirmations of many nodes in one transaction"): with lanes > 0,
  // ConfirmStartedMany calls of different nodes that arrive while a batch
  // is written are written together by ConfirmStartedBatch, a node in at
  // most one batch in flight. 0 (the default): one transaction per call.
  void SetConfirmBatchLanes(int lanes);
  // The same for the desired-set reads (DesiredForNode), which move the
  // instances a node is told of to STARTING: reads of different nodes that
  // arrive together share one transaction (DesiredForNodes).
  void SetDesiredBatchLanes(int lanes);

  // Credentials.
  absl::Status CreateNodeCredential(const std::string& id, const std::string& node_name,
                                    const std::string& secret_sha256, absl::Time now);
  absl::StatusOr<NodeCredentialRecord> LookupNodeCredential(const std::string& id);
  // Sets revoked_at (kept from the first call when revoked twice) and
  // returns the credential with it. NOT_FOUND (NODE_CREDENTIAL_NOT_FOUND).
  absl::StatusOr<NodeCredentialRecord> RevokeNodeCredential(const std::string& id,
                                                            absl::Time now);
  // Those of `ids` that are revoked (unknown ids are left out).
  absl::StatusOr<std::vector<std::string>> RevokedNodeCredentials(
      const std::vector<std::string>& ids);

  // Registers the node (creating or updating its row) and counts as a
  // heartbeat. A node that was down becomes ready again. Returns its id.
  absl::StatusOr<std::string> RegisterNode(const NodeRecord& node, absl::Time now);
  // False when the node was declared down meanwhile: its agent must
  // register again, which reconciles it. `listed`, when the agent's lists
  // are complete, holds every instance the node runs or is told to run:
  // the fences of the node on the volumes of every other instance end
  // (migration 0124), if `connection_id` is that of the node's latest
  // registration (NodeRecord::connection_id, migration 0125).
  // `runtime_listed`, when the agent says, is whether it could list its
  // container runtime: a node that cannot is given no placements
  // (migration 0127).
  absl::StatusOr<bool> Heartbeat(const std::string& node_id, absl::Time now,
                                 const std::optional<std::vector<std::string>>& listed =
                                     std::nullopt,
                                 const std::string& connection_id = "",
                                 std::optional<bool> runtime_listed = std::nullopt);

  // The instances that must run on the node. Instances still SCHEDULED move
  // to STARTING here, because this is the moment their agent is told.
  // FAILED_PRECONDITION (NODE_DOWN) once the node was declared down.
  absl::StatusOr<std::vector<AgentAssignment>> DesiredForNode(const std::string& node_id,
                                                              absl::Time now);
  // Several nodes' DesiredForNode in one transaction: one result per
  // request, each the set DesiredForNode would answer for its node. The
  // instances moved to STARTING are moved as of the latest `now` of the
  // batch. A failed transaction is redone node by node (an unreachable
  // database fails every element).
  std::vector<DesiredSetResult> DesiredForNodes(const std::vector<DesiredSetRequest>& requests);
  // The node says the instance runs. When every node of the instance has
  // said so, it becomes RUNNING as of `now`. When the instance holds no GPU
  // on this node: FAILED_PRECONDITION (STALE_REPORT) if it holds none at all
  // (deleted, stopped, ended or requeued after the agent reported), else
  // NOT_FOUND (UNKNOWN_INSTANCE).
  absl::StatusOr<bool> ConfirmStarted(const std::string& node_id,
                                      const std::string& instance_id, absl::Time now);
  // ConfirmStarted for several instances in one transaction: one result per
  // id, in order (an id may repeat). An instance already RUNNING with this
  // node's confirmation is only read, so a heartbeat that lists what runs
  // writes nothing. The outer status fails only when the transaction does.
  StartConfirmationResult ConfirmStartedMany(const std::string& node_id,
                                             const std::vector<std::string>& instance_ids,
                                             absl::Time now);
  // Several nodes' ConfirmStartedMany in one transaction: one result per
  // confirmation, as ConfirmStartedMany's, where true means RUNNING once the
  // whole batch is written (so every node of a gang confirmed in the batch
  // reads true). An instance whose last node confirms here becomes RUNNING
  // as of the latest `now` among its confirmations in the batch. A failed
  // transaction fails every element.
  std::vector<StartConfirmationResult> ConfirmStartedBatch(
      const std::vector<StartConfirmation>& confirmations);
  // The instance ended on the node by itself, or failed to start: it leaves
  // its state as of `now` (STOPPED for a clean exit, else FAILED) and
  // releases its GPUs. STALE_REPORT and UNKNOWN_INSTANCE as above, and
  // STALE_REPORT when `run` (0: unknown) is not the instance's current run.
  absl::Status ReportEnded(const std::string& node_id, const std::string& instance_id,
                           bool failed, const std::string& reason, absl::Time now,
                           int64_t run = 0);

  // Declares down every node whose last heartbeat is older than `now -
  // timeout`; their instances stop AS OF THAT LAST HEARTBEAT, so time on a
  // dead node is never billed.
  absl::StatusOr<std::vector<DownedNode>> MarkSilentNodesDown(absl::Duration timeout,
                                                              absl::Time now);

  // The GPUs of the node (by name) that RUNNING instances hold.
  absl::StatusOr<std::vector<NodeGpuHolder>> RunningOnNode(const std::string& node_name);
  // Idle streaks from one telemetry batch: an idle batch starts the streak
  // (if none runs), a busy one ends it. `idle` maps instance id -> idle.
  // A streak counts only the time telemetry saw it: an idle batch more than
  // a gap (kIdleGap, or three telemetry intervals if longer) after the
  // streak was last written moves its start forward by the silence
  // (migration 0126).
  static constexpr absl::Duration kIdleSeenEvery = absl::Seconds(15);
  static constexpr absl::Duration kIdleGap = absl::Seconds(45);
  absl::Status UpdateIdleStreaks(const std::map<std::string, bool>& idle, absl::Time now,
                                 absl::Duration telemetry_interval = absl::Seconds(10));
  // Stops RUNNING instances whose idle streak reached their policy.
  absl::StatusOr<std::vector<std::string>> StopIdleInstances(absl::Time now);

  // Tenant views and settings (scoped by tenant; another tenant's instance
  // is NOT_FOUND).
  absl::StatusOr<std::vector<InstanceEventRecord>> ListInstanceEvents(
      const std::string& tenant_id, const std::string& instance_id, int64_t after_id,
      int limit);
  absl::Status SetIdlePolicy(const std::string& tenant_id, const std::string& instance_id,
                             int idle_seconds, int utilization_pct, absl::Time now);
  // Lets svd move the instance or not (instances.movable, migration 0098).
  // NOT_FOUND for another tenant's or an unknown instance;
  // FAILED_PRECONDITION / INSTANCE_FINISHED for a DELETED or FAILED one.
  absl::Status SetInstanceMovable(const std::string& tenant_id, const std::string& instance_id,
                                  bool movable, absl::Time now);

 private:
  Database& db_;
  std::unique_ptr<GroupCommitter<StartConfirmation, StartConfirmationResult>> confirms_;
  std::unique_ptr<GroupCommitter<DesiredSetRequest, DesiredSetResult>> desired_;
};

}  // namespace sv::store

#endif  // SV_STORE_AGENT_STORE_H_
