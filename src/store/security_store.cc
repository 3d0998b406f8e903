#include "store/security_store.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "store/charges_sql.h"
#include "store/sql_arrays.h"

namespace sv::store {
namespace {

const std::string kKeyColumns = absl::StrCat(
    "k.id, k.user_id, u.email, k.tenant_id, k.name, k.scope, ", MicrosOf("k.created_at"), ", ",
    MicrosOf("k.expires_at"), ", ", MicrosOf("k.revoked_at"), ", coalesce(k.replaced_by, '')");

ApiKeyRow KeyFromRow(const pqxx::row& row) {
  ApiKeyRow k;
  k.id = row[0].as<std::string>();
  k.user_id = row[1].as<std::string>();
  k.user_email = row[2].as<std::string>();
  k.tenant_id = row[3].as<std::string>();
  k.name = row[4].as<std::string>();
  k.scope = row[5].as<std::string>() == "read_only" ? KeyScope::kReadOnly : KeyScope::kFull;
  k.created_at = TimeFromMicros(row[6].as<int64_t>());
  if (!row[7].is_null()) k.expires_at = TimeFromMicros(row[7].as<int64_t>());
  if (!row[8].is_null()) k.revoked_at = TimeFromMicros(row[8].as<int64_t>());
  k.replaced_by = row[9].as<std::string>();
  return k;
}

std::optional<std::string> OptionalTime(const std::optional<absl::Time>& t) {
  if (!t.has_value()) return std::nullopt;
  return SqlTime(*t);
}

void InsertKey(pqxx::work& txn, const NewApiKeyRow& key, absl::Time now) {
  txn.exec_params(
      "INSERT INTO api_keys (id, user_id, tenant_id, salt, secret_hash, created_at, name, "
      "scope, expires_at) VALUES ($1, $2, $3, $4, $5, $6::timestamptz, $7, $8, "
      "$9::timestamptz)",
      key.id, key.user_id, key.tenant_id, key.salt, key.secret_hash, SqlTime(now), key.name,
      KeyScopeName(key.scope), OptionalTime(key.expires_at));
}

// Another user's key is found only when `user_id` is empty, and an
// operator's only for an operator (`caller_is_operator`).
std::optional<ApiKeyRow> LockKey(pqxx::work& txn, const std::string& tenant_id,
                                 const std::string& user_id, bool caller_is_operator,
                                 const std::string& key_id) {
  auto rows = txn.exec_params(
      "SELECT " + kKeyColumns +
          " FROM api_keys k JOIN users u ON u.id = k.user_id "
          "WHERE k.tenant_id = $1 AND k.id = $2 AND ($3 = '' OR k.user_id = $3) "
          "AND (k.user_id = $3 OR $4 OR u.role <> 'operator') "
          "FOR UPDATE OF k",
      tenant_id, key_id, user_id, caller_is_operator);
  if (rows.empty()) return std::nullopt;
  return KeyFromRow(rows[0]);
}

absl::Status KeyNotFound(const std::string& key_id) {
  return Error(absl::StatusCode::kNotFound, "API_KEY_NOT_FOUND",
               absl::StrCat("API key ", key_id.substr(0, 64), " not found"));
}

absl::Status MemberNotFound(const std::string& user_id) {
  return Error(absl::StatusCode::kNotFound, "USER_NOT_FOUND",
               absl::StrCat("user ", user_id.substr(0, 64), " is not a member of the tenant"));
}

// Operators' memberships change only through AddOperator and
// RemoveOperator.
absl::Status CheckNotOperator(pqxx::work& txn, const std::string& user_id) {
  if (txn.exec_params("SELECT 1 FROM users WHERE id = $1 AND role = 'operator'", user_id)
          .empty()) {
    return absl::OkStatus();
  }
  return Error(absl::StatusCode::kFailedPrecondition, "OPERATOR_ACCOUNT",
               absl::StrCat("user ", user_id, " is a platform operator: operators are "
                            "removed with RemoveOperator (svctl admin operators remove)"));
}

MemberRow MemberFromRow(const pqxx::row& row) {
  return {row[0].as<std::string>(), row[1].as<std::string>(),
          ParseTenantRole(row[2].as<std::string>()).value_or(TenantRole::kViewer),
          TimeFromMicros(row[3].as<int64_t>())};
}

const std::string kMemberColumns =
    absl::StrCat("m.user_id, u.email, m.role, ", MicrosOf("m.created_at"));

}  // namespace

// ---- Keys ---------------------------------------------------------------------

absl::Status SecurityStore::CreateApiKey(const NewApiKeyRow& key, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    InsertKey(txn, key, now);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<ApiKeyRow>> SecurityStore::ListApiKeys(const std::string& tenant_id,
                                                                  const std::string& user_id,
                                                                  bool caller_is_operator) {
  std::vector<ApiKeyRow> keys;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    keys.clear();
    auto rows = txn.exec_params("SELECT " + kKeyColumns +
                                    " FROM api_keys k JOIN users u ON u.id = k.user_id "
                                    "WHERE k.tenant_id = $1 AND ($2 = '' OR k.user_id = $2) "
                                    "AND (k.user_id = $2 OR $3 OR u.role <> 'operator') "
                                    "ORDER BY k.created_at DESC, k.id LIMIT 1000",
                                tenant_id, user_id, caller_is_operator);
    for (const auto& row : rows) keys.push_back(KeyFromRow(row));
    return absl::OkStatus();
  }));
  return keys;
}

