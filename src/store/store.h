#ifndef SV_STORE_STORE_H_
#define SV_STORE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"
#include "store/marketplace_store.h"

namespace sv::store {

// ---- Tenancy ---------------------------------------------------------------

// kOperator marks the platform admin (users.role = 'operator'); every other
// user is kMember here and has a TenantRole in the tenant of its key.
enum class Role { kMember, kOperator };

// A user's role in an organisation (memberships.role). See docs/security.md.
enum class TenantRole { kViewer, kBilling, kMember, kOwner };

// What an API key may do: read-only keys reach only read methods.
enum class KeyScope { kFull, kReadOnly };

const char* TenantRoleName(TenantRole role);
std::optional<TenantRole> ParseTenantRole(const std::string& name);
const char* KeyScopeName(KeyScope scope);

// Who is behind an API key.
struct Principal {
  std::string api_key_id;
  std::string user_id;
  std::string user_email;
  std::string tenant_id;
  std::string tenant_name;
  Role role = Role::kMember;  // kOperator: the platform admin.
  TenantRole tenant_role = TenantRole::kViewer;
  KeyScope scope = KeyScope::kFull;
  // A read-only operator (users.operator_read_only): changes nothing but
  // its own keys (api/authz.cc).
  bool read_only_operator = false;
  bool platform_admin() const { return role == Role::kOperator; }
};

struct ApiKeyRecord {
  Principal principal;
  std::string salt;
  std::string secret_hash;  // See api/api_keys.h for how it is computed.
  bool revoked = false;
  std::optional<absl::Time> expires_at;
};

struct TenantRecord {
  std::string id;
  std::string name;
  absl::Time created_at;
};

struct NewTenant {
  std::string name;
  std::string owner_email;
  Role owner_role = Role::kMember;
  // The key to register for the owner: its public id, salt and salted hash.
  std::string api_key_id;
  std::string api_key_salt;
  std::string api_key_secret_hash;
};

struct CreatedTenant {
  TenantRecord tenant;
  std::string user_id;
};

// ---- Fleet -----------------------------------------------------------------

enum class NodeState { kReady, kCordoned, kDraining, kDown };

// The nodes.state column's text: "ready", "cordoned", "draining", "down".
const char* NodeStateName(NodeState s);
// Its inverse; anything unknown reads as kDown.
NodeState ParseNodeState(const std::string& s);

struct NodeRecord {
  std::string id;
  std::string name;
  std::string zone;
  std::string pod;
  std::string leaf_switch;
  std::string gpu_model;
  int gpu_count = 8;
  NodeState state = NodeState::kReady;
  bool simulated = false;
  // Its agent reports complete lists (RegisterNode.reports_complete_lists):
  // volumes stay fenced to it when an instance leaves (migration 0124).
  bool fences_mounts = false;
  // The agent connection that registers (migration 0125): only heartbeats
  // of the node's latest connection end its fences. Empty outside a stream.
  std::string connection_id;
};

// ---- Instances -------------------------------------------------------------

enum class InstanceState {
  kPending, kScheduled, kStarting, kRunning, kStopping, kStopped, kDeleted, kFailed
};

std::string InstanceStateName(InstanceState state);

struct NodePlacement {
  std::string node_id;
  std::string node_name;
  std::string leaf_switch;
  std::string pod;
  std::vector<int> gpu_indices;
};

struct InstanceSpec {
  std::string name;
  int gpu_count = 0;
  std::string gpu_model;
  std::string image;
  int max_leaves = 0;  // Gangs only; 0 = no limit.
  // Ports, public library mounts and marketplace app, written in the create
  // transaction (store/marketplace_store.h).
  InstanceExtras extras;
};

struct InstanceRecord {
  std::string id;
  std::string tenant_id;
  InstanceSpec spec;
  InstanceState state = InstanceState::kPending;
  std::string state_reason;
  std::string request_id;
  std::vector<NodePlacement> placement;
  absl::Time created_at;
  absl::Time updated_at;
  bool movable = false;  // svd may move it (migration 0098)
};

// Keyset position in a tenant's instance list, ordered by (created_at, id).
struct ListCursor {
  int64_t created_at_micros = 0;
  std::string id;
};

// The operator's view of every tenant's instances (ListAllInstances).
struct FleetInstanceFilter {
  std::string tenant_id;  // Empty: every tenant.
  std::string node_name;  // Empty: any; else those holding GPUs on it.
  std::string state;      // Empty: every state but DELETED.
};

// ---- Creates (migration 0065, store/create_batch.h) --------------------------

// The billing and budget checks a create must pass, run inside the create's
// own transaction under the tenant's row lock (sv_create_gate). The API fills
// it from billing::Billing::FillCreateGate and the spend cap's month.
struct CreateGate {
  std::string trial_user_id;  // Grant this user's trial first; "" = none.
  int64_t trial_amount_micros = 0;
  absl::Time trial_expires_at;
  int credit_minutes = -1;    // Minutes of credit to require; < 0: no check.
  int64_t spend_cap_since_minute = -1;  // The cap's month (Unix minute); < 0: none.
};

// One row of audit_log (docs/security.md, "Audit log").
struct AuditRow {
  int64_t id = 0;
  absl::Time at;
  std::string tenant_id;
  std::string user_id;
  std::string user_email;
  std::string api_key_id;
  std::string method;
  std::string request_id;
  std::string code;
  std::string reason;
  std::string peer;
};

// One create. `spec` is normalized; `fingerprint` identifies the request's
// content, so a retry with the same request id can be told from a different
// request; `pending_max_default` >= 0 enforces the tenant's pending quota.
struct CreateRequest {
  std::string tenant_id;
  InstanceSpec spec;
  std::string request_id;
  std::string fingerprint;
  absl::Time now;
  int pending_max_default = -1;
  CreateGate gate;
  // The call's audit row (code OK), written in the batch's transaction when
  // this element creates its instance (CreateOutcome::audited); else, and
  // whenever the element is redone alone, not written here.
  std::optional<AuditRow> audit;
};

// The gate's refusal, with its figures: INSUFFICIENT_CREDIT (needed,
// available) or SPEND_CAP_REACHED (spent, cap). The caller words the error
// (the rules' owners do: billing and the spend cap).
struct CreateRefusal {
  std::string reason;
  int64_t used = 0;
  int64_t allowed = 0;
};

// The create's gate (sv_create_gates: credit for `gpu_count` more GPUs of
// instance `id`'s model with the tenant's committed rent, the spend cap,
// suspension) in the caller's transaction, which holds the tenant's row
// lock. OK when it passes or asks for nothing; else the refusal, in
// `refusal` too, as an error the caller may word again.
absl::Status CheckCreateGateLocked(pqxx::work& txn, const std::string& id, int gpu_count,
                                   const CreateGate& gate, absl::Time now,
                                   std::optional<CreateRefusal>* refusal);

struct CreateOutcome {
  InstanceRecord record;           // Unset when refused.
  bool inserted = false;           // False: an earlier call's answer.
  std::optional<CreateRefusal> refusal;
  bool audited = false;            // CreateRequest::audit was committed with it.
};

// One delete of a batch (Store::DeleteInstances).
struct DeleteRequest {
  std::string tenant_id;
  std::string id;
  absl::Time now;
  // As CreateRequest::audit: written in the batch's transaction when the
  // element answers the row (DELETED or already DELETED).
  std::optional<AuditRow> audit;
};

// A delete's answer, and whether its audit row was committed with it.
struct DeleteOutcome {
  absl::StatusOr<InstanceRecord> record;
  bool audited = false;
};

template <typename Request, typename Result>
class GroupCommitter;  // store/create_batch.h

// All PostgreSQL access of svd. Every method is one transaction, every query
// that touches tenant data is scoped by tenant id, and every time stored
// comes from the caller (so tests can drive a fake clock).
class Store {
 public:
  explicit Store(Database& db);
  ~Store();

