#include "store/store.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/status.h"
#include "store/create_batch.h"
#include "store/instance_events.h"
#include "store/security_store.h"
#include "store/sql_arrays.h"

namespace sv::store {
namespace {

// A tenant may hold at most this many instances that are not finished.
constexpr int kTenantActiveInstancesMax = 1000;

const char* const kStateNames[] = {"PENDING", "SCHEDULED", "STARTING", "RUNNING",
                                   "STOPPING", "STOPPED", "DELETED", "FAILED"};

InstanceState ParseState(const std::string& s) {
  for (int i = 0; i < 8; ++i) {
    if (s == kStateNames[i]) return static_cast<InstanceState>(i);
  }
  // The CHECK constraint admits only the names above.
  assert(false && "unknown instance state in database");
  return InstanceState::kFailed;
}

std::string RoleName(Role role) { return role == Role::kOperator ? "operator" : "member"; }

const std::string kInstanceColumns = absl::StrCat(
    "id, tenant_id, name, gpu_count, gpu_model, image, state, state_reason, "
    "request_id, ", MicrosOf("created_at"), ", ", MicrosOf("updated_at"),
    ", request_fingerprint, max_leaves");
// Reads of the instances table add the columns the delete functions do not
// return (a deleted instance is never moved).
const std::string kInstanceTableColumns = kInstanceColumns + ", movable";

// The record from kInstanceColumns (or kInstanceTableColumns), starting at
// column `first` of the row.
InstanceRecord InstanceFromRow(const pqxx::row& row, int first = 0) {
  InstanceRecord r;
  r.id = row[first + 0].as<std::string>();
  r.tenant_id = row[first + 1].as<std::string>();
  r.spec.name = row[first + 2].as<std::string>();
  r.spec.gpu_count = row[first + 3].as<int>();
  r.spec.gpu_model = row[first + 4].as<std::string>();
  r.spec.image = row[first + 5].as<std::string>();
  r.state = ParseState(row[first + 6].as<std::string>());
  r.state_reason = row[first + 7].as<std::string>();
  r.request_id = row[first + 8].as<std::string>();
  r.created_at = TimeFromMicros(row[first + 9].as<int64_t>());
  r.updated_at = TimeFromMicros(row[first + 10].as<int64_t>());
  r.spec.max_leaves = row[first + 12].as<int>();
  if (static_cast<int>(row.size()) > first + 13) r.movable = row[first + 13].as<bool>();
  return r;
}

// Fills in the placement of each record from its GPU reservations.
void LoadPlacements(pqxx::work& txn, std::vector<InstanceRecord>& records) {
  if (records.empty()) return;
  std::vector<std::string> ids;
  std::map<std::string, InstanceRecord*> by_id;
  for (auto& r : records) {
    ids.push_back(r.id);
    by_id[r.id] = &r;
  }
  auto rows = txn.exec_params(
      "SELECT r.instance_id, n.id, n.name, n.leaf_switch, n.pod, r.gpu_index "
      "FROM gpu_reservations r JOIN nodes n ON n.id = r.node_id "
      "WHERE r.instance_id = ANY($1::text[]) "
      "ORDER BY r.instance_id, n.name, r.gpu_index",
      TextArrayLiteral(ids));
  for (const auto& row : rows) {
    InstanceRecord* r = by_id[row[0].as<std::string>()];
    std::string node_id = row[1].as<std::string>();
    if (r->placement.empty() || r->placement.back().node_id != node_id) {
      r->placement.push_back({node_id, row[2].as<std::string>(), row[3].as<std::string>(),
                              row[4].as<std::string>(), {}});
    }
    r->placement.back().gpu_indices.push_back(row[5].as<int>());
  }
}

// Locks an instance row of the tenant and returns its state, or nothing
// when the tenant has no such instance.
std::optional<std::string> LockState(pqxx::work& txn, const std::string& tenant_id,
                                     const std::string& id) {
  auto rows = txn.exec_params(
      "SELECT state FROM instances WHERE tenant_id = $1 AND id = $2 FOR NO KEY UPDATE",
      tenant_id, id);
  if (rows.empty()) return std::nullopt;
  return rows[0][0].as<std::string>();
}

absl::Status Finished(const std::string& id, const std::string& state, const char* verb) {
  return Error(absl::StatusCode::kFailedPrecondition, "INSTANCE_FINISHED",
               absl::StrCat("instance ", id, " is ", state, " and cannot be ", verb));
}

absl::Status NotFound(const std::string& id) {
  return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
               absl::StrCat("instance ", id, " not found"));
}

}  // namespace

void RecordEvent(pqxx::work& txn, const std::string& instance_id, absl::Time at,
                 const std::string& from, const std::string& to, const std::string& reason) {
  ExecPrepared(txn, "sv_instance_event",
               "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
               "VALUES ($1, $2::timestamptz, $3, $4, $5)",
               instance_id, SqlTime(at), from, to, reason);
}

const char* NodeStateName(NodeState s) {
  switch (s) {
    case NodeState::kReady: return "ready";
    case NodeState::kCordoned: return "cordoned";
    case NodeState::kDraining: return "draining";
    case NodeState::kDown: return "down";
  }
  return "down";
}

NodeState ParseNodeState(const std::string& s) {
  if (s == "ready") return NodeState::kReady;
  if (s == "cordoned") return NodeState::kCordoned;
  if (s == "draining") return NodeState::kDraining;
  return NodeState::kDown;
}


