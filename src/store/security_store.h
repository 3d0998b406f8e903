#ifndef SV_STORE_SECURITY_STORE_H_
#define SV_STORE_SECURITY_STORE_H_

// PostgreSQL side of tenancy and security: organisation members and their
// roles, API keys (salted hashes only), the audit log and per-tenant spend
// caps. Every method is one transaction scoped by tenant; times come from
// the caller. See docs/security.md.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"
#include "store/store.h"

namespace sv::store {

struct ApiKeyRow {
  std::string id;
  std::string user_id;
  std::string user_email;
  std::string tenant_id;
  std::string name;
  KeyScope scope = KeyScope::kFull;
  absl::Time created_at;
  std::optional<absl::Time> expires_at;
  std::optional<absl::Time> revoked_at;
  std::string replaced_by;
};

// A key to insert: its public id and salted hash (never the secret).
struct NewApiKeyRow {
  std::string id;
  std::string user_id;
  std::string tenant_id;
  std::string salt;
  std::string secret_hash;
  std::string name;
  KeyScope scope = KeyScope::kFull;
  std::optional<absl::Time> expires_at;
};

struct MemberRow {
  std::string user_id;
  std::string email;
  TenantRole role = TenantRole::kViewer;
  absl::Time created_at;
};

// One suspension of a tenant (tenant_suspensions, migration 0111).
struct SuspensionRow {
  absl::Time suspended_at;
  std::string suspended_by;  // The operator's e-mail.
  std::string reason;
  std::optional<absl::Time> resumed_at;  // Unset while in force.
  std::string resumed_by;
  std::string resume_reason;
};

// A tenant and its suspensions, newest first (the one in force, if any,
// is first and has no resumed_at).
struct TenantStanding {
  TenantRecord tenant;
  std::vector<SuspensionRow> suspensions;
  bool suspended() const { return !suspensions.empty() && !suspensions[0].resumed_at; }
};

// A platform operator (users.role = 'operator').
struct OperatorRow {
  std::string user_id;
  std::string email;
  absl::Time created_at;
  bool bootstrap = false;  // Holds the key of svd's --admin-key-file.
  int active_keys = 0;
  bool read_only = false;  // Reads only (users.operator_read_only).
};

// AuditRow (one audit_log row) is in store/store.h: the create and delete
// batches write their calls' rows in their own transactions.

struct AuditFilter {
  std::string tenant_id;  // Empty: every tenant (platform admin only).
  int64_t before_id = 0;  // Keyset paging, newest first; 0: from the newest.
  int limit = 100;
};

// Writes audit rows in the caller's transaction with one prepared statement
// (the audit batcher's and the create and delete batches' writes).
void InsertAuditRows(pqxx::work& txn, const std::vector<AuditRow>& rows);

// In the caller's transaction, which holds a lock on the tenant's row that
// a suspension's update lock waits for: OK, or FAILED_PRECONDITION /
// TENANT_SUSPENDED with the suspension's reason (for creates, starts and
// image registrations, which a suspension refuses).
absl::Status CheckNotSuspended(pqxx::work& txn, const std::string& tenant_id);

class SecurityStore {
 public:
  explicit SecurityStore(Database& db) : db_(db) {}

  // ---- Keys ----
  absl::Status CreateApiKey(const NewApiKeyRow& key, absl::Time now);
  // The tenant's keys, or only those of `user_id` when it is not empty;
  // newest first, revoked ones included. Other users' keys leave out the
  // operators' unless `caller_is_operator` (here and below: an owner of the
  // operators' tenant who is not an operator never reaches their keys).
  absl::StatusOr<std::vector<ApiKeyRow>> ListApiKeys(const std::string& tenant_id,
                                                     const std::string& user_id,
                                                     bool caller_is_operator);
  // NOT_FOUND unless the tenant has the key (and, when `user_id` is not
  // empty, it belongs to that user). Revoking twice is a no-op.
  absl::StatusOr<ApiKeyRow> RevokeApiKey(const std::string& tenant_id,
                                         const std::string& user_id, bool caller_is_operator,
                                         const std::string& key_id, absl::Time now);
  // Inserts `replacement` (same user, tenant, scope, name as the old key)
  // and ends the old key: revoked now when `overlap` is zero, else it
  // expires at now + overlap (or earlier if it expired earlier).
  absl::StatusOr<ApiKeyRow> RotateApiKey(const std::string& tenant_id,
                                         const std::string& user_id, bool caller_is_operator,
                                         const std::string& key_id,
                                         NewApiKeyRow replacement, absl::Duration overlap,
                                         absl::Time now);

