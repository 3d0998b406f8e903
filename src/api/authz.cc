#include "api/authz.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"

namespace sv::api {
namespace {

using P = Permission;
using store::TenantRole;

bool ViewerHas(P p) {
  return p == P::kAccountRead || p == P::kInstancesRead || p == P::kTenantRead ||
         p == P::kKeysRead || p == P::kKeysWrite;
}

// The billing role reads money and has no instance rights.
bool BillingHas(P p) {
  return p == P::kAccountRead || p == P::kBillingRead || p == P::kTenantRead ||
         p == P::kKeysRead || p == P::kKeysWrite;
}

bool MemberHas(P p) { return ViewerHas(p) || p == P::kInstancesWrite; }

bool OwnerHas(P p) {
  return MemberHas(p) || BillingHas(p) || p == P::kBudgetWrite || p == P::kKeysManage ||
         p == P::kUsersRead || p == P::kUsersWrite || p == P::kAuditRead ||
         p == P::kWebhooksWrite;
}

}  // namespace

const char* PermissionName(Permission permission) {
  switch (permission) {
    case P::kAccountRead: return "account.read";
    case P::kInstancesRead: return "instances.read";
    case P::kInstancesWrite: return "instances.write";
    case P::kBillingRead: return "billing.read";
    case P::kTenantRead: return "tenant.read";
    case P::kBudgetWrite: return "budget.write";
    case P::kKeysRead: return "keys.read";
    case P::kKeysWrite: return "keys.write";
    case P::kKeysManage: return "keys.manage";
    case P::kUsersRead: return "users.read";
    case P::kUsersWrite: return "users.write";
    case P::kAuditRead: return "audit.read";
    case P::kWebhooksWrite: return "webhooks.write";
    case P::kAdminTenants: return "admin.tenants";
    case P::kAdminFleet: return "admin.fleet";
    case P::kAdminQuotas: return "admin.quotas";
    case P::kAdminBilling: return "admin.billing";
    case P::kAdminAudit: return "admin.audit";
    case P::kAdminOperators: return "admin.operators";
    case P::kNodeAgent: return "node.agent";
    case P::kPublic: return "public";
  }
  return "unknown";
}

const MethodRule* FindMethodRule(std::string_view method) {
  static const auto* const kByMethod = [] {
    auto* map = new absl::flat_hash_map<std::string, const MethodRule*>();
    for (const MethodRule& rule : MethodRules()) (*map)[rule.method] = &rule;
    return map;
  }();
  auto it = kByMethod->find(std::string(method));
  return it == kByMethod->end() ? nullptr : it->second;
}

bool HasPermission(const store::Principal& who, Permission permission) {
  // Agent streams and public methods are not reached through an API key.
  if (permission == P::kNodeAgent) return false;
  if (permission == P::kPublic) return true;
  // A read-only operator manages no one's keys but its own: with
  // keys.manage it could rotate a full operator's key and be handed it.
  if (who.platform_admin()) return !(who.read_only_operator && permission == P::kKeysManage);
  switch (who.tenant_role) {
    case TenantRole::kViewer: return ViewerHas(permission);
    case TenantRole::kBilling: return BillingHas(permission);
    case TenantRole::kMember: return MemberHas(permission);
    case TenantRole::kOwner: return OwnerHas(permission);
  }
  return false;
}

absl::Status Authorize(const store::Principal& who, const MethodRule& rule) {
  if (!HasPermission(who, rule.permission)) {
    return Error(absl::StatusCode::kPermissionDenied, "PERMISSION_DENIED",
                 std::string("this call needs the permission ") +
                     PermissionName(rule.permission) + ", which the role " +
                     (who.platform_admin() ? "admin"
                                           : store::TenantRoleName(who.tenant_role)) +
                     " does not have");
  }
  // A read-only operator manages its own keys and changes nothing else.
  if (rule.access == Access::kWrite && who.platform_admin() && who.read_only_operator &&
      rule.permission != P::kKeysWrite) {
    return Error(absl::StatusCode::kPermissionDenied, "READ_ONLY_OPERATOR",
                 "this operator account is read-only; ask an operator who may change things");
  }
  if (rule.access == Access::kWrite && who.scope == store::KeyScope::kReadOnly) {
    return Error(absl::StatusCode::kPermissionDenied, "READ_ONLY_KEY",
                 "this API key is read-only; the call needs a full key");
  }
  return absl::OkStatus();
}

}  // namespace sv::api
