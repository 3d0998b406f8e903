#ifndef SV_API_AUTHZ_H_
#define SV_API_AUTHZ_H_

// Authorization of sv: one declarative table maps every RPC to the
// permission it requires (authz_table.cc), roles map to permission sets, and
// one function decides. The Authenticator applies it to every call (the
// method comes from the AuthzInterceptor, so services cannot name the wrong
// one); see docs/security.md.
//
// Adding an RPC? Add ONE line to kMethodRules in src/api/authz_table.cc.
// api_authz_test fails while a method in proto/sv/v1 has no rule, or a rule
// names a method that does not exist.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "store/store.h"

namespace sv::api {

enum class Permission {
  kAccountRead,     // account.read: who am I (every role)
  kInstancesRead,   // instances.read
  kInstancesWrite,  // instances.write
  kBillingRead,     // billing.read: balance, transfers, usage, invoices
  kTenantRead,      // tenant.read: the tenant's quota and spend cap
  kBudgetWrite,     // budget.write: set the tenant's spend cap
  kKeysRead,        // keys.read: list one's own API keys
  kKeysWrite,       // keys.write: create, rotate, revoke one's own keys
  kKeysManage,      // keys.manage: list and revoke other users' keys of the tenant
  kUsersRead,       // users.read
  kUsersWrite,      // users.write: add, set role, remove
  kAuditRead,       // audit.read: the tenant's audit log
  kWebhooksWrite,   // webhooks.write: set, test and delete the tenant's webhook
  kAdminTenants,    // admin.tenants: create tenants (platform admin)
  kAdminFleet,      // admin.fleet: nodes, node credentials
  kAdminQuotas,     // admin.quotas: tenants' quotas and priorities
  kAdminBilling,    // admin.billing: revenue, top-ups, prices, audit run
  kAdminAudit,      // admin.audit: every tenant's audit log
  kAdminOperators,  // admin.operators: add, list and remove operators
  kNodeAgent,       // node.agent: an agent stream, authenticated by a node credential
  kPublic,          // public: no credential at all (nothing uses it today)
};

// Whether a method only reads (allowed to read-only keys, not audited) or
// mutates (full keys only, every call recorded in the audit log).
enum class Access { kRead, kWrite };

struct MethodRule {
  const char* method;  // "/sv.v1.InstanceService/CreateInstance"
  Permission permission;
  Access access;
};

// "instances.read", ...
const char* PermissionName(Permission permission);

// The whole table, for tests and docs.
const std::vector<MethodRule>& MethodRules();

// The rule of a full gRPC method name, or nullptr when it has none.
const MethodRule* FindMethodRule(std::string_view method);

// Whether the role holds the permission. The platform admin holds all of
// them, in addition to its tenant role.
bool HasPermission(const store::Principal& who, Permission permission);

// The decision for one call: OK, or PERMISSION_DENIED with a reason
// (PERMISSION_DENIED or READ_ONLY_KEY). Never says anything about data.
absl::Status Authorize(const store::Principal& who, const MethodRule& rule);

}  // namespace sv::api

#endif  // SV_API_AUTHZ_H_