absl::StatusOr<ApiKeyRow> SecurityStore::RevokeApiKey(const std::string& tenant_id,
                                                      const std::string& user_id,
                                                      bool caller_is_operator,
                                                      const std::string& key_id,
                                                      absl::Time now) {
  ApiKeyRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto key = LockKey(txn, tenant_id, user_id, caller_is_operator, key_id);
    if (!key.has_value()) return KeyNotFound(key_id);
    txn.exec_params(
        "UPDATE api_keys SET revoked_at = $2::timestamptz WHERE id = $1 AND revoked_at IS NULL",
        key_id, SqlTime(now));
    result = *LockKey(txn, tenant_id, user_id, caller_is_operator, key_id);
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<ApiKeyRow> SecurityStore::RotateApiKey(const std::string& tenant_id,
                                                      const std::string& user_id,
                                                      bool caller_is_operator,
                                                      const std::string& key_id,
                                                      NewApiKeyRow replacement,
                                                      absl::Duration overlap, absl::Time now) {
  ApiKeyRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto old = LockKey(txn, tenant_id, user_id, caller_is_operator, key_id);
    if (!old.has_value()) return KeyNotFound(key_id);
    if (old->revoked_at.has_value() || !old->replaced_by.empty() ||
        (old->expires_at.has_value() && *old->expires_at <= now)) {
      return Error(absl::StatusCode::kFailedPrecondition, "API_KEY_NOT_ACTIVE",
                   absl::StrCat("API key ", key_id, " is revoked, expired or already rotated"));
    }
    replacement.user_id = old->user_id;
    replacement.tenant_id = old->tenant_id;
    replacement.scope = old->scope;
    if (replacement.name.empty()) replacement.name = old->name;
    if (!replacement.expires_at.has_value()) replacement.expires_at = old->expires_at;
    InsertKey(txn, replacement, now);
    if (overlap <= absl::ZeroDuration()) {
      txn.exec_params(
          "UPDATE api_keys SET revoked_at = $2::timestamptz, replaced_by = $3 WHERE id = $1",
          key_id, SqlTime(now), replacement.id);
    } else {
      txn.exec_params(
          "UPDATE api_keys SET replaced_by = $3, expires_at = "
          "least(coalesce(expires_at, 'infinity'), $2::timestamptz) WHERE id = $1",
          key_id, SqlTime(now + overlap), replacement.id);
    }
    auto rows = txn.exec_params("SELECT " + kKeyColumns +
                                    " FROM api_keys k JOIN users u ON u.id = k.user_id "
                                    "WHERE k.id = $1",
                                replacement.id);
    result = KeyFromRow(rows[0]);
    return absl::OkStatus();
  }));
  return result;
}

// ---- Members ------------------------------------------------------------------

absl::StatusOr<std::vector<MemberRow>> SecurityStore::ListMembers(const std::string& tenant_id) {
  std::vector<MemberRow> members;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    members.clear();
    auto rows = txn.exec_params("SELECT " + kMemberColumns +
                                    " FROM memberships m JOIN users u ON u.id = m.user_id "
                                    "WHERE m.tenant_id = $1 ORDER BY m.created_at, u.email "
                                    "LIMIT 1000",
                                tenant_id);
    for (const auto& row : rows) members.push_back(MemberFromRow(row));
    return absl::OkStatus();
  }));
  return members;
}