std::string InstanceStateName(InstanceState state) {
  return kStateNames[static_cast<int>(state)];
}

// ---- Tenancy ---------------------------------------------------------------

const char* TenantRoleName(TenantRole role) {
  switch (role) {
    case TenantRole::kViewer: return "viewer";
    case TenantRole::kBilling: return "billing";
    case TenantRole::kMember: return "member";
    case TenantRole::kOwner: return "owner";
  }
  return "viewer";
}

std::optional<TenantRole> ParseTenantRole(const std::string& name) {
  for (TenantRole r : {TenantRole::kViewer, TenantRole::kBilling, TenantRole::kMember,
                       TenantRole::kOwner}) {
    if (name == TenantRoleName(r)) return r;
  }
  return std::nullopt;
}

const char* KeyScopeName(KeyScope scope) {
  return scope == KeyScope::kReadOnly ? "read_only" : "full";
}

absl::StatusOr<ApiKeyRecord> Store::LookupApiKey(const std::string& key_id) {
  ApiKeyRecord record;
  bool found = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    // A key without a membership (its user was removed from the tenant)
    // reads as unknown, except the platform admin's. A key is the platform
    // admin's only in the operator's own tenant: an operator's e-mail added
    // to a tenant (refused by AddMember since migration 0114) never makes
    // that tenant's keys operator keys.
    auto rows = txn.exec_params(
        "SELECT k.salt, k.secret_hash, k.revoked_at IS NOT NULL, u.id, u.email, "
        "CASE WHEN u.tenant_id = k.tenant_id THEN u.role ELSE 'member' END, "
        "t.id, t.name, coalesce(m.role, 'viewer'), k.scope, "
        + MicrosOf("k.expires_at") + ", m.role IS NOT NULL, u.operator_read_only "
        "FROM api_keys k JOIN users u ON u.id = k.user_id "
        "JOIN tenants t ON t.id = k.tenant_id "
        "LEFT JOIN memberships m ON m.tenant_id = k.tenant_id AND m.user_id = k.user_id "
        "WHERE k.id = $1",
        key_id);
    if (rows.empty()) return absl::OkStatus();
    const auto& row = rows[0];
    const bool operator_user = row[5].as<std::string>() == "operator";
    if (!row[11].as<bool>() && !operator_user) return absl::OkStatus();
    found = true;
    record.salt = row[0].as<std::string>();
    record.secret_hash = row[1].as<std::string>();
    record.revoked = row[2].as<bool>();
    record.principal = {key_id,
                        row[3].as<std::string>(),
                        row[4].as<std::string>(),
                        row[6].as<std::string>(),
                        row[7].as<std::string>(),
                        operator_user ? Role::kOperator : Role::kMember};
    record.principal.tenant_role =
        ParseTenantRole(row[8].as<std::string>()).value_or(TenantRole::kViewer);
    record.principal.scope =
        row[9].as<std::string>() == "read_only" ? KeyScope::kReadOnly : KeyScope::kFull;
    if (!row[10].is_null()) record.expires_at = TimeFromMicros(row[10].as<int64_t>());
    record.principal.read_only_operator = operator_user && row[12].as<bool>();
    return absl::OkStatus();
  }));
  if (!found) {
    return Error(absl::StatusCode::kUnauthenticated, "API_KEY_UNKNOWN",
                 "the API key is not known");
  }
  return record;
}

absl::StatusOr<CreatedTenant> Store::CreateTenant(const NewTenant& tenant, absl::Time now) {
  CreatedTenant created;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    created = {};
    created.tenant = {NewId("ten"), tenant.name, now};
    created.user_id = NewId("usr");
    auto t = txn.exec_params(
        "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3::timestamptz) "
        "ON CONFLICT (name) DO NOTHING RETURNING id",
        created.tenant.id, tenant.name, SqlTime(now));
    if (t.empty()) {
      return Error(absl::StatusCode::kAlreadyExists, "TENANT_EXISTS",
                   absl::StrCat("a tenant named '", tenant.name, "' already exists"));
    }
    auto u = txn.exec_params(
        "INSERT INTO users (id, tenant_id, email, role, created_at) "
        "VALUES ($1, $2, $3, $4, $5::timestamptz) ON CONFLICT (email) DO NOTHING "
        "RETURNING id",
        created.user_id, created.tenant.id, tenant.owner_email,
        RoleName(tenant.owner_role), SqlTime(now));
    if (u.empty()) {
      return Error(absl::StatusCode::kAlreadyExists, "USER_EXISTS",
                   absl::StrCat("a user with email '", tenant.owner_email,
                                "' already exists"));
    }
    txn.exec_params(
        "INSERT INTO memberships (tenant_id, user_id, role, created_at) "
        "VALUES ($1, $2, 'owner', $3::timestamptz)",
        created.tenant.id, created.user_id, SqlTime(now));
    txn.exec_params(
        "INSERT INTO api_keys (id, user_id, tenant_id, salt, secret_hash, created_at, name) "
        "VALUES ($1, $2, $3, $4, $5, $6::timestamptz, 'initial')",
        tenant.api_key_id, created.user_id, created.tenant.id, tenant.api_key_salt,
        tenant.api_key_secret_hash, SqlTime(now));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return created;
}

