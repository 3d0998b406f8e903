#include "store/store.h"

#include <map>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/status.h"
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

const std::string kInstanceColumns = absl::StrCat(
    "id, tenant_id, name, gpu_count, gpu_model, image, state, state_reason, "
    "request_id, ", MicrosOf("created_at"), ", ", MicrosOf("updated_at"),
    ", request_fingerprint, max_leaves");

InstanceRecord InstanceFromRow(const pqxx::row& row) {
  InstanceRecord r;
  r.id = row[0].as<std::string>();
  r.tenant_id = row[1].as<std::string>();
  r.spec.name = row[2].as<std::string>();
  r.spec.gpu_count = row[3].as<int>();
  r.spec.gpu_model = row[4].as<std::string>();
  r.spec.image = row[5].as<std::string>();
  r.state = ParseState(row[6].as<std::string>());
  r.state_reason = row[7].as<std::string>();
  r.request_id = row[8].as<std::string>();
  r.created_at = TimeFromMicros(row[9].as<int64_t>());
  r.updated_at = TimeFromMicros(row[10].as<int64_t>());
  r.spec.max_leaves = row[12].as<int>();
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

void RecordEvent(pqxx::work& txn, const std::string& instance_id, absl::Time at,
                 const std::optional<std::string>& from, const std::string& to,
                 const std::string& reason) {
  txn.exec_params(
      "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
      "VALUES ($1, $2::timestamptz, $3, $4, $5)",
      instance_id, SqlTime(at), from, to, reason);
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
    // reads as unknown, except the platform admin's.
    auto rows = txn.exec_params(
        "SELECT k.salt, k.secret_hash, k.revoked_at IS NOT NULL, u.id, u.email, u.role, "
        "t.id, t.name, coalesce(m.role, 'viewer'), k.scope, "
        + MicrosOf("k.expires_at") + ", m.role IS NOT NULL "
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
  InstanceRecord result;
  bool fresh = false;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    fresh = false;
    // The tenant's row lock, the idempotency lookup, both limits, the row
    // and its first event: one round trip (migration 0036). The lock is held
    // only for that call and the COMMIT.
    const std::string id = NewId("ins");
    const std::string name = spec.name.empty() ? id : spec.name;
    auto verdict = txn.exec_params1(
        "SELECT verdict, coalesce(existing_id, ''), coalesce(used, 0), coalesce(allowed, 0) "
        "FROM sv_create_instance($1, $2, $3, $4, $5, $6, $7, $8, $9::timestamptz, $10, $11, "
        "$12)",
        id, tenant_id, name, spec.gpu_count, spec.gpu_model, spec.image, request_id,
        fingerprint, SqlTime(now), spec.max_leaves, kTenantActiveInstancesMax,
        pending_max_default);
    const std::string outcome = verdict[0].as<std::string>();
    const std::string existing_id = verdict[1].as<std::string>();
    const int64_t used = verdict[2].as<int64_t>();
    const int allowed = verdict[3].as<int>();
    if (outcome == "INSTANCE_LIMIT_REACHED") {
      return Error(absl::StatusCode::kResourceExhausted, "INSTANCE_LIMIT_REACHED",
                   absl::StrCat("the tenant already has ", used,
                                " unfinished instances, the most allowed (", allowed, ")"));
    }
    if (outcome == "QUOTA_EXCEEDED") {
      return Error(absl::StatusCode::kResourceExhausted, "QUOTA_EXCEEDED",
                   absl::StrCat("the tenant has ", used, " pending instances; its "
                                "quota allows ", allowed));
    }
    if (outcome == "REUSED") {
      return Error(absl::StatusCode::kAlreadyExists, "REQUEST_ID_REUSED",
                   absl::StrCat("request_id '", request_id, "' was already used for "
                                "instance ", existing_id, " with different parameters"));
    }
    if (outcome == "EXISTS") {
      // The same request_id again: the first answer.
      std::vector<InstanceRecord> records;
      for (const auto& row : txn.exec_params(
               "SELECT " + kInstanceColumns + " FROM instances WHERE id = $1", existing_id)) {
        records.push_back(InstanceFromRow(row));
      }
      if (records.empty()) {
        return Error(absl::StatusCode::kInternal, "INTERNAL", "the instance vanished");
      }
      LoadPlacements(txn, records);
      result = std::move(records[0]);
      return absl::OkStatus();
    }
    if (outcome != "CREATED") {
      return Error(absl::StatusCode::kInternal, "INTERNAL",
                   "sv_create_instance answered " + outcome);
    }
    SV_RETURN_IF_ERROR(InsertInstanceExtras(txn, id, spec.extras));
    // The row as written: times are stored to the microsecond; a new row
    // holds no GPUs yet, so it has no placements.
    result = InstanceRecord{};
    result.id = id;
    result.tenant_id = tenant_id;
    result.spec = spec;
    result.spec.name = name;
    result.spec.extras = {};
    result.state = InstanceState::kPending;
    result.state_reason = "waiting for placement";
    result.request_id = request_id;
    result.created_at = result.updated_at = TimeFromMicros(absl::ToUnixMicros(now));
    fresh = true;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (inserted != nullptr) *inserted = fresh;
  return result;
}

absl::StatusOr<InstanceRecord> Store::GetInstance(const std::string& tenant_id,
                                                  const std::string& id) {
  std::vector<InstanceRecord> records;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    records.clear();
    for (const auto& row :
         txn.exec_params("SELECT " + kInstanceColumns +
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
        "SELECT " + kInstanceColumns +
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

absl::StatusOr<InstanceRecord> Store::DeleteInstance(const std::string& tenant_id,
                                                     const std::string& id,
                                                     absl::Time now) {
  std::vector<InstanceRecord> records;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    records.clear();
    std::optional<std::string> state = LockState(txn, tenant_id, id);
    if (!state.has_value()) return absl::OkStatus();
    const std::string from = *state;
    if (from == "DELETED") {
      for (const auto& row : txn.exec_params(
               "SELECT " + kInstanceColumns + " FROM instances WHERE id = $1", id)) {
        records.push_back(InstanceFromRow(row));
      }
      return absl::OkStatus();
    }
    txn.exec_params("DELETE FROM gpu_reservations WHERE instance_id = $1", id);
    // The new state and its event in one round trip; the answer is the row
    // as committed (a deleted instance holds no GPUs: no placements).
    records.push_back(InstanceFromRow(txn.exec_params1(
        "WITH u AS (UPDATE instances SET state = 'DELETED', "
        "state_reason = 'deleted by the user', updated_at = $2::timestamptz, "
        "running_since = NULL WHERE id = $1 RETURNING " + kInstanceColumns + "), "
        "ev AS (INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
        "SELECT id, $2::timestamptz, $3, 'DELETED', 'deleted by the user' FROM u) "
        "SELECT * FROM u",
        id, SqlTime(now), from)));
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
        "updated_at = $3::timestamptz, running_since = NULL WHERE id = $1",
        id, reason, SqlTime(now));
    RecordEvent(txn, id, now, from, "STOPPED", reason);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (!found) return NotFound(id);
  return GetInstance(tenant_id, id);
}

absl::StatusOr<InstanceRecord> Store::StartInstance(const std::string& tenant_id,
                                                    const std::string& id, absl::Time now) {
  bool found = false;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    std::optional<std::string> state = LockState(txn, tenant_id, id);
    found = state.has_value();
    if (!found) return absl::OkStatus();
    const std::string from = *state;
    if (from == "DELETED" || from == "FAILED") return Finished(id, from, "started");
    if (from != "STOPPED") return absl::OkStatus();
    // Back of the queue, as a new request would be.
    txn.exec_params(
        "UPDATE instances SET state = 'PENDING', state_reason = 'waiting for placement', "
        "updated_at = $2::timestamptz, queue_seq = nextval('instances_queue_seq_seq') "
        "WHERE id = $1",
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