absl::StatusOr<MemberRow> SecurityStore::AddMember(const std::string& tenant_id,
                                                   const std::string& email, TenantRole role,
                                                   NewApiKeyRow first_key, absl::Time now) {
  MemberRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    txn.exec_params(
        "INSERT INTO users (id, tenant_id, email, role, created_at) "
        "VALUES ($1, $2, $3, 'member', $4::timestamptz) ON CONFLICT (email) DO NOTHING",
        NewId("usr"), tenant_id, email, SqlTime(now));
    auto user = txn.exec_params1(
        "SELECT id, role, tenant_id FROM users WHERE email = $1 FOR UPDATE", email);
    const std::string user_id = user[0].as<std::string>();
    if (user[1].as<std::string>() == "operator" && user[2].as<std::string>() != tenant_id) {
      // A platform operator's account stays in the operator's tenant.
      return Error(absl::StatusCode::kFailedPrecondition, "USER_IS_OPERATOR",
                   absl::StrCat(email, " is a platform operator's account; an operator "
                                "cannot be a member of a tenant"));
    }
    if (!txn.exec_params("SELECT 1 FROM users WHERE tenant_id = $1 AND role = 'operator' "
                         "LIMIT 1",
                         tenant_id)
             .empty()) {
      // An owner there could otherwise manage the operators' keys.
      return Error(absl::StatusCode::kFailedPrecondition, "OPERATORS_TENANT",
                   "the operators' tenant has operators only: add one with AddOperator "
                   "(svctl admin operators add)");
    }
    auto inserted = txn.exec_params(
        "INSERT INTO memberships (tenant_id, user_id, role, created_at) "
        "VALUES ($1, $2, $3, $4::timestamptz) ON CONFLICT DO NOTHING RETURNING 1",
        tenant_id, user_id, TenantRoleName(role), SqlTime(now));
    if (inserted.empty()) {
      return Error(absl::StatusCode::kAlreadyExists, "ALREADY_A_MEMBER",
                   absl::StrCat(email, " is already a member of the tenant"));
    }
    first_key.user_id = user_id;
    first_key.tenant_id = tenant_id;
    InsertKey(txn, first_key, now);
    result = {user_id, email, role, now};
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<MemberRow> SecurityStore::SetMemberRole(const std::string& tenant_id,
                                                       const std::string& user_id,
                                                       TenantRole role) {
  MemberRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // Lock every owner row of the tenant so two demotions cannot race past
    // the last-owner check.
    auto owners = txn.exec_params(
        "SELECT user_id FROM memberships WHERE tenant_id = $1 AND role = 'owner' FOR UPDATE",
        tenant_id);
    auto current = txn.exec_params(
        "SELECT role FROM memberships WHERE tenant_id = $1 AND user_id = $2 FOR UPDATE",
        tenant_id, user_id);
    if (current.empty()) return MemberNotFound(user_id);
    SV_RETURN_IF_ERROR(CheckNotOperator(txn, user_id));
    if (current[0][0].as<std::string>() == "owner" && role != TenantRole::kOwner &&
        owners.size() <= 1) {
      return Error(absl::StatusCode::kFailedPrecondition, "LAST_OWNER",
                   "the tenant must keep at least one owner");
    }
    txn.exec_params("UPDATE memberships SET role = $3 WHERE tenant_id = $1 AND user_id = $2",
                    tenant_id, user_id, TenantRoleName(role));
    if (role == TenantRole::kViewer || role == TenantRole::kBilling) {
      // A role without instance rights logs in to no instance either: the
      // SSH keys the user added go, as on removal (the trigger of
      // migration 0108 tells the nodes).
      txn.exec_params("DELETE FROM ssh_keys WHERE tenant_id = $1 AND created_by = $2",
                      tenant_id, user_id);
    }
    auto rows = txn.exec_params("SELECT " + kMemberColumns +
                                    " FROM memberships m JOIN users u ON u.id = m.user_id "
                                    "WHERE m.tenant_id = $1 AND m.user_id = $2",
                                tenant_id, user_id);
    result = MemberFromRow(rows[0]);
    return absl::OkStatus();
  }));
  return result;
}