  // ---- Members ----
  absl::StatusOr<std::vector<MemberRow>> ListMembers(const std::string& tenant_id);
  // Adds the user with this email to the tenant (creating the user when
  // new) and registers `first_key` for it. ALREADY_EXISTS when a member.
  absl::StatusOr<MemberRow> AddMember(const std::string& tenant_id, const std::string& email,
                                      TenantRole role, NewApiKeyRow first_key,
                                      absl::Time now);
  // FAILED_PRECONDITION / LAST_OWNER when the change would leave no owner,
  // OPERATOR_ACCOUNT for an operator. A viewer or billing role loses the
  // SSH keys the user added to the tenant.
  absl::StatusOr<MemberRow> SetMemberRole(const std::string& tenant_id,
                                          const std::string& user_id, TenantRole role);
  // Removes the membership, revokes the user's API keys of the tenant and
  // deletes the SSH keys the user added to it.
  absl::Status RemoveMember(const std::string& tenant_id, const std::string& user_id,
                            absl::Time now);

  // ---- Audit ----
  absl::Status AppendAudit(const AuditRow& row);
  absl::StatusOr<std::vector<AuditRow>> ListAudit(const AuditFilter& filter);

  // ---- Spend cap ----
  // Empty: no cap.
  absl::StatusOr<std::optional<int64_t>> GetSpendCap(const std::string& tenant_id);
  // `cap_micros` empty removes the cap. NOT_FOUND for an unknown tenant.
  absl::Status SetSpendCap(const std::string& tenant_id, std::optional<int64_t> cap_micros,
                           absl::Time now);
  // What the tenant was charged since `since` (usage charges net of
  // reversals), from the ledger.
  absl::StatusOr<int64_t> SpentSince(const std::string& tenant_id, absl::Time since);
  // Tenants whose cap is reached for the month starting at `month_start`.
  absl::StatusOr<std::vector<std::string>> TenantsOverSpendCap(absl::Time month_start);
  // Ids of the tenant's instances that hold or wait for GPUs.
  absl::StatusOr<std::vector<std::string>> ActiveInstanceIds(const std::string& tenant_id);

  // ---- Suspension (docs/security.md, "Suspending a tenant") ----
  // NOT_FOUND / TENANT_NOT_FOUND for an unknown tenant.
  absl::StatusOr<TenantStanding> GetStanding(const std::string& tenant_id);
  // Opens a suspension under the tenant's row lock (which every create and
  // start holds until it commits) and tells the tenant (a notice). A
  // tenant already suspended keeps its suspension: `*opened` says whether
  // this call opened one. FAILED_PRECONDITION / OPERATOR_TENANT for the
  // platform operator's own tenant. The instances are stopped by the
  // caller (api::StopTenantInstances).
  absl::StatusOr<TenantStanding> Suspend(const std::string& tenant_id,
                                         const std::string& operator_email,
                                         const std::string& reason, absl::Time now,
                                         bool* opened);
  // Ends the suspension in force, if any (`*ended`), and tells the tenant.
  // Stopped instances stay stopped.
  absl::StatusOr<TenantStanding> Resume(const std::string& tenant_id,
                                        const std::string& operator_email,
                                        const std::string& reason, absl::Time now,
                                        bool* ended);
  // Tenants with a suspension in force.
  absl::StatusOr<std::vector<std::string>> SuspendedTenants();

  // ---- Operators (docs/security.md, "Operators") ----
  // Makes `email` an operator of `tenant_id` (the caller's, the operator
  // tenant) with `first_key`: a new user, or one that was an operator of
  // this tenant before. Any other user of that address is USER_EXISTS.
  // A `read_only` operator changes nothing but its own keys.
  absl::StatusOr<OperatorRow> AddOperator(const std::string& tenant_id, const std::string& email,
                                          bool read_only, const std::string& by_user_id,
                                          const std::string& by_email, NewApiKeyRow first_key,
                                          absl::Time now);
  absl::StatusOr<std::vector<OperatorRow>> ListOperators(absl::Time now);
  // Takes the role away, ends the user's memberships and revokes its keys;
  // returns how many keys were revoked. Never the last operator who may
  // change things (read-only ones do not count) or the bootstrap one.
  absl::StatusOr<int> RemoveOperator(const std::string& user_id, const std::string& by_user_id,
                                     const std::string& by_email, const std::string& reason,
                                     absl::Time now);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_SECURITY_STORE_H_
