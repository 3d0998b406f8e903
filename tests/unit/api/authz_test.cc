// The authorization table covers every RPC of proto/sv/v1 and nothing else,
// and roles, scopes and the platform admin get exactly their permissions.
#include "api/authz.h"

#include "common/status.h"

#include <set>
#include <string>

#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace sv::api {
namespace {

using google::protobuf::DescriptorPool;
using store::TenantRole;

std::vector<std::string> ProtoFiles() {
  return absl::StrSplit(SV_PROTO_FILES, ',', absl::SkipEmpty());
}

TEST(AuthzTableTest, EveryMethodOfEveryServiceHasARule) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  int methods = 0;
  ASSERT_GE(ProtoFiles().size(), 6u);
  for (const std::string& name : ProtoFiles()) {
    const auto* file = pool->FindFileByName(name);
    ASSERT_NE(file, nullptr) << name << " is not in the generated pool";
    for (int s = 0; s < file->service_count(); ++s) {
      const auto* service = file->service(s);
      for (int m = 0; m < service->method_count(); ++m) {
        const std::string full = "/" + service->full_name() + "/" + service->method(m)->name();
        ++methods;
        const MethodRule* rule = FindMethodRule(full);
        EXPECT_NE(rule, nullptr) << full << " has no rule in src/api/authz_table.cc";
        if (rule != nullptr && (service->method(m)->client_streaming() ||
                                service->method(m)->server_streaming())) {
          // Streams are not audited by the interceptor; only agents use them.
          EXPECT_EQ(rule->permission, Permission::kNodeAgent) << full;
        }
      }
    }
  }
  EXPECT_GE(methods, 31);
}

TEST(AuthzTableTest, EveryRuleNamesAnExistingMethodOnce) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  std::set<std::string> seen;
  for (const MethodRule& rule : MethodRules()) {
    EXPECT_TRUE(seen.insert(rule.method).second) << rule.method << " has two rules";
    std::vector<std::string> parts = absl::StrSplit(rule.method, '/');
    ASSERT_EQ(parts.size(), 3u) << rule.method;
    EXPECT_TRUE(parts[0].empty()) << rule.method;
    const auto* service = pool->FindServiceByName(parts[1]);
    ASSERT_NE(service, nullptr) << rule.method << ": no such service";
    EXPECT_NE(service->FindMethodByName(parts[2]), nullptr) << rule.method << ": no such method";
  }
}

store::Principal As(TenantRole role, store::KeyScope scope = store::KeyScope::kFull) {
  store::Principal who;
  who.tenant_role = role;
  who.scope = scope;
  return who;
}

TEST(AuthzRolesTest, BillingReadsMoneyAndHasNoInstanceRights) {
  const auto billing = As(TenantRole::kBilling);
  EXPECT_TRUE(HasPermission(billing, Permission::kBillingRead));
  EXPECT_FALSE(HasPermission(billing, Permission::kInstancesRead));
  EXPECT_FALSE(HasPermission(billing, Permission::kInstancesWrite));
  EXPECT_FALSE(HasPermission(billing, Permission::kUsersWrite));
}

TEST(AuthzRolesTest, ViewerReadsMemberWritesOwnerManages) {
  EXPECT_TRUE(HasPermission(As(TenantRole::kViewer), Permission::kInstancesRead));
  EXPECT_FALSE(HasPermission(As(TenantRole::kViewer), Permission::kInstancesWrite));
  EXPECT_FALSE(HasPermission(As(TenantRole::kViewer), Permission::kBillingRead));
  EXPECT_TRUE(HasPermission(As(TenantRole::kMember), Permission::kInstancesWrite));
  EXPECT_FALSE(HasPermission(As(TenantRole::kMember), Permission::kUsersWrite));
  EXPECT_FALSE(HasPermission(As(TenantRole::kMember), Permission::kAuditRead));
  for (Permission p : {Permission::kInstancesWrite, Permission::kBillingRead,
                       Permission::kUsersWrite, Permission::kAuditRead,
                       Permission::kBudgetWrite, Permission::kKeysManage}) {
    EXPECT_TRUE(HasPermission(As(TenantRole::kOwner), p)) << PermissionName(p);
  }
}

TEST(AuthzRolesTest, OnlyThePlatformAdminHoldsAdminPermissions) {
  for (TenantRole role : {TenantRole::kViewer, TenantRole::kBilling, TenantRole::kMember,
                          TenantRole::kOwner}) {
    for (Permission p : {Permission::kAdminTenants, Permission::kAdminFleet,
                         Permission::kAdminQuotas, Permission::kAdminBilling,
                         Permission::kAdminAudit}) {
      EXPECT_FALSE(HasPermission(As(role), p)) << PermissionName(p);
    }
  }
  store::Principal admin = As(TenantRole::kViewer);
  admin.role = store::Role::kOperator;
  EXPECT_TRUE(HasPermission(admin, Permission::kAdminFleet));
  EXPECT_TRUE(HasPermission(admin, Permission::kInstancesWrite));
  // Agent streams never open with an API key, not even the admin's.
  EXPECT_FALSE(HasPermission(admin, Permission::kNodeAgent));
}

TEST(AuthzRolesTest, ReadOnlyKeysReachOnlyReadMethods) {
  const auto owner_read_only = As(TenantRole::kOwner, store::KeyScope::kReadOnly);
  const MethodRule* get = FindMethodRule("/sv.v1.InstanceService/GetInstance");
  const MethodRule* create = FindMethodRule("/sv.v1.InstanceService/CreateInstance");
  ASSERT_NE(get, nullptr);
  ASSERT_NE(create, nullptr);
  EXPECT_TRUE(Authorize(owner_read_only, *get).ok());
  absl::Status denied = Authorize(owner_read_only, *create);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(As(TenantRole::kViewer), *create).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(As(TenantRole::kMember), *create).ok());
}

// Over the whole table: a read-only operator reaches every read method
// and, of the writes, only those on its own keys.
TEST(AuthzRolesTest, ReadOnlyOperatorsWriteOnlyTheirOwnKeys) {
  store::Principal support = As(TenantRole::kOwner);
  support.role = store::Role::kOperator;
  support.read_only_operator = true;
  int writes_allowed = 0;
  for (const MethodRule& rule : MethodRules()) {
    if (rule.permission == Permission::kNodeAgent) continue;
    const absl::Status status = Authorize(support, rule);
    if (rule.access == Access::kRead || rule.permission == Permission::kKeysWrite) {
      EXPECT_TRUE(status.ok()) << rule.method;
      writes_allowed += rule.access == Access::kWrite;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << rule.method;
      EXPECT_EQ(ReasonOf(status), "READ_ONLY_OPERATOR") << rule.method;
    }
  }
  EXPECT_EQ(writes_allowed, 3);  // Create, revoke and rotate its keys.
  // Its own keys only: keys.manage would reach full operators' keys.
  EXPECT_FALSE(HasPermission(support, Permission::kKeysManage));
  support.read_only_operator = false;
  EXPECT_TRUE(Authorize(support, *FindMethodRule("/sv.v1.AdminService/SuspendTenant")).ok());
}

}  // namespace
}  // namespace sv::api