absl::Status SecurityStore::RemoveMember(const std::string& tenant_id,
                                         const std::string& user_id, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto owners = txn.exec_params(
        "SELECT user_id FROM memberships WHERE tenant_id = $1 AND role = 'owner' FOR UPDATE",
        tenant_id);
    auto current = txn.exec_params(
        "SELECT role FROM memberships WHERE tenant_id = $1 AND user_id = $2 FOR UPDATE",
        tenant_id, user_id);
    if (current.empty()) return MemberNotFound(user_id);
    SV_RETURN_IF_ERROR(CheckNotOperator(txn, user_id));
    if (current[0][0].as<std::string>() == "owner" && owners.size() <= 1) {
      return Error(absl::StatusCode::kFailedPrecondition, "LAST_OWNER",
                   "the tenant must keep at least one owner");
    }
    txn.exec_params("DELETE FROM memberships WHERE tenant_id = $1 AND user_id = $2", tenant_id,
                    user_id);
    txn.exec_params(
        "UPDATE api_keys SET revoked_at = $3::timestamptz "
        "WHERE tenant_id = $1 AND user_id = $2 AND revoked_at IS NULL",
        tenant_id, user_id, SqlTime(now));
    // The SSH keys the member added go too: a removed member logs in to no
    // instance (the trigger of migration 0108 tells the nodes).
    txn.exec_params("DELETE FROM ssh_keys WHERE tenant_id = $1 AND created_by = $2", tenant_id,
                    user_id);
    return absl::OkStatus();
  });
}

// ---- Audit --------------------------------------------------------------------

void InsertAuditRows(pqxx::work& txn, const std::vector<AuditRow>& rows) {
  if (rows.empty()) return;
  std::vector<std::string> at, tenant, user, email, key, method, request, code, reason, peer;
  for (const auto& r : rows) {
    at.push_back(SqlTime(r.at));
    tenant.push_back(r.tenant_id);
    user.push_back(r.user_id);
    email.push_back(r.user_email);
    key.push_back(r.api_key_id);
    method.push_back(r.method);
    request.push_back(r.request_id);
    code.push_back(r.code);
    reason.push_back(r.reason);
    peer.push_back(r.peer);
  }
  ExecPrepared(txn, "sv_insert_audit_rows",
               "INSERT INTO audit_log (at, tenant_id, user_id, user_email, api_key_id, method, "
               "request_id, code, reason, peer) SELECT * FROM unnest($1::timestamptz[], "
               "$2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], "
               "$8::text[], $9::text[], $10::text[])",
               TextArrayLiteral(at), TextArrayLiteral(tenant), TextArrayLiteral(user),
               TextArrayLiteral(email), TextArrayLiteral(key), TextArrayLiteral(method),
               TextArrayLiteral(request), TextArrayLiteral(code), TextArrayLiteral(reason),
               TextArrayLiteral(peer));
}

absl::Status SecurityStore::AppendAudit(const AuditRow& row) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    txn.exec_params(
        "INSERT INTO audit_log (at, tenant_id, user_id, user_email, api_key_id, method, "
        "request_id, code, reason, peer) VALUES ($1::timestamptz, $2, $3, $4, $5, $6, $7, $8, "
        "$9, $10)",
        SqlTime(row.at), row.tenant_id, row.user_id, row.user_email, row.api_key_id,
        row.method, row.request_id, row.code, row.reason, row.peer);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<AuditRow>> SecurityStore::ListAudit(const AuditFilter& filter) {
  std::vector<AuditRow> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    out.clear();
    auto rows = txn.exec_params(
        "SELECT id, " + MicrosOf("at") +
            ", tenant_id, user_id, user_email, api_key_id, method, request_id, code, reason, "
            "peer FROM audit_log WHERE ($1 = '' OR tenant_id = $1) AND ($2 = 0 OR id < $2) "
            "ORDER BY id DESC LIMIT $3",
        filter.tenant_id, filter.before_id, filter.limit);
    for (const auto& r : rows) {
      out.push_back({r[0].as<int64_t>(), TimeFromMicros(r[1].as<int64_t>()),
                     r[2].as<std::string>(), r[3].as<std::string>(), r[4].as<std::string>(),
                     r[5].as<std::string>(), r[6].as<std::string>(), r[7].as<std::string>(),
                     r[8].as<std::string>(), r[9].as<std::string>(), r[10].as<std::string>()});
    }
    return absl::OkStatus();
  }));
  return out;
}