absl::Status Store::EnsureTenantWithKey(const NewTenant& tenant, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    txn.exec_params(
        "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3::timestamptz) "
        "ON CONFLICT (name) DO NOTHING",
        NewId("ten"), tenant.name, SqlTime(now));
    std::string tenant_id =
        txn.exec_params1("SELECT id FROM tenants WHERE name = $1", tenant.name)[0]
            .as<std::string>();
    txn.exec_params(
        "INSERT INTO users (id, tenant_id, email, role, created_at) "
        "VALUES ($1, $2, $3, $4, $5::timestamptz) ON CONFLICT (email) DO NOTHING",
        NewId("usr"), tenant_id, tenant.owner_email, RoleName(tenant.owner_role),
        SqlTime(now));
    auto user = txn.exec_params1("SELECT id, tenant_id FROM users WHERE email = $1",
                                 tenant.owner_email);
    if (user[1].as<std::string>() != tenant_id) {
      return Error(absl::StatusCode::kFailedPrecondition, "USER_IN_OTHER_TENANT",
                   absl::StrCat("user ", tenant.owner_email,
                                " belongs to another tenant"));
    }
    txn.exec_params(
        "INSERT INTO memberships (tenant_id, user_id, role, created_at) "
        "VALUES ($1, $2, 'owner', $3::timestamptz) ON CONFLICT DO NOTHING",
        tenant_id, user[0].as<std::string>(), SqlTime(now));
    // The key file is the truth: its key is (re)enabled with a fresh salt.
    txn.exec_params(
        "INSERT INTO api_keys (id, user_id, tenant_id, salt, secret_hash, created_at, name) "
        "VALUES ($1, $2, $3, $4, $5, $6::timestamptz, 'bootstrap') "
        "ON CONFLICT (id) DO UPDATE SET salt = EXCLUDED.salt, "
        "secret_hash = EXCLUDED.secret_hash, revoked_at = NULL, expires_at = NULL "
        "WHERE api_keys.user_id = EXCLUDED.user_id",
        tenant.api_key_id, user[0].as<std::string>(), tenant_id, tenant.api_key_salt,
        tenant.api_key_secret_hash, SqlTime(now));
    return absl::OkStatus();
  });
}

// ---- Fleet -----------------------------------------------------------------

absl::Status Store::UpsertNode(const NodeRecord& node, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO nodes (id, name, zone, pod, leaf_switch, gpu_model, gpu_count, "
        "state, simulated, last_heartbeat_at, created_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::timestamptz, $10::timestamptz) "
        "ON CONFLICT (name) DO UPDATE SET zone = EXCLUDED.zone, pod = EXCLUDED.pod, "
        "leaf_switch = EXCLUDED.leaf_switch, gpu_model = EXCLUDED.gpu_model, "
        "gpu_count = EXCLUDED.gpu_count, simulated = EXCLUDED.simulated, "
        "last_heartbeat_at = EXCLUDED.last_heartbeat_at",
        node.id.empty() ? NewId("node") : node.id, node.name, node.zone, node.pod,
        node.leaf_switch, node.gpu_model, node.gpu_count, NodeStateName(node.state),
        node.simulated, SqlTime(now));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<NodeRecord>> Store::ListNodes() {
  std::vector<NodeRecord> nodes;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    nodes.clear();
    for (const auto& row : txn.exec(
             "SELECT id, name, zone, pod, leaf_switch, gpu_model, gpu_count, state, "
             "simulated FROM nodes ORDER BY name")) {
      nodes.push_back({row[0].as<std::string>(), row[1].as<std::string>(),
                       row[2].as<std::string>(), row[3].as<std::string>(),
                       row[4].as<std::string>(), row[5].as<std::string>(),
                       row[6].as<int>(), ParseNodeState(row[7].as<std::string>()),
                       row[8].as<bool>()});
    }
    return absl::OkStatus();
  }));
  return nodes;
}

// ---- Instances -------------------------------------------------------------

absl::StatusOr<InstanceRecord> Store::CreateInstance(const std::string& tenant_id,
                                                     const InstanceSpec& spec,
                                                     const std::string& request_id,
                                                     const std::string& fingerprint,
                                                     absl::Time now, int pending_max_default,
                                                     bool* inserted) {
  CreateRequest request{tenant_id, spec, request_id, fingerprint, now, pending_max_default, {}};
  auto outcomes = CreateInstances({request});
  if (!outcomes[0].ok()) return outcomes[0].status();
  // No gate was asked for, so there is no refusal.
  assert(!outcomes[0]->refusal.has_value());
  if (inserted != nullptr) *inserted = outcomes[0]->inserted;
  return std::move(outcomes[0]->record);
}

Store::Store(Database& db) : db_(db), batch_db_(&db) {}
Store::~Store() = default;

void Store::SetCreateBatchLanes(int lanes) {
  if (lanes <= 0) {
    creates_.reset();
    deletes_.reset();
    return;
  }
  creates_ = std::make_unique<GroupCommitter<CreateRequest, absl::StatusOr<CreateOutcome>>>(
      lanes, [this](const std::vector<CreateRequest>& batch) { return CreateInstances(batch); });
  deletes_ = std::make_unique<GroupCommitter<DeleteRequest, DeleteOutcome>>(
      lanes, [this](const std::vector<DeleteRequest>& batch) { return DeleteBatch(batch); });
}

absl::StatusOr<CreateOutcome> Store::SubmitCreate(CreateRequest request) {
  if (creates_ != nullptr) {
    const std::string tenant_id = request.tenant_id;
    return creates_->Submit(tenant_id, std::move(request));
  }
  return std::move(CreateInstances({std::move(request)})[0]);
}

