// Multi-tenancy and security against a real svd and PostgreSQL: every RPC
// as every kind of caller (the authorization matrix), cross-tenant reads as
// NOT_FOUND, key scope / expiry / rotation / revocation, the audit log, the
// spend cap, secrets absent from svd's log and from the database, and
// database errors that reach clients without SQL text, and operators'
// suspensions of tenants.
#include <grpcpp/generic/generic_stub.h>
#include <httplib.h>
#include <stdlib.h>

#include <fstream>
#include <future>
#include <map>
#include <pqxx/pqxx>
#include <set>
#include <sstream>

#include "api/authz.h"
#include "api/errors.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "store/database.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/billing.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/security.grpc.pb.h"
#include "sv/v1/volume.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using api::MethodRule;
using api::Permission;

// The independent model of who may do what: for each permission name, the
// roles that hold it. Kept apart from src/api/authz.cc on purpose.
const std::map<std::string, std::set<std::string>>& Model() {
  static const auto* model = new std::map<std::string, std::set<std::string>>{
      {"account.read", {"viewer", "member", "billing", "owner", "admin"}},
      {"instances.read", {"viewer", "member", "owner", "admin"}},
      {"instances.write", {"member", "owner", "admin"}},
      {"billing.read", {"billing", "owner", "admin"}},
      {"tenant.read", {"viewer", "member", "billing", "owner", "admin"}},
      {"budget.write", {"owner", "admin"}},
      {"keys.read", {"viewer", "member", "billing", "owner", "admin"}},
      {"keys.write", {"viewer", "member", "billing", "owner", "admin"}},
      {"keys.manage", {"owner", "admin"}},
      {"users.read", {"owner", "admin"}},
      {"users.write", {"owner", "admin"}},
      {"audit.read", {"owner", "admin"}},
      {"webhooks.write", {"owner", "admin"}},
      {"admin.tenants", {"admin"}},
      {"admin.fleet", {"admin"}},
      {"admin.quotas", {"admin"}},
      {"admin.billing", {"admin"}},
      {"admin.audit", {"admin"}},
      {"admin.operators", {"admin"}},
  };
  return *model;
}

struct Caller {
  std::string name;
  std::string role;   // "" for the unauthenticated ones.
  std::string token;  // "" for no key at all.
};