// ---- Spend cap ------------------------------------------------------------------

absl::StatusOr<std::optional<int64_t>> SecurityStore::GetSpendCap(const std::string& tenant_id) {
  std::optional<int64_t> cap;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    cap.reset();
    auto rows = txn.exec_params(
        "SELECT monthly_spend_cap_micros FROM tenant_budgets WHERE tenant_id = $1", tenant_id);
    if (!rows.empty()) cap = rows[0][0].as<int64_t>();
    return absl::OkStatus();
  }));
  return cap;
}

absl::Status SecurityStore::SetSpendCap(const std::string& tenant_id,
                                        std::optional<int64_t> cap_micros, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1", tenant_id).empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "tenant not found");
    }
    if (!cap_micros.has_value()) {
      txn.exec_params("DELETE FROM tenant_budgets WHERE tenant_id = $1", tenant_id);
      return absl::OkStatus();
    }
    txn.exec_params(
        "INSERT INTO tenant_budgets (tenant_id, monthly_spend_cap_micros, updated_at) "
        "VALUES ($1, $2, $3::timestamptz) ON CONFLICT (tenant_id) DO UPDATE SET "
        "monthly_spend_cap_micros = EXCLUDED.monthly_spend_cap_micros, "
        "updated_at = EXCLUDED.updated_at",
        tenant_id, *cap_micros, SqlTime(now));
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> SecurityStore::SpentSince(const std::string& tenant_id,
                                                  absl::Time since) {
  int64_t spent = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    spent = txn.exec_params1(absl::StrCat("SELECT ", TenantSpentSinceSql("$1", "$2"), "::bigint"),
                             tenant_id, absl::ToUnixSeconds(since) / 60)[0]
                .as<int64_t>();
    return absl::OkStatus();
  }));
  return spent;
}

absl::StatusOr<std::vector<std::string>> SecurityStore::TenantsOverSpendCap(
    absl::Time month_start) {
  std::vector<std::string> tenants;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    tenants.clear();
    auto rows = txn.exec_params(
        absl::StrCat("SELECT b.tenant_id FROM tenant_budgets b WHERE b.monthly_spend_cap_micros <= ",
                     TenantSpentSinceSql("b.tenant_id", "$1"), " ORDER BY b.tenant_id"),
        absl::ToUnixSeconds(month_start) / 60);
    for (const auto& row : rows) tenants.push_back(row[0].as<std::string>());
    return absl::OkStatus();
  }));
  return tenants;
}

absl::StatusOr<std::vector<std::string>> SecurityStore::ActiveInstanceIds(
    const std::string& tenant_id) {
  std::vector<std::string> ids;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    ids.clear();
    auto rows = txn.exec_params(
        "SELECT id FROM instances WHERE tenant_id = $1 "
        "AND state IN ('PENDING', 'SCHEDULED', 'STARTING', 'RUNNING') ORDER BY id LIMIT 1000",
        tenant_id);
    for (const auto& row : rows) ids.push_back(row[0].as<std::string>());
    return absl::OkStatus();
  }));
  return ids;
}

// ---- Suspension ---------------------------------------------------------------

namespace {

absl::Status TenantNotFound(const std::string& tenant_id) {
  return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND",
               absl::StrCat("tenant ", tenant_id, " does not exist"));
}