DeleteOutcome Store::SubmitDelete(DeleteRequest request) {
  if (deletes_ != nullptr) {
    const std::string tenant_id = request.tenant_id;
    return deletes_->Submit(tenant_id, std::move(request));
  }
  return std::move(DeleteBatch({std::move(request)})[0]);
}

std::vector<absl::StatusOr<InstanceRecord>> Store::DeleteInstances(
    const std::vector<DeleteRequest>& batch) {
  std::vector<absl::StatusOr<InstanceRecord>> out;
  for (DeleteOutcome& o : DeleteBatch(batch)) out.push_back(std::move(o.record));
  return out;
}

std::vector<DeleteOutcome> Store::DeleteBatch(const std::vector<DeleteRequest>& batch) {
  std::vector<DeleteOutcome> out;
  std::vector<size_t> busy;
  // No BatchCommitting() here, unlike the creates: with deletes started
  // during each other's COMMIT the batches got smaller and a create+delete
  // cost more CPU (docs/reliability.md, "The next batch during the COMMIT").
  absl::Status status = batch_db_->Transact([&](pqxx::work& txn) {
    return DeleteBatchInTransaction(txn, batch, /*wait=*/false, out, busy);
  });
  if (status.ok() && !busy.empty()) {
    // Rows another transaction held (a node's read moving a just placed
    // instance to STARTING, say): one more batch, which waits for them.
    std::vector<DeleteRequest> held;
    for (size_t i : busy) held.push_back(batch[i]);
    std::vector<DeleteOutcome> held_out;
    std::vector<size_t> still_busy;
    absl::Status waited = batch_db_->Transact([&](pqxx::work& txn) {
      return DeleteBatchInTransaction(txn, held, /*wait=*/true, held_out, still_busy);
    });
    if (waited.ok()) {
      std::vector<size_t> left;
      for (size_t k : still_busy) left.push_back(busy[k]);
      for (size_t k = 0; k < held.size(); ++k) {
        if (std::find(still_busy.begin(), still_busy.end(), k) == still_busy.end()) {
          out[busy[k]] = std::move(held_out[k]);
        }
      }
      busy = std::move(left);
    }
    // Otherwise (a deadlock, say) each is deleted alone below.
  }
  if (!status.ok()) {
    // As in CreateInstances: alone, each gets its own answer, unless the
    // database is unreachable. A delete that did commit answers the same
    // row again (deleting a DELETED instance changes nothing).
    out.assign(batch.size(), DeleteOutcome{status, false});
    if (status.code() == absl::StatusCode::kUnavailable) return out;
    const bool audits = std::any_of(batch.begin(), batch.end(),
                                    [](const DeleteRequest& r) { return r.audit.has_value(); });
    if (batch.size() == 1 && !audits) return out;
    busy.clear();
    for (size_t i = 0; i < batch.size(); ++i) busy.push_back(i);
  }
  // Rows another transaction held (or a failed batch's elements): deleted
  // alone, waiting for the row lock; their audit rows are the interceptor's.
  for (size_t i : busy) {
    out[i] = {DeleteInstance(batch[i].tenant_id, batch[i].id, batch[i].now), false};
  }
  return out;
}

absl::Status Store::DeleteBatchInTransaction(pqxx::work& txn,
                                             const std::vector<DeleteRequest>& batch,
                                             bool wait, std::vector<DeleteOutcome>& out,
                                             std::vector<size_t>& busy) {
  out.assign(batch.size(), DeleteOutcome{absl::InternalError("no verdict"), false});
  busy.clear();
  std::vector<std::string> tenants, ids, nows;
  for (const DeleteRequest& r : batch) {
    tenants.push_back(r.tenant_id);
    ids.push_back(r.id);
    nows.push_back(SqlTime(r.now));
  }
  // Migrations 0066, 0072 and 0097: each verdict with the row it answers (a
  // deleted instance holds no GPUs: no placements to load).
  auto verdicts = ExecPrepared(
      txn, "sv_delete_instances_rows",
      "SELECT ord, verdict, " + kInstanceColumns +
          " FROM sv_delete_instances($1::text[], $2::text[], $3::timestamptz[], $4::boolean)",
      TextArrayLiteral(tenants), TextArrayLiteral(ids), TextArrayLiteral(nows), wait);
  if (verdicts.size() != batch.size()) {
    return Error(absl::StatusCode::kInternal, "INTERNAL",
                 "sv_delete_instances answered a different number of verdicts");
  }
  std::vector<AuditRow> audits;  // Of the calls answered with their row.
  for (const auto& row : verdicts) {
    const size_t i = row[0].as<size_t>() - 1;
    if (i >= batch.size()) {
      return Error(absl::StatusCode::kInternal, "INTERNAL", "sv_delete_instances: bad ord");
    }
    const std::string verdict = row[1].as<std::string>();
    if (verdict == "NOT_FOUND") {
      out[i].record = NotFound(batch[i].id);
    } else if (verdict == "BUSY") {
      busy.push_back(i);
    } else if (verdict == "DELETED" || verdict == "UNCHANGED") {
      // The row as this transaction wrote it, or as it was (DELETED).
      out[i].record = InstanceFromRow(row, 2);
      if (batch[i].audit.has_value()) {
        audits.push_back(*batch[i].audit);
        out[i].audited = true;
      }
    } else {
      return Error(absl::StatusCode::kInternal, "INTERNAL",
                   "sv_delete_instances answered " + verdict);
    }
  }
  // The audit rows of the calls answered with their row, in this
  // transaction: they commit with the delete or not at all.
  InsertAuditRows(txn, audits);
  return absl::OkStatus();
}