grpc::Status CallEmpty(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::string& token) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::ByteBuffer request;  // Zero bytes: the empty message of any type.
  grpc::Slice empty("", 0);
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    url_ = new std::string(CreateTestDatabase());
    SvdOptions options;
    options.database_url = *url_;
    options.sim_nodes = 4;
    // Unauthenticated callers make hundreds of failed calls in the matrix.
    options.extra_args = {"--rate-limit-auth-failures-rps", "0", "--billing-interval-ms",
                          "200"};
    svd_ = new SvdProcess(options);
    ASSERT_TRUE(svd_->Start());
    owner_a_ = new std::string(CreateTenant(*svd_, "sec-a"));
    owner_b_ = new std::string(CreateTenant(*svd_, "sec-b"));
  }
  static void TearDownTestSuite() {
    delete svd_;
    svd_ = nullptr;
  }

  static v1::Account Whoami(const std::string& token) {
    v1::AccountService::Stub stub(svd_->channel());
    v1::Account account;
    EXPECT_TRUE(stub.GetCurrentAccount(Context(token).get(), {}, &account).ok());
    return account;
  }

  static v1::AddUserResponse AddUser(const std::string& owner, const std::string& email,
                                     v1::TenantRole role) {
    v1::UserService::Stub stub(svd_->channel());
    v1::AddUserRequest request;
    request.set_email(email);
    request.set_role(role);
    v1::AddUserResponse response;
    grpc::Status status = stub.AddUser(Context(owner).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  static v1::CreateApiKeyResponse CreateKey(const std::string& token, bool read_only,
                                            int64_t ttl_seconds = 0) {
    v1::ApiKeyService::Stub stub(svd_->channel());
    v1::CreateApiKeyRequest request;
    request.set_name("test");
    request.set_scope(read_only ? v1::KEY_SCOPE_READ_ONLY : v1::KEY_SCOPE_FULL);
    request.set_ttl_seconds(ttl_seconds);
    v1::CreateApiKeyResponse response;
    grpc::Status status = stub.CreateApiKey(Context(token).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // The instance once it is STOPPED, or as it is after WaitFor gives up.
  static v1::Instance WaitForStopped(const std::string& token, const std::string& id) {
    v1::InstanceService::Stub instances(svd_->channel());
    v1::GetInstanceRequest get;
    get.set_id(id);
    v1::Instance now;
    WaitFor([&] {
      return instances.GetInstance(Context(token).get(), get, &now).ok() &&
             now.state() == v1::STOPPED;
    });
    return now;
  }

  static void Sql(const std::string& statement) {
    pqxx::connection connection(*url_);
    pqxx::work txn(connection);
    txn.exec(statement);
    txn.commit();
  }

  static std::string* url_;
  static SvdProcess* svd_;
  static std::string* owner_a_;
  static std::string* owner_b_;
};

std::string* SecurityTest::url_ = nullptr;
SvdProcess* SecurityTest::svd_ = nullptr;
std::string* SecurityTest::owner_a_ = nullptr;
std::string* SecurityTest::owner_b_ = nullptr;

v1::Instance CreateInstance(SvdProcess& svd, const std::string& token, const std::string& rid,
                            grpc::Status* status_out = nullptr) {
  v1::InstanceService::Stub stub(svd.channel());
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(1);
  request.mutable_instance()->set_image("ubuntu:22.04");
  request.set_request_id(rid);
  v1::Instance instance;
  grpc::Status status = stub.CreateInstance(Context(token).get(), request, &instance);
  if (status_out != nullptr) {
    *status_out = status;
  } else {
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  return instance;
}

// Goal: every RPC of the table, called by every kind of caller, is allowed
// or denied exactly as the independent model says; the unauthenticated
// kinds are always UNAUTHENTICATED.
TEST_F(SecurityTest, AuthorizationMatrixCoversEveryRpcAndCaller) {
  const std::string viewer = AddUser(*owner_a_, "viewer@a.example", v1::TENANT_ROLE_VIEWER)
                                 .first_key().secret();
  const std::string member = AddUser(*owner_a_, "member@a.example", v1::TENANT_ROLE_MEMBER)
                                 .first_key().secret();
  const std::string billing = AddUser(*owner_a_, "billing@a.example", v1::TENANT_ROLE_BILLING)
                                  .first_key().secret();
  const auto revoked = CreateKey(*owner_a_, false);
  {
    v1::ApiKeyService::Stub stub(svd_->channel());
    v1::RevokeApiKeyRequest request;
    request.set_id(revoked.key().id());
    v1::ApiKey key;
    ASSERT_TRUE(stub.RevokeApiKey(Context(*owner_a_).get(), request, &key).ok());
  }
  const auto expired = CreateKey(*owner_a_, false, 3600);
  Sql("UPDATE api_keys SET expires_at = now() - interval '1 minute' WHERE id = '" +
      expired.key().id() + "'");
  // Well-formed, but no such key.
  const std::string bad = "sv_aaaaaaaaaaaaaa_" + std::string(40, 'b');

  const std::vector<Caller> callers = {
      {"no key", "", ""},
      {"bad key", "", bad},
      {"revoked key", "", revoked.secret()},
      {"expired key", "", expired.secret()},
      {"viewer", "viewer", viewer},
      {"member", "member", member},
      {"billing", "billing", billing},
      {"owner of A", "owner", *owner_a_},
      {"owner of B", "owner", *owner_b_},
      {"admin", "admin", svd_->admin_key()},
  };
  int checked = 0;
  for (const MethodRule& rule : api::MethodRules()) {
    if (rule.permission == Permission::kNodeAgent) continue;  // Streams: NodeCredentialTest.
    // Services this svd does not serve (e.g. the dev clock without a fake
    // clock) answer UNIMPLEMENTED to everyone.
    if (CallEmpty(svd_->channel(), rule.method, svd_->admin_key()).error_code() ==
        grpc::StatusCode::UNIMPLEMENTED) {
      continue;
    }
    const std::string permission = api::PermissionName(rule.permission);
    ASSERT_TRUE(Model().count(permission)) << permission;
    for (const Caller& caller : callers) {
      grpc::Status status = CallEmpty(svd_->channel(), rule.method, caller.token);
      ++checked;
      const auto code = status.error_code();
      if (caller.role.empty()) {
        EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED)
            << rule.method << " as " << caller.name << ": " << status.error_message();
        continue;
      }
      const bool allowed = Model().at(permission).count(caller.role) > 0;
      if (allowed) {
        EXPECT_NE(code, grpc::StatusCode::PERMISSION_DENIED)
            << rule.method << " as " << caller.name << ": " << status.error_message();
        EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED) << rule.method << " " << caller.name;
      } else {
        EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED)
            << rule.method << " as " << caller.name << ": " << status.error_message();
        EXPECT_EQ(api::ReasonOf(status), "PERMISSION_DENIED") << rule.method;
      }
    }
  }
  EXPECT_GE(checked, 40 * static_cast<int>(callers.size()));
}

// Goal: another tenant's resources are NOT_FOUND, never PERMISSION_DENIED,
// and never show up in lists.
TEST_F(SecurityTest, CrossTenantAccessIsNotFound) {
  const v1::Instance mine = CreateInstance(*svd_, *owner_a_, "cross-1");
  ASSERT_FALSE(mine.id().empty());
  v1::InstanceService::Stub instances(svd_->channel());
  {
    v1::GetInstanceRequest request;
    request.set_id(mine.id());
    v1::Instance out;
    grpc::Status status = instances.GetInstance(Context(*owner_b_).get(), request, &out);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_TRUE(out.id().empty());
  }
  {
    v1::DeleteInstanceRequest request;
    request.set_id(mine.id());
    v1::Instance out;
    EXPECT_EQ(instances.DeleteInstance(Context(*owner_b_).get(), request, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::StopInstanceRequest request;
    request.set_id(mine.id());
    v1::Instance out;
    EXPECT_EQ(instances.StopInstance(Context(*owner_b_).get(), request, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::ListInstancesRequest request;
    v1::ListInstancesResponse out;
    ASSERT_TRUE(instances.ListInstances(Context(*owner_b_).get(), request, &out).ok());
    for (const auto& i : out.instances()) EXPECT_NE(i.id(), mine.id());
  }
  const v1::Account a = Whoami(*owner_a_);
  {
    v1::ApiKeyService::Stub keys(svd_->channel());
    v1::RevokeApiKeyRequest request;
    request.set_id(a.api_key_id());
    v1::ApiKey out;
    EXPECT_EQ(keys.RevokeApiKey(Context(*owner_b_).get(), request, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::UserService::Stub users(svd_->channel());
    v1::SetUserRoleRequest request;
    request.set_user_id(a.user_id());
    request.set_role(v1::TENANT_ROLE_VIEWER);
    v1::User out;
    EXPECT_EQ(users.SetUserRole(Context(*owner_b_).get(), request, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::BudgetService::Stub budget(svd_->channel());
    v1::GetSpendCapRequest request;
    request.set_tenant_id(a.tenant_id());
    v1::SpendCap out;
    EXPECT_EQ(budget.GetSpendCap(Context(*owner_b_).get(), request, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::AuditService::Stub audit(svd_->channel());
    v1::ListAuditEntriesRequest request;
    request.set_tenant_id(a.tenant_id());
    v1::ListAuditEntriesResponse out;
    EXPECT_EQ(audit.ListAuditEntries(Context(*owner_b_).get(), request, &out).error_code(),
              grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(out.entries_size(), 0);
  }
  // A's instance survived all of it.
  v1::GetInstanceRequest request;
  request.set_id(mine.id());
  v1::Instance out;
  EXPECT_TRUE(instances.GetInstance(Context(*owner_a_).get(), request, &out).ok());
}

// Goal: read-only keys read but cannot write; rotation and revocation end
// the old secret; only salted hashes are stored.
TEST_F(SecurityTest, KeyScopeRotationRevocationAndStorage) {
  const auto read_only = CreateKey(*owner_a_, true);
  v1::InstanceService::Stub instances(svd_->channel());
  {
    v1::ListInstancesResponse out;
    EXPECT_TRUE(instances.ListInstances(Context(read_only.secret()).get(), {}, &out).ok());
    grpc::Status status;
    CreateInstance(*svd_, read_only.secret(), "ro-1", &status);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(api::ReasonOf(status), "READ_ONLY_KEY");
  }
  const auto full = CreateKey(*owner_a_, false);
  v1::ApiKeyService::Stub keys(svd_->channel());
  v1::RotateApiKeyRequest rotate;
  rotate.set_id(full.key().id());
  v1::CreateApiKeyResponse rotated;
  ASSERT_TRUE(keys.RotateApiKey(Context(*owner_a_).get(), rotate, &rotated).ok());
  EXPECT_NE(rotated.secret(), full.secret());
  v1::AccountService::Stub account(svd_->channel());
  v1::Account who;
  grpc::Status old_status = account.GetCurrentAccount(Context(full.secret()).get(), {}, &who);
  EXPECT_EQ(old_status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(old_status), "API_KEY_REVOKED");
  EXPECT_TRUE(account.GetCurrentAccount(Context(rotated.secret()).get(), {}, &who).ok());
  EXPECT_EQ(who.api_key_id(), rotated.key().id());

  // The database holds no secret, and salts differ per key.
  pqxx::connection connection(*url_);
  pqxx::work txn(connection);
  auto rows = txn.exec("SELECT id, salt, secret_hash FROM api_keys");
  std::set<std::string> salts;
  for (const auto& row : rows) {
    for (const auto& field : row) {
      for (const std::string& secret : {read_only.secret(), rotated.secret(), *owner_a_}) {
        const std::string tail = secret.substr(secret.size() - 40);
        EXPECT_EQ(std::string(field.c_str()).find(tail), std::string::npos);
      }
    }
    salts.insert(row[1].as<std::string>());
  }
  EXPECT_EQ(salts.size(), rows.size());
}

// Goal: mutating calls are recorded with who, tenant, method, request_id and
// result; owners see their tenant only, the admin sees all.
TEST_F(SecurityTest, AuditLogRecordsMutatingCalls) {
  CreateInstance(*svd_, *owner_a_, "audit-a-1");
  const v1::Instance b1 = CreateInstance(*svd_, *owner_b_, "audit-b-1");
  // A create commits its call's row in its own transaction, a retry (the
  // first answer again) and a refused create are written by the
  // interceptor, a delete commits its row with the delete: each call has
  // exactly one row, with its final status.
  CreateInstance(*svd_, *owner_b_, "audit-b-1");
  v1::AuditService::Stub audit(svd_->channel());
  v1::ListAuditEntriesRequest b_request;
  b_request.set_page_size(1000);
  auto count_deletes = [&] {
    v1::ListAuditEntriesResponse entries;
    EXPECT_TRUE(audit.ListAuditEntries(Context(*owner_b_).get(), b_request, &entries).ok());
    int n = 0;
    for (const auto& e : entries.entries()) {
      n += e.method() == "/sv.v1.InstanceService/DeleteInstance" && e.code() == "OK" ? 1 : 0;
    }
    return n;
  };
  int deletes_before = 0;
  {
    v1::InstanceService::Stub stub(svd_->channel());
    v1::CreateInstanceRequest reused;
    reused.mutable_instance()->set_gpu_count(2);
    reused.set_request_id("audit-b-1");
    v1::Instance ignored;
    EXPECT_EQ(stub.CreateInstance(Context(*owner_b_).get(), reused, &ignored).error_code(),
              grpc::StatusCode::ALREADY_EXISTS);
    deletes_before = count_deletes();
    v1::DeleteInstanceRequest del;
    del.set_id(b1.id());
    EXPECT_TRUE(stub.DeleteInstance(Context(*owner_b_).get(), del, &ignored).ok());
  }
  const std::string viewer =
      AddUser(*owner_b_, "viewer@b.example", v1::TENANT_ROLE_VIEWER).first_key().secret();
  grpc::Status denied;
  CreateInstance(*svd_, viewer, "audit-b-denied", &denied);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A request_id over 128 bytes is recorded cut on a character boundary
  // (cut inside a character, the row was refused by PostgreSQL and lost).
  std::string long_id = "a";
  for (int i = 0; i < 64; ++i) long_id += "\u00e9";  // 2 bytes each: 129 in all.
  CreateInstance(*svd_, viewer, long_id, &denied);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  v1::ListAuditEntriesResponse b_entries;
  ASSERT_TRUE(audit.ListAuditEntries(Context(*owner_b_).get(), b_request, &b_entries).ok());
  const std::string b_tenant = Whoami(*owner_b_).tenant_id();
  bool saw_denied = false, saw_long_cut = false;
  std::multiset<std::string> b1_codes;
  int deletes = 0;
  for (const auto& e : b_entries.entries()) {
    EXPECT_EQ(e.tenant_id(), b_tenant);
    if (e.request_id() == "audit-b-1") {
      EXPECT_EQ(e.method(), "/sv.v1.InstanceService/CreateInstance");
      b1_codes.insert(e.code());
    }
    if (e.method() == "/sv.v1.InstanceService/DeleteInstance" && e.code() == "OK") {
      ++deletes;
      EXPECT_EQ(e.user_email(), "sec-b@example.com");
    }
    if (e.request_id() == "audit-b-denied") {
      saw_denied = e.code() == "PERMISSION_DENIED" && e.user_email() == "viewer@b.example";
    }
    saw_long_cut |= e.request_id() == long_id.substr(0, 127);
    EXPECT_NE(e.method(), "/sv.v1.InstanceService/ListInstances");  // Reads are not audited.
  }
  EXPECT_EQ(b1_codes, (std::multiset<std::string>{"OK", "OK", "ALREADY_EXISTS"}));
  EXPECT_EQ(deletes, deletes_before + 1);
  EXPECT_TRUE(saw_denied);
  EXPECT_TRUE(saw_long_cut);

  v1::ListAuditEntriesResponse all;
  v1::ListAuditEntriesRequest request;
  request.set_page_size(1000);
  ASSERT_TRUE(audit.ListAuditEntries(Context(svd_->admin_key()).get(), request, &all).ok());
  std::set<std::string> tenants;
  for (const auto& e : all.entries()) tenants.insert(e.tenant_id());
  EXPECT_TRUE(tenants.count(b_tenant));
  EXPECT_TRUE(tenants.count(Whoami(*owner_a_).tenant_id()));

  // svctl audit shows the same to the owner.
  RunResult r = RunCapture({SvctlPath(), "--endpoint", svd_->endpoint(), "--token", *owner_b_,
                            "audit", "--limit", "100"},
                           {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("audit-b-1"), std::string::npos) << r.out;
}

// Goal: at the spend cap, creates are refused with a clear reason and the
// tenant's instances are stopped.
TEST_F(SecurityTest, SpendCapRefusesCreatesAndStopsInstances) {
  const std::string owner = CreateTenant(*svd_, "sec-cap");
  const v1::Instance running = CreateInstance(*svd_, owner, "cap-1");
  v1::BudgetService::Stub budget(svd_->channel());
  v1::SetSpendCapRequest set;
  set.mutable_cap()->set_enabled(true);
  set.mutable_cap()->set_monthly_cap_micros(0);  // Reached at once.
  v1::SpendCap cap;
  ASSERT_TRUE(budget.SetSpendCap(Context(owner).get(), set, &cap).ok());
  EXPECT_TRUE(cap.enabled());
  grpc::Status refused;
  CreateInstance(*svd_, owner, "cap-2", &refused);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(refused), "SPEND_CAP_REACHED");
  const v1::Instance now = WaitForStopped(owner, running.id());
  EXPECT_EQ(now.state(), v1::STOPPED);
  EXPECT_EQ(now.state_reason(), "monthly spend cap reached");
  // A member may not change the cap.
  const std::string member =
      AddUser(owner, "member@cap.example", v1::TENANT_ROLE_MEMBER).first_key().secret();
  // Nor start the stopped instance past it (a start used to skip the cap:
  // a member overrode the owner's budget until the next enforcer turn).
  v1::InstanceService::Stub instances(svd_->channel());
  v1::StartInstanceRequest start;
  start.set_id(running.id());
  v1::Instance started;
  refused = instances.StartInstance(Context(member).get(), start, &started);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(refused), "SPEND_CAP_REACHED") << refused.error_message();
  v1::GetInstanceRequest get;
  get.set_id(running.id());
  ASSERT_TRUE(instances.GetInstance(Context(owner).get(), get, &started).ok());
  EXPECT_EQ(started.state(), v1::STOPPED);
  set.mutable_cap()->set_enabled(false);
  EXPECT_EQ(budget.SetSpendCap(Context(member).get(), set, &cap).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// Goal: svctl manages keys and users end to end; the new secret is printed
// once and works.
TEST_F(SecurityTest, SvctlKeysAndUsers) {
  const std::string owner = CreateTenant(*svd_, "sec-cli");
  auto svctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {SvctlPath(), "--endpoint", svd_->endpoint(), "--token",
                                     owner};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCapture(argv, {});
  };
  RunResult created = svctl({"-o", "json", "keys", "create", "--name", "ci", "--read-only"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  EXPECT_NE(created.out.find("\"secret\""), std::string::npos);
  RunResult listed = svctl({"keys", "list"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("read-only"), std::string::npos) << listed.out;
  EXPECT_EQ(listed.out.find("sv_"), std::string::npos) << "a list must not show secrets";
  RunResult added = svctl({"users", "add", "dev@cli.example", "--role", "viewer"});
  ASSERT_EQ(added.exit_code, 0) << added.err;
  RunResult users = svctl({"users", "list"});
  EXPECT_NE(users.out.find("dev@cli.example"), std::string::npos) << users.out;
  EXPECT_NE(users.out.find("viewer"), std::string::npos) << users.out;
  RunResult bad_role = svctl({"users", "add", "x@cli.example", "--role", "root"});
  EXPECT_EQ(bad_role.exit_code, 2);
}

// Goal: no API key secret ever reaches svd's log, whatever happened above
// (creates, denials, rotations, failed authentications).
TEST_F(SecurityTest, ZzSvdLogHoldsNoSecrets) {
  // Provoke logging of rejected keys too.
  CallEmpty(svd_->channel(), "/sv.v1.InstanceService/ListInstances",
            "sv_zzzzzzzzzzzzzz_" + std::string(40, 'q'));
  std::ifstream in(svd_->log_path());
  std::stringstream log;
  log << in.rdbuf();
  ASSERT_FALSE(log.str().empty());
  for (const std::string* key : {owner_a_, owner_b_}) {
    EXPECT_EQ(log.str().find(key->substr(key->size() - 40)), std::string::npos);
  }
  EXPECT_EQ(log.str().find(svd_->admin_key().substr(svd_->admin_key().size() - 40)),
            std::string::npos);
  EXPECT_EQ(log.str().find(std::string(40, 'q')), std::string::npos);
}

// Goal: a database error reaches the client as a reason and a fixed
// sentence, never with the SQL or the server's message.
TEST(SecurityErrorsTest, DatabaseErrorsDoNotLeakSql) {
  store::DatabaseOptions options;
  options.url = CreateTestDatabase();
  store::Database db(options);
  absl::Status status = db.Transact([](pqxx::work& txn) -> absl::Status {
    txn.exec("SELECT secret_column FROM no_such_table_xyz WHERE password = 'hunter2'");
    return absl::OkStatus();
  });
  ASSERT_FALSE(status.ok());
  grpc::Status out = api::ToGrpcStatus(status);
  EXPECT_EQ(out.error_code(), grpc::StatusCode::INTERNAL);
  for (const char* leak : {"no_such_table_xyz", "SELECT", "hunter2", "relation", "42P01"}) {
    EXPECT_EQ(out.error_message().find(leak), std::string::npos) << out.error_message();
    EXPECT_EQ(out.error_details().find(leak), std::string::npos) << leak;
  }
  EXPECT_EQ(api::ReasonOf(out), "DATABASE_ERROR");
  // Conflicts keep their retryable code with a fixed message too.
  grpc::Status conflict = api::ToGrpcStatus(
      Error(absl::StatusCode::kAborted, "TRANSACTION_CONFLICT",
            "ERROR: could not serialize access due to concurrent update on table ledger"));
  EXPECT_EQ(conflict.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(conflict.error_message().find("ledger"), std::string::npos);
}

}  // namespace
}  // namespace sv::testing

namespace sv::testing {
namespace {

// Goal: agents authenticate with per-node credentials: a right one
// registers, a wrong, unknown or revoked one is refused, and an API key
// (even the admin's) never opens an agent stream.
TEST_F(SecurityTest, NodeCredentialsWrongOrRevokedAreRefused) {
  v1::NodeCredentialService::Stub credentials(svd_->channel());
  v1::CreateNodeCredentialRequest request;
  request.set_node_name("sec-node-1");
  v1::CreateNodeCredentialResponse minted;
  ASSERT_TRUE(
      credentials.CreateNodeCredential(Context(svd_->admin_key()).get(), request, &minted).ok());
  auto stub = v1::AgentService::NewStub(svd_->channel());
  auto connect = [&](const std::string& token) {
    auto context = Context(token);
    auto stream = stub->Connect(context.get());
    stream->Write(AgentRegistration("sec-node-1"));
    v1::ServerMessage reply;
    if (stream->Read(&reply) && reply.has_registered()) {
      context->TryCancel();
      (void)stream->Finish();
      return grpc::Status::OK;
    }
    return stream->Finish();
  };
  EXPECT_TRUE(connect(minted.credential()).ok());
  std::string wrong = minted.credential();
  wrong.back() = wrong.back() == 'a' ? 'b' : 'a';
  EXPECT_EQ(connect(wrong).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(connect(svd_->admin_key()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  Sql("UPDATE node_credentials SET revoked_at = now() WHERE id = '" + minted.credential_id() +
      "'");
  grpc::Status revoked = connect(minted.credential());
  EXPECT_EQ(revoked.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(revoked), "NODE_CREDENTIAL_REVOKED");
}

}  // namespace
}  // namespace sv::testing

namespace sv::testing {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Goal: with --tls-cert/--tls-key svd serves gRPC only over TLS; svctl with
// --ca-file talks to it and svctl without it cannot. The certificate is a
// throwaway self-signed one made by openssl now.
TEST(SecurityTlsTest, GrpcOverTlsWithCaFile) {
  char dir_template[] = "/tmp/sv-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  RunResult made = RunCapture(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
       "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
       "-keyout", dir + "/key.pem", "-out", dir + "/cert.pem"},
      {});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  SvdOptions options;
  options.database_url = CreateTestDatabase();
  options.sim_nodes = 0;  // Simulated agents dial plaintext.
  options.extra_args = {"--tls-cert", dir + "/cert.pem", "--tls-key", dir + "/key.pem"};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());

  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = Slurp(dir + "/cert.pem");
  auto channel = grpc::CreateChannel(svd.endpoint(), grpc::SslCredentials(tls));
  v1::AccountService::Stub stub(channel);
  v1::Account account;
  grpc::Status status = stub.GetCurrentAccount(Context(svd.admin_key()).get(), {}, &account);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(account.role(), v1::OPERATOR);

  RunResult ok = RunCapture({SvctlPath(), "--endpoint", svd.endpoint(), "--token",
                             svd.admin_key(), "--ca-file", dir + "/cert.pem", "whoami"},
                            {});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("operator"), std::string::npos) << ok.out;
  RunResult plain = RunCapture({SvctlPath(), "--endpoint", svd.endpoint(), "--token",
                                svd.admin_key(), "--timeout", "3", "whoami"},
                               {});
  EXPECT_NE(plain.exit_code, 0) << "a plaintext client must not get through";
  RunResult missing_ca = RunCapture({SvctlPath(), "--endpoint", svd.endpoint(), "--token",
                                     svd.admin_key(), "--ca-file", dir + "/nope.pem", "whoami"},
                                    {});
  EXPECT_EQ(missing_ca.exit_code, 1);
  EXPECT_NE(missing_ca.err.find("cannot read CA file"), std::string::npos) << missing_ca.err;
  // The HTTP port (REST, metrics, console) is HTTPS only.
  httplib::SSLClient https("127.0.0.1", svd.http_port());
  https.set_ca_cert_path((dir + "/cert.pem").c_str());
  https.enable_server_certificate_verification(true);
  auto health = https.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Client http("127.0.0.1", svd.http_port());
  http.set_connection_timeout(3);
  http.set_read_timeout(3);
  auto plain_http = http.Get("/healthz");
  EXPECT_TRUE(!plain_http || plain_http->status != 200);
  EXPECT_EQ(svd.Stop(), 0);
}

}  // namespace
}  // namespace sv::testing

namespace sv::testing {
namespace {

// Goal: an operator's suspension stops the tenant's instances at once and
// refuses its creates, starts and volume creates (FAILED_PRECONDITION /
// TENANT_SUSPENDED, with the reason) while reads, deletes and retries of
// earlier creates keep working; it is idempotent, recorded with who and
// why, told to the tenant, and refused to members and for the operator's
// own tenant. Resuming lets the tenant start and create again.
TEST_F(SecurityTest, SuspendedTenantIsStoppedAndRefusedUntilResumed) {
  const std::string owner = CreateTenant(*svd_, "sec-suspend");
  const std::string tenant_id = TenantIdByName(*svd_, "sec-suspend");
  const std::string admin_key = svd_->admin_key();
  const v1::Instance first = CreateInstance(*svd_, owner, "susp-1");
  const v1::Instance second = CreateInstance(*svd_, owner, "susp-2");
  v1::AdminService::Stub admin(svd_->channel());
  v1::InstanceService::Stub instances(svd_->channel());

  v1::SuspendTenantRequest suspend;
  suspend.set_tenant_id(tenant_id);
  suspend.set_reason("abuse report 42: port scanning");
  v1::SuspendTenantResponse suspended;
  grpc::Status status = admin.SuspendTenant(Context(owner).get(), suspend, &suspended);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::SuspendTenantRequest bad = suspend;
  bad.clear_reason();
  status = admin.SuspendTenant(Context(admin_key).get(), bad, &suspended);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(status), "INVALID_REASON");
  bad = suspend;
  bad.set_tenant_id("ten-doesnotexist");
  status = admin.SuspendTenant(Context(admin_key).get(), bad, &suspended);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(status), "TENANT_NOT_FOUND");
  bad.set_tenant_id(Whoami(admin_key).tenant_id());
  status = admin.SuspendTenant(Context(admin_key).get(), bad, &suspended);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(status), "OPERATOR_TENANT");
  // None of those suspended anything.
  EXPECT_FALSE(Whoami(owner).tenant_suspended());

  status = admin.SuspendTenant(Context(admin_key).get(), suspend, &suspended);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(suspended.newly_suspended());
  EXPECT_EQ(suspended.instances_stopped(), 2);
  EXPECT_EQ(suspended.tenant().suspension().reason(), suspend.reason());
  for (const auto& id : {first.id(), second.id()}) {
    v1::GetInstanceRequest get;
    get.set_id(id);
    v1::Instance now;
    ASSERT_TRUE(instances.GetInstance(Context(owner).get(), get, &now).ok());
    EXPECT_EQ(now.state(), v1::STOPPED) << id;
    EXPECT_EQ(now.state_reason(), "tenant suspended by the operator");
  }

  // Refused: a new create, a start, a volume; the message says why.
  grpc::Status refused;
  CreateInstance(*svd_, owner, "susp-3", &refused);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "TENANT_SUSPENDED");
  EXPECT_NE(refused.error_message().find(suspend.reason()), std::string::npos)
      << refused.error_message();
  v1::StartInstanceRequest start;
  start.set_id(first.id());
  v1::Instance started;
  refused = instances.StartInstance(Context(owner).get(), start, &started);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "TENANT_SUSPENDED");
  v1::VolumeService::Stub volumes(svd_->channel());
  v1::CreateVolumeRequest volume;
  volume.mutable_volume()->set_name("data");
  volume.mutable_volume()->set_size_gib(10);
  volume.set_request_id("susp-vol");
  v1::Volume made;
  refused = volumes.CreateVolume(Context(owner).get(), volume, &made);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "TENANT_SUSPENDED");
  // Kept: a retry of a create accepted before, reads, deletes, whoami.
  EXPECT_EQ(CreateInstance(*svd_, owner, "susp-1").id(), first.id());
  v1::ListInstancesResponse listed;
  ASSERT_TRUE(instances.ListInstances(Context(owner).get(), {}, &listed).ok());
  EXPECT_EQ(listed.instances_size(), 2);
  v1::DeleteInstanceRequest del;
  del.set_id(second.id());
  v1::Instance deleted;
  status = instances.DeleteInstance(Context(owner).get(), del, &deleted);
  EXPECT_TRUE(status.ok()) << status.error_message();
  const v1::Account account = Whoami(owner);
  EXPECT_TRUE(account.tenant_suspended());
  EXPECT_EQ(account.suspension_reason(), suspend.reason());

  // Again: the first suspension and its reason stay.
  v1::SuspendTenantRequest again = suspend;
  again.set_reason("second report");
  ASSERT_TRUE(admin.SuspendTenant(Context(admin_key).get(), again, &suspended).ok());
  EXPECT_FALSE(suspended.newly_suspended());
  EXPECT_EQ(suspended.instances_stopped(), 0);
  EXPECT_EQ(suspended.tenant().suspension().reason(), suspend.reason());

  // svctl shows it to the operator.
  auto svctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {SvctlPath(), "--endpoint", svd_->endpoint(), "--token",
                                     admin_key};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCapture(argv, {});
  };
  RunResult shown = svctl({"admin", "tenant", "sec-suspend"});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("SUSPENDED since"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find(suspend.reason()), std::string::npos) << shown.out;
  RunResult balances = svctl({"admin", "balances"});
  ASSERT_EQ(balances.exit_code, 0) << balances.err;
  const size_t row = balances.out.find("sec-suspend ");
  ASSERT_NE(row, std::string::npos) << balances.out;
  EXPECT_NE(balances.out.substr(row, balances.out.find('\n', row) - row).find("SUSPENDED"),
            std::string::npos)
      << balances.out;

  // Resumed (by svctl): starts and creates pass again; once is enough.
  RunResult resumed = svctl({"admin", "resume", "sec-suspend", "--reason", "cleared"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed"), std::string::npos) << resumed.out;
  v1::ResumeTenantRequest resume;
  resume.set_tenant_id(tenant_id);
  resume.set_reason("cleared");
  v1::ResumeTenantResponse resume_again;
  ASSERT_TRUE(admin.ResumeTenant(Context(admin_key).get(), resume, &resume_again).ok());
  EXPECT_FALSE(resume_again.was_suspended());
  EXPECT_FALSE(resume_again.tenant().has_suspension());
  status = instances.StartInstance(Context(owner).get(), start, &started);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_NE(started.state(), v1::STOPPED);
  CreateInstance(*svd_, owner, "susp-4");
  EXPECT_FALSE(Whoami(owner).tenant_suspended());
  v1::GetTenantRequest get_tenant;
  get_tenant.set_tenant_id(tenant_id);
  v1::TenantStanding standing;
  ASSERT_TRUE(admin.GetTenant(Context(admin_key).get(), get_tenant, &standing).ok());
  ASSERT_EQ(standing.suspensions_size(), 1);
  EXPECT_EQ(standing.suspensions(0).reason(), suspend.reason());
  EXPECT_EQ(standing.suspensions(0).suspended_by(), Whoami(admin_key).user_email());
  EXPECT_EQ(standing.suspensions(0).resume_reason(), "cleared");
  EXPECT_TRUE(standing.suspensions(0).has_resume_time());

  // The tenant was told both times.
  v1::BillingService::Stub billing(svd_->channel());
  v1::Balance balance;
  ASSERT_TRUE(billing.GetBalance(Context(owner).get(), {}, &balance).ok());
  int told = 0;
  for (const auto& notice : balance.notices()) {
    if (notice.kind() == "suspension") ++told;
  }
  EXPECT_EQ(told, 2);
}

// Goal: a suspension whose stops were cut short (svd died between its
// commit and the stops) is finished by the stop loop.
TEST_F(SecurityTest, StopLoopStopsInstancesOfSuspendedTenants) {
  const std::string owner = CreateTenant(*svd_, "sec-suspend-loop");
  const std::string tenant_id = TenantIdByName(*svd_, "sec-suspend-loop");
  const v1::Instance running = CreateInstance(*svd_, owner, "loop-1");
  Sql("INSERT INTO tenant_suspensions (tenant_id, suspended_at, suspended_by, reason) "
      "VALUES ('" + tenant_id + "', now(), 'ops@example.com', 'cut short')");
  const v1::Instance now = WaitForStopped(owner, running.id());
  EXPECT_EQ(now.state(), v1::STOPPED);
  EXPECT_EQ(now.state_reason(), "tenant suspended by the operator");
}

// Goal: the admin's per-tenant instance limit refuses creates beyond it,
// with the scheduler's quota call carrying it.
TEST_F(SecurityTest, PerTenantInstanceLimit) {
  const std::string owner = CreateTenant(*svd_, "sec-quota");
  const std::string tenant = Whoami(owner).tenant_id();
  v1::SchedulerAdminService::Stub admin(svd_->channel());
  v1::SetTenantQuotaRequest set;
  set.mutable_quota()->set_tenant_id(tenant);
  set.mutable_quota()->set_gpus_in_use_max(64);
  set.mutable_quota()->set_pending_count_max(10);
  set.mutable_quota()->set_instances_max(1);
  v1::TenantQuota quota;
  ASSERT_TRUE(admin.SetTenantQuota(Context(svd_->admin_key()).get(), set, &quota).ok());
  EXPECT_EQ(quota.instances_max(), 1);
  CreateInstance(*svd_, owner, "limit-1");
  grpc::Status second;
  CreateInstance(*svd_, owner, "limit-2", &second);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(second), "INSTANCE_LIMIT_REACHED");
  // Owners cannot raise their own quota.
  EXPECT_EQ(admin.SetTenantQuota(Context(owner).get(), set, &quota).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace sv::testing