absl::StatusOr<TenantStanding> ReadStanding(pqxx::work& txn, const std::string& tenant_id) {
  auto tenant = txn.exec_params(
      absl::StrCat("SELECT id, name, ", MicrosOf("created_at"), " FROM tenants WHERE id = $1"),
      tenant_id);
  if (tenant.empty()) return TenantNotFound(tenant_id);
  TenantStanding standing;
  standing.tenant.id = tenant[0][0].as<std::string>();
  standing.tenant.name = tenant[0][1].as<std::string>();
  standing.tenant.created_at = TimeFromMicros(tenant[0][2].as<int64_t>());
  // The one in force (no resumed_at) sorts first.
  auto rows = txn.exec_params(
      absl::StrCat("SELECT ", MicrosOf("suspended_at"), ", suspended_by, reason, ",
                   MicrosOf("resumed_at"), ", coalesce(resumed_by, ''), "
                   "coalesce(resume_reason, '') FROM tenant_suspensions WHERE tenant_id = $1 "
                   "ORDER BY resumed_at IS NOT NULL, suspended_at DESC, id DESC LIMIT 100"),
      tenant_id);
  for (const auto& row : rows) {
    SuspensionRow s;
    s.suspended_at = TimeFromMicros(row[0].as<int64_t>());
    s.suspended_by = row[1].as<std::string>();
    s.reason = row[2].as<std::string>();
    if (!row[3].is_null()) s.resumed_at = TimeFromMicros(row[3].as<int64_t>());
    s.resumed_by = row[4].as<std::string>();
    s.resume_reason = row[5].as<std::string>();
    standing.suspensions.push_back(std::move(s));
  }
  return standing;
}

void NoticeToTenant(pqxx::work& txn, const std::string& tenant_id, const std::string& message,
                    absl::Time now) {
  txn.exec_params(
      "INSERT INTO billing_notices (tenant_id, kind, message, at) "
      "VALUES ($1, 'suspension', $2, $3::timestamptz)",
      tenant_id, message, SqlTime(now));
}

}  // namespace

absl::Status CheckNotSuspended(pqxx::work& txn, const std::string& tenant_id) {
  auto open = txn.exec_params(
      "SELECT reason, to_char(suspended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') "
      "FROM tenant_suspensions WHERE tenant_id = $1 AND resumed_at IS NULL",
      tenant_id);
  if (open.empty()) return absl::OkStatus();
  return Error(absl::StatusCode::kFailedPrecondition, "TENANT_SUSPENDED",
               absl::StrCat("the tenant is suspended since ", open[0][1].as<std::string>(),
                            " UTC (", open[0][0].as<std::string>(),
                            "); an operator must resume it before instances can be created "
                            "or started or volumes created"));
}

absl::StatusOr<TenantStanding> SecurityStore::GetStanding(const std::string& tenant_id) {
  TenantStanding standing;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    SV_ASSIGN_OR_RETURN(standing, ReadStanding(txn, tenant_id));
    return absl::OkStatus();
  }));
  return standing;
}

absl::StatusOr<TenantStanding> SecurityStore::Suspend(const std::string& tenant_id,
                                                      const std::string& operator_email,
                                                      const std::string& reason, absl::Time now,
                                                      bool* opened) {
  TenantStanding standing;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    *opened = false;
    // The lock a create holds from its gate to its commit (migration 0111).
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE", tenant_id).empty()) {
      return TenantNotFound(tenant_id);
    }
    if (!txn.exec_params("SELECT 1 FROM users WHERE tenant_id = $1 AND role = 'operator'",
                         tenant_id)
             .empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "OPERATOR_TENANT",
                   "the platform operator's own tenant cannot be suspended");
    }
    auto inserted = txn.exec_params(
        "INSERT INTO tenant_suspensions (tenant_id, suspended_at, suspended_by, reason) "
        "VALUES ($1, $2::timestamptz, $3, $4) "
        "ON CONFLICT (tenant_id) WHERE resumed_at IS NULL DO NOTHING RETURNING id",
        tenant_id, SqlTime(now), operator_email, reason);
    *opened = !inserted.empty();
    if (*opened) {
      NoticeToTenant(txn, tenant_id,
                     absl::StrCat("Your tenant was suspended by the operator: ", reason,
                                  ". Its instances are stopped; creating or starting instances "
                                  "and creating volumes are refused until it is resumed. Your "
                                  "volumes are kept (and charged); you can still read, delete "
                                  "and pay."),
                     now);
    }
    SV_ASSIGN_OR_RETURN(standing, ReadStanding(txn, tenant_id));
    return absl::OkStatus();
  }));
  return standing;
}