std::vector<absl::StatusOr<CreateOutcome>> Store::CreateInstances(
    const std::vector<CreateRequest>& batch) {
  std::vector<absl::StatusOr<CreateOutcome>> out;
  absl::Status status = batch_db_->Transact([&](pqxx::work& txn) -> absl::Status {
    SV_RETURN_IF_ERROR(CreateBatchInTransaction(txn, batch, out));
    BatchCommitting();  // The next batch may start its statements.
    return absl::OkStatus();
  });
  if (status.ok()) return out;
  out.assign(batch.size(), status);
  // The database is unreachable (or the COMMIT's outcome unknown): alone,
  // each would fail the same way. Otherwise one element may have failed the
  // batch; alone, each gets its own answer. A create that did commit before
  // answers its first answer again (its request_id), so retrying is safe.
  // Alone, an element carries no audit row (the interceptor writes it with
  // the call's final status), so an audit row never costs a create.
  const bool audits = std::any_of(batch.begin(), batch.end(),
                                  [](const CreateRequest& r) { return r.audit.has_value(); });
  if ((batch.size() == 1 && !audits) || status.code() == absl::StatusCode::kUnavailable) {
    return out;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    std::vector<absl::StatusOr<CreateOutcome>> one;
    CreateRequest request = batch[i];
    request.audit.reset();
    absl::Status alone = batch_db_->Transact(
        [&](pqxx::work& txn) { return CreateBatchInTransaction(txn, {request}, one); });
    out[i] = alone.ok() ? std::move(one[0]) : absl::StatusOr<CreateOutcome>(alone);
  }
  return out;
}