  // Tenancy.
  absl::StatusOr<ApiKeyRecord> LookupApiKey(const std::string& key_id);
  absl::StatusOr<CreatedTenant> CreateTenant(const NewTenant& tenant, absl::Time now);
  // Makes sure the tenant, its owner and the key exist (idempotent); used to
  // bootstrap the operator's and the dev demo's keys from files.
  absl::Status EnsureTenantWithKey(const NewTenant& tenant, absl::Time now);

  // Fleet.
  absl::Status UpsertNode(const NodeRecord& node, absl::Time now);
  absl::StatusOr<std::vector<NodeRecord>> ListNodes();

  // Instances. `fingerprint` identifies the request's content, so a retry
  // with the same request id can be told from a different request.
  // `pending_max_default` >= 0 enforces the tenant's pending quota (its
  // tenant_quotas row, else this default) inside the create's transaction,
  // exactly, however many creates race: RESOURCE_EXHAUSTED / QUOTA_EXCEEDED.
  // `inserted`, if set, says whether this call created the row (false: the
  // answer of an earlier call with the same request_id).
  absl::StatusOr<InstanceRecord> CreateInstance(const std::string& tenant_id,
                                                const InstanceSpec& spec,
                                                const std::string& request_id,
                                                const std::string& fingerprint,
                                                absl::Time now, int pending_max_default = -1,
                                                bool* inserted = nullptr);
  // Runs the creates in one transaction (sv_create_instances), each with its
  // own answer: limits, REQUEST_ID_REUSED and the gate's refusal per element.
  // If the transaction fails for a reason other than the database being
  // unreachable, every element is retried alone, so one bad element (e.g. an
  // unknown library mount) never costs the others theirs.
  std::vector<absl::StatusOr<CreateOutcome>> CreateInstances(
      const std::vector<CreateRequest>& batch);
  // One create, group-committed with the creates of other calls that arrive
  // at the same moment when batching is on (store/create_batch.h), else
  // CreateInstances of just this one.
  absl::StatusOr<CreateOutcome> SubmitCreate(CreateRequest request);
  // Turns on group commit of SubmitCreate with at most `lanes` batches in
  // flight, one as a rule (store/create_batch.h: another starts only when
  // many calls wait or the one in flight stalls; a tenant is in one batch
  // in flight at most); 0 turns it off. Call before serving.
  void SetCreateBatchLanes(int lanes);
  // The pool the create and delete batches run on; the store's own pool
  // when not set (or null). With group commit on, the batches get a small
  // pool of their own (server.cc: 2 × lanes connections), so the heavy
  // batch functions are planned and cached in a few sessions rather than in
  // every connection a burst of other calls opened, and the batches never
  // queue for a connection behind other work. Call before serving.
  void SetBatchDatabase(Database* db) { batch_db_ = db != nullptr ? db : &db_; }
  // Deletes in one transaction (sv_delete_instances), each with its own
  // answer as DeleteInstance gives it; an instance whose row another
  // transaction holds is deleted alone after the batch. On a failed batch
  // every element is retried alone, as in CreateInstances.
  std::vector<absl::StatusOr<InstanceRecord>> DeleteInstances(
      const std::vector<DeleteRequest>& batch);
  // One delete, group-committed like SubmitCreate (same lanes setting).
  DeleteOutcome SubmitDelete(DeleteRequest request);