absl::StatusOr<TenantStanding> SecurityStore::Resume(const std::string& tenant_id,
                                                     const std::string& operator_email,
                                                     const std::string& reason, absl::Time now,
                                                     bool* ended) {
  TenantStanding standing;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    *ended = false;
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE", tenant_id).empty()) {
      return TenantNotFound(tenant_id);
    }
    auto updated = txn.exec_params(
        "UPDATE tenant_suspensions SET resumed_at = greatest($2::timestamptz, suspended_at), "
        "resumed_by = $3, resume_reason = $4 WHERE tenant_id = $1 AND resumed_at IS NULL "
        "RETURNING id",
        tenant_id, SqlTime(now), operator_email, reason);
    *ended = !updated.empty();
    if (*ended) {
      NoticeToTenant(txn, tenant_id,
                     absl::StrCat("Your tenant was resumed by the operator: ", reason,
                                  ". You may create and start instances again; instances "
                                  "stopped by the suspension stay stopped until you start "
                                  "them."),
                     now);
    }
    SV_ASSIGN_OR_RETURN(standing, ReadStanding(txn, tenant_id));
    return absl::OkStatus();
  }));
  return standing;
}

absl::StatusOr<std::vector<std::string>> SecurityStore::SuspendedTenants() {
  std::vector<std::string> tenants;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    tenants.clear();
    for (const auto& row : txn.exec(
             "SELECT tenant_id FROM tenant_suspensions WHERE resumed_at IS NULL "
             "ORDER BY tenant_id")) {
      tenants.push_back(row[0].as<std::string>());
    }
    return absl::OkStatus();
  }));
  return tenants;
}

// ---- Operators ------------------------------------------------------------------

namespace {

// The bootstrap operator holds the key svd restores from its key file at
// every start (EnsureTenantWithKey names it 'bootstrap').
const std::string kOperatorColumns =
    "u.id, u.email, " + MicrosOf("u.created_at") +
    ", EXISTS (SELECT 1 FROM api_keys b WHERE b.user_id = u.id AND b.name = 'bootstrap'), "
    "(SELECT count(*) FROM api_keys a WHERE a.user_id = u.id AND a.revoked_at IS NULL "
    "AND (a.expires_at IS NULL OR a.expires_at > $1::timestamptz))::int, "
    "u.operator_read_only";

OperatorRow OperatorFromRow(const pqxx::row& row) {
  return {row[0].as<std::string>(), row[1].as<std::string>(),
          TimeFromMicros(row[2].as<int64_t>()), row[3].as<bool>(), row[4].as<int>(),
          row[5].as<bool>()};
}

absl::Status OperatorNotFound(const std::string& user_id) {
  return Error(absl::StatusCode::kNotFound, "OPERATOR_NOT_FOUND",
               absl::StrCat("no operator has the user id '", user_id, "'"));
}

}  // namespace