absl::Status Store::CreateBatchInTransaction(pqxx::work& txn,
                                             const std::vector<CreateRequest>& batch,
                                             std::vector<absl::StatusOr<CreateOutcome>>& out) {
  out.assign(batch.size(), absl::InternalError("no verdict"));
  // Tenant order (stable, so a tenant's creates keep their arrival order):
  // concurrent batches then lock tenant rows in one order.
  std::vector<size_t> order(batch.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return batch[a].tenant_id < batch[b].tenant_id;
  });
  std::vector<std::string> ids, tenants, names, models, images, request_ids, fingerprints,
      nows, trial_users, trial_expires;
  std::vector<int> gpu_counts, max_leaves, pending_maxes, credit_minutes;
  std::vector<int64_t> trial_amounts, cap_since_minutes;
  for (size_t i : order) {
    const CreateRequest& r = batch[i];
    ids.push_back(NewId("ins"));
    tenants.push_back(r.tenant_id);
    names.push_back(r.spec.name.empty() ? ids.back() : r.spec.name);
    gpu_counts.push_back(r.spec.gpu_count);
    models.push_back(r.spec.gpu_model);
    images.push_back(r.spec.image);
    request_ids.push_back(r.request_id);
    fingerprints.push_back(r.fingerprint);
    max_leaves.push_back(r.spec.max_leaves);
    nows.push_back(SqlTime(r.now));
    pending_maxes.push_back(r.pending_max_default);
    trial_users.push_back(r.gate.trial_user_id);
    trial_amounts.push_back(r.gate.trial_amount_micros);
    trial_expires.push_back(SqlTime(r.gate.trial_user_id.empty() ? r.now
                                                                 : r.gate.trial_expires_at));
    credit_minutes.push_back(r.gate.credit_minutes);
    cap_since_minutes.push_back(r.gate.spend_cap_since_minute);
  }
  // Migration 0065; a prepared statement, so only its parameters travel.
  auto verdicts = ExecPrepared(
      txn, "sv_create_instances",
      "SELECT ord, verdict, coalesce(existing_id, ''), coalesce(used, 0), "
      "coalesce(allowed, 0) FROM sv_create_instances($1::text[], $2::text[], $3::text[], "
      "$4::integer[], $5::text[], $6::text[], $7::text[], $8::text[], $9::integer[], "
      "$10::timestamptz[], $11::integer[], $12::text[], $13::bigint[], $14::timestamptz[], "
      "$15::integer[], $16::bigint[], $17::integer)",
      TextArrayLiteral(ids), TextArrayLiteral(tenants), TextArrayLiteral(names),
      IntArrayLiteral(gpu_counts), TextArrayLiteral(models), TextArrayLiteral(images),
      TextArrayLiteral(request_ids), TextArrayLiteral(fingerprints), IntArrayLiteral(max_leaves),
      TextArrayLiteral(nows), IntArrayLiteral(pending_maxes), TextArrayLiteral(trial_users),
      IntArrayLiteral(trial_amounts), TextArrayLiteral(trial_expires),
      IntArrayLiteral(credit_minutes), IntArrayLiteral(cap_since_minutes),
      kTenantActiveInstancesMax);
  if (verdicts.size() != batch.size()) {
    return Error(absl::StatusCode::kInternal, "INTERNAL",
                 "sv_create_instances answered a different number of verdicts");
  }
  std::map<std::string, std::vector<size_t>> existing;  // Instance id -> elements.
  std::vector<AuditRow> audits;  // Of the calls that created their instance.
  for (const auto& row : verdicts) {
    const size_t k = row[0].as<size_t>() - 1;  // Position in `order`.
    if (k >= order.size()) {
      return Error(absl::StatusCode::kInternal, "INTERNAL", "sv_create_instances: bad ord");
    }
    const size_t i = order[k];
    const CreateRequest& r = batch[i];
    const std::string outcome = row[1].as<std::string>();
    const std::string existing_id = row[2].as<std::string>();
    const int64_t used = row[3].as<int64_t>();
    const int64_t allowed = row[4].as<int64_t>();
    if (outcome == "CREATED") {
      SV_RETURN_IF_ERROR(InsertInstanceExtras(txn, ids[k], r.spec.extras));
      // The row as written: times are stored to the microsecond; a new row
      // holds no GPUs yet, so it has no placements.
      CreateOutcome created;
      created.inserted = true;
      InstanceRecord& record = created.record;
      record.id = ids[k];
      record.tenant_id = r.tenant_id;
      record.spec = r.spec;
      record.spec.name = names[k];
      record.spec.extras = {};
      record.state = InstanceState::kPending;
      record.state_reason = "waiting for placement";
      record.request_id = r.request_id;
      record.created_at = record.updated_at = TimeFromMicros(absl::ToUnixMicros(r.now));
      if (r.audit.has_value()) {
        audits.push_back(*r.audit);
        created.audited = true;
      }
      out[i] = std::move(created);
    } else if (outcome == "EXISTS") {
      existing[existing_id].push_back(i);  // The first answer, read below.
    } else if (outcome == "REUSED") {
      out[i] = Error(absl::StatusCode::kAlreadyExists, "REQUEST_ID_REUSED",
                     absl::StrCat("request_id '", r.request_id, "' was already used for "
                                  "instance ", existing_id, " with different parameters"));
    } else if (outcome == "INSTANCE_LIMIT_REACHED") {
      out[i] = Error(absl::StatusCode::kResourceExhausted, "INSTANCE_LIMIT_REACHED",
                     absl::StrCat("the tenant already has ", used,
                                  " unfinished instances, the most allowed (", allowed, ")"));
    } else if (outcome == "QUOTA_EXCEEDED") {
      out[i] = Error(absl::StatusCode::kResourceExhausted, "QUOTA_EXCEEDED",
                     absl::StrCat("the tenant has ", used, " pending instances; its "
                                  "quota allows ", allowed));
    } else if (outcome == "TENANT_SUSPENDED") {
      // The batch holds the tenant's lock: the suspension the gate saw is there.
      absl::Status suspended = CheckNotSuspended(txn, r.tenant_id);
      out[i] = suspended.ok() ? Error(absl::StatusCode::kAborted, "TENANT_SUSPENDED",
                                      "the tenant's suspension changed; retry")
                              : suspended;
    } else if (outcome == "INSUFFICIENT_CREDIT" || outcome == "SPEND_CAP_REACHED") {
      CreateOutcome refused;
      refused.refusal = CreateRefusal{outcome, used, allowed};
      out[i] = std::move(refused);
    } else {
      return Error(absl::StatusCode::kInternal, "INTERNAL",
                   "sv_create_instances answered " + outcome);
    }
  }
  // In this transaction: the rows commit with the instances or not at all.
  InsertAuditRows(txn, audits);
  if (existing.empty()) return absl::OkStatus();
  std::vector<std::string> existing_ids;
  for (const auto& [id, elements] : existing) existing_ids.push_back(id);
  std::vector<InstanceRecord> records;
  for (const auto& row : txn.exec_params("SELECT " + kInstanceTableColumns +
                                             " FROM instances WHERE id = ANY($1::text[])",
                                         TextArrayLiteral(existing_ids))) {
    records.push_back(InstanceFromRow(row));
  }
  LoadPlacements(txn, records);
  for (auto& record : records) {
    for (size_t i : existing[record.id]) out[i] = CreateOutcome{record, false, std::nullopt};
    existing.erase(record.id);
  }
  if (!existing.empty()) {
    return Error(absl::StatusCode::kInternal, "INTERNAL", "the instance vanished");
  }
  return absl::OkStatus();
}

absl::StatusOr<InstanceRecord> Store::GetInstance(const std::string& tenant_id,
                                                  const std::string& id) {
  std::vector<InstanceRecord> records;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    records.clear();
    for (const auto& row :
         txn.exec_params("SELECT " + kInstanceTableColumns +
                             " FROM instances WHERE tenant_id = $1 AND id = $2",
                         tenant_id, id)) {
      records.push_back(InstanceFromRow(row));
    }
    LoadPlacements(txn, records);
    return absl::OkStatus();
  }));
  if (records.empty()) return NotFound(id);
  return records[0];
}

absl::StatusOr<std::vector<InstanceRecord>> Store::ListInstances(
    const std::string& tenant_id, const std::optional<ListCursor>& after, int limit,
    bool show_deleted) {
  assert(limit > 0 && limit <= 1001);
  std::vector<InstanceRecord> records;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    records.clear();
    const std::string after_time =
        SqlTime(TimeFromMicros(after ? after->created_at_micros : 0));
    const std::string after_id = after ? after->id : "";
    auto rows = txn.exec_params(
        "SELECT " + kInstanceTableColumns +
            " FROM instances WHERE tenant_id = $1 AND ($2 OR state <> 'DELETED') "
            "AND ($3 OR (created_at, id) > ($4::timestamptz, $5)) "
            "ORDER BY created_at, id LIMIT $6",
        tenant_id, show_deleted, !after.has_value(), after_time, after_id, limit);
    for (const auto& row : rows) records.push_back(InstanceFromRow(row));
    LoadPlacements(txn, records);
    return absl::OkStatus();
  }));
  return records;
}