  absl::StatusOr<InstanceRecord> GetInstance(const std::string& tenant_id,
                                             const std::string& id);
  absl::StatusOr<std::vector<InstanceRecord>> ListInstances(
      const std::string& tenant_id, const std::optional<ListCursor>& after,
      int limit, bool show_deleted);
  // Every tenant's instances matching `filter`, oldest first, for operators.
  absl::StatusOr<std::vector<InstanceRecord>> ListFleetInstances(
      const FleetInstanceFilter& filter, const std::optional<ListCursor>& after, int limit);
  absl::StatusOr<InstanceRecord> DeleteInstance(const std::string& tenant_id,
                                                const std::string& id, absl::Time now);
  // Stops an instance: releases its GPUs and keeps the instance (and, later,
  // its disks). `reason` is recorded, e.g. "stopped by the user" or "credit
  // exhausted". Billable time ends at `now`. Stopping a STOPPED instance is a
  // no-op; a DELETED or FAILED one is FAILED_PRECONDITION.
  absl::StatusOr<InstanceRecord> StopInstance(const std::string& tenant_id,
                                              const std::string& id,
                                              const std::string& reason, absl::Time now);
  // Queues a STOPPED instance again (PENDING); a no-op for one that is
  // already queued or running. Held to the create's limits, exactly, under
  // the tenant's row lock: RESOURCE_EXHAUSTED / INSTANCE_LIMIT_REACHED when
  // the tenant has its most unfinished instances, QUOTA_EXCEEDED when its
  // pending quota is full (`pending_max_default` as for a create; < 0: no
  // pending quota).
  // `credit_checked`: the caller held the start to the credit gate, as it
  // does when it read the instance STOPPED. When it did not (it read it
  // queued or running) and the instance is STOPPED now (a credit stop came
  // in between), the start is ABORTED / INSTANCE_CHANGED, to be tried
  // again with the check.
  // `gate`: the create's credit gate (its rent for `credit_minutes` with
  // that of the tenant's unfinished instances) and monthly spend cap,
  // checked here under the tenant's lock, as a create's are; a refusal
  // (INSUFFICIENT_CREDIT, SPEND_CAP_REACHED) writes nothing, goes to
  // `refusal` and is returned as an error the caller may word again. Its
  // trial fields are not used.
  absl::StatusOr<InstanceRecord> StartInstance(const std::string& tenant_id,
                                               const std::string& id, absl::Time now,
                                               int pending_max_default = -1,
                                               bool credit_checked = true,
                                               const CreateGate& gate = {},
                                               std::optional<CreateRefusal>* refusal = nullptr);

  // The pool, for sibling stores over the same database: SchedulingStore
  // (queue passes, resize, cordon/drain, quotas) and AgentStore.
  Database& database() { return db_; }

  // Plays the node agents of simulated nodes: moves their SCHEDULED
  // instances to STARTING and their STARTING ones to RUNNING. svd no longer
  // calls it (simulated nodes have simulated agents, src/sim); store-level
  // tests use it to get instances RUNNING without a server.
  absl::StatusOr<int> AdvanceSimulatedStarts(absl::Time now);

 private:
  std::vector<DeleteOutcome> DeleteBatch(const std::vector<DeleteRequest>& batch);
  // `wait`: wait for rows other transactions hold instead of answering
  // them busy (migration 0097).
  absl::Status DeleteBatchInTransaction(pqxx::work& txn, const std::vector<DeleteRequest>& batch,
                                        bool wait, std::vector<DeleteOutcome>& out,
                                        std::vector<size_t>& busy);
  absl::Status CreateBatchInTransaction(pqxx::work& txn, const std::vector<CreateRequest>& batch,
                                        std::vector<absl::StatusOr<CreateOutcome>>& out);

  Database& db_;
  Database* batch_db_;  // Never null.
  std::unique_ptr<GroupCommitter<CreateRequest, absl::StatusOr<CreateOutcome>>> creates_;
  std::unique_ptr<GroupCommitter<DeleteRequest, DeleteOutcome>> deletes_;
};

}  // namespace sv::store

#endif  // SV_STORE_STORE_H_