absl::StatusOr<OperatorRow> SecurityStore::AddOperator(const std::string& tenant_id,
                                                       const std::string& email,
                                                       bool read_only,
                                                       const std::string& by_user_id,
                                                       const std::string& by_email,
                                                       NewApiKeyRow first_key, absl::Time now) {
  OperatorRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto created = txn.exec_params(
        "INSERT INTO users (id, tenant_id, email, role, created_at, operator_read_only) "
        "VALUES ($1, $2, $3, 'operator', $4::timestamptz, $5) ON CONFLICT (email) DO NOTHING "
        "RETURNING id",
        NewId("usr"), tenant_id, email, SqlTime(now), read_only);
    std::string user_id;
    if (!created.empty()) {
      user_id = created[0][0].as<std::string>();
    } else {
      auto user = txn.exec_params1(
          "SELECT id, role, tenant_id, EXISTS (SELECT 1 FROM operator_changes c "
          "WHERE c.user_id = users.id AND c.change = 'removed'), "
          "EXISTS (SELECT 1 FROM memberships m WHERE m.user_id = users.id) "
          "FROM users WHERE email = $1 FOR UPDATE",
          email);
      user_id = user[0].as<std::string>();
      if (user[1].as<std::string>() == "operator") {
        return Error(absl::StatusCode::kAlreadyExists, "ALREADY_AN_OPERATOR",
                     absl::StrCat(email, " is already an operator"));
      }
      // Only a former operator of this tenant who joined no tenant since
      // is made one again: an operator's account is an account of its own.
      if (user[2].as<std::string>() != tenant_id || !user[3].as<bool>() ||
          user[4].as<bool>()) {
        return Error(absl::StatusCode::kAlreadyExists, "USER_EXISTS",
                     absl::StrCat("a user with the e-mail address ", email,
                                  " already exists; an operator's account must be an "
                                  "account of its own"));
      }
      txn.exec_params("UPDATE users SET role = 'operator', operator_read_only = $2 WHERE id = $1",
                      user_id, read_only);
    }
    txn.exec_params(
        "INSERT INTO memberships (tenant_id, user_id, role, created_at) "
        "VALUES ($1, $2, 'owner', $3::timestamptz) ON CONFLICT DO NOTHING",
        tenant_id, user_id, SqlTime(now));
    first_key.user_id = user_id;
    first_key.tenant_id = tenant_id;
    InsertKey(txn, first_key, now);
    txn.exec_params(
        "INSERT INTO operator_changes (user_id, change, by_user, by_email, at, read_only) "
        "VALUES ($1, 'added', $2, $3, $4::timestamptz, $5)",
        user_id, by_user_id, by_email, SqlTime(now), read_only);
    auto rows = txn.exec_params("SELECT " + kOperatorColumns + " FROM users u WHERE u.id = $2",
                                SqlTime(now), user_id);
    result = OperatorFromRow(rows[0]);
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<std::vector<OperatorRow>> SecurityStore::ListOperators(absl::Time now) {
  std::vector<OperatorRow> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params("SELECT " + kOperatorColumns +
                                    " FROM users u WHERE u.role = 'operator' "
                                    "ORDER BY u.created_at, u.id",
                                SqlTime(now));
    for (const auto& row : rows) out.push_back(OperatorFromRow(row));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<int> SecurityStore::RemoveOperator(const std::string& user_id,
                                                  const std::string& by_user_id,
                                                  const std::string& by_email,
                                                  const std::string& reason, absl::Time now) {
  int revoked = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // Every operator row is locked, so two removals cannot both pass the
    // last-operator check. Read-only operators do not count: they could
    // not add another operator.
    auto operators = txn.exec_params(
        "SELECT id, operator_read_only FROM users WHERE role = 'operator' ORDER BY id "
        "FOR UPDATE");
    bool found = false;
    bool removing_full = false;
    int full = 0;
    for (const auto& row : operators) {
      const bool full_operator = !row[1].as<bool>();
      if (row[0].as<std::string>() == user_id) {
        found = true;
        removing_full = full_operator;
      }
      if (full_operator) ++full;
    }
    if (!found) return OperatorNotFound(user_id);
    if (removing_full && full <= 1) {
      return Error(absl::StatusCode::kFailedPrecondition, "LAST_OPERATOR",
                   "the platform must keep at least one operator");
    }
    if (!txn.exec_params("SELECT 1 FROM api_keys WHERE user_id = $1 AND name = 'bootstrap'",
                         user_id)
             .empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "BOOTSTRAP_OPERATOR",
                   "this operator's key comes from svd's --admin-key-file, which svd "
                   "restores at every start; retire it by giving svd another key file");
    }
    txn.exec_params(
        "UPDATE users SET role = 'member', operator_read_only = false WHERE id = $1", user_id);
    // A member without a trial grant is given one (Billing::GrantMissingTrials):
    // the operators' tenant is no customer, and the first operator removed
    // put 10 CNY of trial credit there. An empty, expired grant says it had
    // its turn.
    txn.exec_params(
        "INSERT INTO trial_grants (user_id, tenant_id, amount_micros, granted_at, expires_at, "
        "expired) SELECT id, tenant_id, 0, $2::timestamptz, $2::timestamptz, true FROM users "
        "WHERE id = $1 ON CONFLICT DO NOTHING",
        user_id, SqlTime(now));
    txn.exec_params("DELETE FROM memberships WHERE user_id = $1", user_id);
    revoked = static_cast<int>(
        txn.exec_params("UPDATE api_keys SET revoked_at = $2::timestamptz "
                        "WHERE user_id = $1 AND revoked_at IS NULL",
                        user_id, SqlTime(now))
            .affected_rows());
    txn.exec_params("DELETE FROM ssh_keys WHERE created_by = $1", user_id);
    txn.exec_params(
        "INSERT INTO operator_changes (user_id, change, by_user, by_email, reason, at) "
        "VALUES ($1, 'removed', $2, $3, $4, $5::timestamptz)",
        user_id, by_user_id, by_email, reason, SqlTime(now));
    return absl::OkStatus();
  }));
  return revoked;
}

}  // namespace sv::store