absl::StatusOr<std::vector<InstanceRecord>> Store::ListFleetInstances(
    const FleetInstanceFilter& filter, const std::optional<ListCursor>& after, int limit) {
  assert(limit > 0 && limit <= 1001);
  std::vector<InstanceRecord> records;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    records.clear();
    auto known = txn.exec_params(
        "SELECT $1 = '' OR EXISTS (SELECT 1 FROM tenants WHERE id = $1), "
        "$2 = '' OR EXISTS (SELECT 1 FROM nodes WHERE name = $2)",
        filter.tenant_id, filter.node_name);
    if (!known[0][0].as<bool>()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND",
                   absl::StrCat("no tenant has id ", filter.tenant_id));
    }
    if (!known[0][1].as<bool>()) {
      return Error(absl::StatusCode::kNotFound, "NODE_NOT_FOUND",
                   absl::StrCat("no node is named ", filter.node_name));
    }
    // A node's instances come from its reservations (at most 8); a
    // tenant's from instances_tenant_page; neither: a scan of the table
    // without the deleted rows, which is what an operator asks for rarely.
    auto rows = txn.exec_params(
        "SELECT " + kInstanceTableColumns +
            " FROM instances WHERE ($1 = '' OR tenant_id = $1) "
            "AND ($2 = '' OR id IN (SELECT r.instance_id FROM gpu_reservations r "
            "  JOIN nodes n ON n.id = r.node_id WHERE n.name = $2)) "
            "AND (CASE WHEN $3 = '' THEN state <> 'DELETED' ELSE state = $3 END) "
            "AND ($4 OR (created_at, id) > ($5::timestamptz, $6)) "
            "ORDER BY created_at, id LIMIT $7",
        filter.tenant_id, filter.node_name, filter.state, !after.has_value(),
        SqlTime(TimeFromMicros(after ? after->created_at_micros : 0)), after ? after->id : "",
        limit);
    for (const auto& row : rows) records.push_back(InstanceFromRow(row));
    LoadPlacements(txn, records);
    return absl::OkStatus();
  }));
  return records;
}

absl::StatusOr<InstanceRecord> Store::DeleteInstance(const std::string& tenant_id,
                                                     const std::string& id,
                                                     absl::Time now) {
  std::vector<InstanceRecord> records;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    records.clear();
    // The row lock, the GPUs freed, the new state and its event in one round
    // trip (migration 0065); the answer is the row as committed (a deleted
    // instance holds no GPUs: no placements), or as it was when it was
    // already DELETED.
    for (const auto& row :
         ExecPrepared(txn, "sv_delete_instance",
                      "SELECT " + kInstanceColumns +
                          " FROM sv_delete_instance($1, $2, $3::timestamptz)",
                      tenant_id, id, SqlTime(now))) {
      records.push_back(InstanceFromRow(row));
    }
    return absl::OkStatus();
  }));
  if (records.empty()) return NotFound(id);
  return records[0];
}

absl::StatusOr<InstanceRecord> Store::StopInstance(const std::string& tenant_id,
                                                   const std::string& id,
                                                   const std::string& reason,
                                                   absl::Time now) {
  bool found = false;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    std::optional<std::string> state = LockState(txn, tenant_id, id);
    found = state.has_value();
    if (!found) return absl::OkStatus();
    const std::string from = *state;
    if (from == "STOPPED") return absl::OkStatus();
    if (from == "DELETED" || from == "FAILED") return Finished(id, from, "stopped");
    txn.exec_params("DELETE FROM gpu_reservations WHERE instance_id = $1", id);
    txn.exec_params(
        "UPDATE instances SET state = 'STOPPED', state_reason = $2, "
        "updated_at = $3::timestamptz, running_since = NULL, queue_position = 0 WHERE id = $1",
        id, reason, SqlTime(now));
    RecordEvent(txn, id, now, from, "STOPPED", reason);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (!found) return NotFound(id);
  return GetInstance(tenant_id, id);
}

absl::Status CheckCreateGateLocked(pqxx::work& txn, const std::string& id, int gpu_count,
                                   const CreateGate& gate, absl::Time now,
                                   std::optional<CreateRefusal>* refusal) {
  if (gate.credit_minutes < 0 && gate.spend_cap_since_minute < 0) return absl::OkStatus();
  pqxx::row g = txn.exec_params1(
      "SELECT g.verdict, g.used, g.allowed FROM instances i, LATERAL sv_create_gates("
      "ARRAY[i.tenant_id], ARRAY[CASE WHEN $2 < 0 THEN i.gpu_count ELSE $2 END], "
      "ARRAY[i.gpu_model], ARRAY[$3::timestamptz], ARRAY[$4::integer], ARRAY[$5::bigint]) g "
      "WHERE i.id = $1",
      id, gpu_count, SqlTime(now), gate.credit_minutes, gate.spend_cap_since_minute);
  const std::string verdict = g[0].as<std::string>();
  if (verdict == "OK") return absl::OkStatus();
  if (refusal != nullptr) {
    *refusal = CreateRefusal{verdict, g[1].is_null() ? 0 : g[1].as<int64_t>(),
                             g[2].is_null() ? 0 : g[2].as<int64_t>()};
  }
  return Error(verdict == "SPEND_CAP_REACHED" ? absl::StatusCode::kResourceExhausted
                                              : absl::StatusCode::kFailedPrecondition,
               verdict, "refused by the create's gate: " + verdict);
}

absl::StatusOr<InstanceRecord> Store::StartInstance(const std::string& tenant_id,
                                                    const std::string& id, absl::Time now,
                                                    int pending_max_default,
                                                    bool credit_checked, const CreateGate& gate,
                                                    std::optional<CreateRefusal>* refusal) {
  bool found = false;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // The tenant's lock first, as a create takes it: the counts below stay
    // true until this commits.
    txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE", tenant_id);
    std::optional<std::string> state = LockState(txn, tenant_id, id);
    found = state.has_value();
    if (!found) return absl::OkStatus();
    const std::string from = *state;
    if (from == "DELETED" || from == "FAILED") return Finished(id, from, "started");
    if (from != "STOPPED") return absl::OkStatus();
    if (!credit_checked) {
      return Error(absl::StatusCode::kAborted, "INSTANCE_CHANGED",
                   absl::StrCat("instance ", id, " was stopped while this start was being "
                                "checked; start it again"));
    }
    SV_RETURN_IF_ERROR(CheckNotSuspended(txn, tenant_id));
    // The create's limits, counted exactly (a start is rare; the create
    // batch's bounds, migration 0092, are raised by this update's trigger).
    pqxx::row limits = txn.exec_params1(
        "SELECT count(*) FILTER (WHERE x.state NOT IN ('STOPPED', 'DELETED', 'FAILED')), "
        "count(*) FILTER (WHERE x.state = 'PENDING'), "
        "coalesce((SELECT q.instances_max FROM tenant_quotas q WHERE q.tenant_id = $1), $2), "
        "coalesce((SELECT q.pending_count_max FROM tenant_quotas q WHERE q.tenant_id = $1), $3) "
        "FROM instances x WHERE x.tenant_id = $1 "
        "AND x.state NOT IN ('STOPPED', 'DELETED', 'FAILED')",
        tenant_id, kTenantActiveInstancesMax, pending_max_default);
    const int64_t unfinished = limits[0].as<int64_t>();
    const int64_t pending = limits[1].as<int64_t>();
    const int64_t unfinished_max = limits[2].as<int64_t>();
    const int64_t pending_max = limits[3].as<int64_t>();
    if (unfinished >= unfinished_max) {
      return Error(absl::StatusCode::kResourceExhausted, "INSTANCE_LIMIT_REACHED",
                   absl::StrCat("the tenant already has ", unfinished,
                                " unfinished instances, the most allowed (", unfinished_max,
                                ")"));
    }
    if (pending_max_default >= 0 && pending >= pending_max) {
      return Error(absl::StatusCode::kResourceExhausted, "QUOTA_EXCEEDED",
                   absl::StrCat("the tenant has ", pending, " pending instances; its "
                                "quota allows ", pending_max));
    }
    // The create's credit gate and spend cap, under the tenant's lock: the
    // caller's check ran before it, so concurrent starts (or a start and a
    // create) each counted the others as stopped and all passed; and the
    // cap, which refuses creates, did not hold a start at all.
    SV_RETURN_IF_ERROR(CheckCreateGateLocked(txn, id, -1, gate, now, refusal));
    // Back of the queue, as a new request would be, with no position until
    // a pass gives it one (it showed the one it had before it was stopped).
    txn.exec_params(
        "UPDATE instances SET state = 'PENDING', state_reason = 'waiting for placement', "
        "updated_at = $2::timestamptz, queue_seq = nextval('instances_queue_seq_seq'), "
        "queue_position = 0 WHERE id = $1",
        id, SqlTime(now));
    RecordEvent(txn, id, now, from, "PENDING", "started by the user");
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (!found) return NotFound(id);
  return GetInstance(tenant_id, id);
}

absl::StatusOr<int> Store::AdvanceSimulatedStarts(absl::Time now) {
  int moved = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    moved = 0;
    const std::string only_simulated =
        " AND NOT EXISTS (SELECT 1 FROM gpu_reservations r JOIN nodes n "
        "ON n.id = r.node_id WHERE r.instance_id = i.id AND NOT n.simulated)";
    // One step of the lifecycle for every simulated instance in `from`.
    auto advance = [&](const char* from, const char* to, const char* reason,
                       const std::string& also_set) {
      auto moved_rows = txn.exec_params(
          absl::StrCat("UPDATE instances i SET state = '", to, "', ", also_set,
                       "updated_at = $1::timestamptz, state_reason = $2 WHERE state = '", from,
                       "'", only_simulated, " RETURNING id"),
          SqlTime(now), reason);
      for (const auto& row : moved_rows) {
        RecordEvent(txn, row[0].as<std::string>(), now, std::string(from), to, reason);
      }
      return static_cast<int>(moved_rows.size());
    };
    // RUNNING first, so that each call moves an instance one step.
    const int running = advance("STARTING", "RUNNING", "every node confirmed the start",
                                "running_since = $1::timestamptz, ");
    const int starting =
        advance("SCHEDULED", "STARTING", "the node agents were told to start it", "");
    moved = running + starting;
    return absl::OkStatus();
  }));
  return moved;
}

}  // namespace sv::store
