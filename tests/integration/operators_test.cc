// A team of operators and the two-person rule for large credits, against a
// real svd and PostgreSQL (docs/security.md, "Operators"; docs/billing.md,
// "Credits above the approval limit").
#include <future>
#include <pqxx/pqxx>
#include <vector>

#include "api/api_keys.h"
#include "api/errors.h"
#include "gtest/gtest.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/billing.grpc.pb.h"
#include "sv/v1/dev_clock.grpc.pb.h"
#include "sv/v1/security.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using api::ReasonOf;

constexpr int64_t kYuan = 1'000'000;

class OperatorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = CreateTestDatabase();
    SvdOptions options;
    options.database_url = url_;
    options.sim_nodes = 1;
    // The default limit (1,000 CNY), on a fake clock so that a request can
    // be let expire.
    options.extra_args = {"--fake-clock-start", "2026-11-02T10:00:00Z"};
    svd_ = std::make_unique<SvdProcess>(options);
    ASSERT_TRUE(svd_->Start());
    admin_ = v1::AdminService::NewStub(svd_->channel());
    billing_ = v1::BillingAdminService::NewStub(svd_->channel());
    owner_ = CreateTenant(*svd_, "payer");
    tenant_id_ = TenantIdByName(*svd_, "payer");
  }

  // Adds an operator and returns its first key.
  std::string AddOperator(const std::string& email, std::string* user_id = nullptr) {
    v1::AddOperatorRequest request;
    request.set_email(email);
    v1::AddOperatorResponse response;
    grpc::Status status =
        admin_->AddOperator(Context(svd_->admin_key()).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (user_id != nullptr) *user_id = response.operator_user().user_id();
    return response.api_key();
  }

  grpc::Status Remove(const std::string& key, const std::string& user_id,
                      v1::RemoveOperatorResponse* response = nullptr) {
    v1::RemoveOperatorRequest request;
    request.set_user_id(user_id);
    request.set_reason("left the team");
    v1::RemoveOperatorResponse ignored;
    return admin_->RemoveOperator(Context(key).get(), request,
                                  response != nullptr ? response : &ignored);
  }

  std::vector<v1::OperatorUser> Operators() {
    v1::ListOperatorsResponse response;
    EXPECT_TRUE(admin_->ListOperators(Context(svd_->admin_key()).get(), {}, &response).ok());
    return {response.operators().begin(), response.operators().end()};
  }

  grpc::Status Whoami(const std::string& key, v1::Account* account) {
    v1::AccountService::Stub accounts(svd_->channel());
    return accounts.GetCurrentAccount(Context(key).get(), {}, account);
  }

  grpc::Status Request(const std::string& key, const std::string& credit_id, int64_t micros,
                       v1::CreditRequest* answer) {
    v1::IssueCreditRequest request;
    request.set_tenant_id(tenant_id_);
    request.set_credit_id(credit_id);
    request.set_amount_micros(micros);
    request.set_reason("outage of pod 3");
    return billing_->RequestCredit(Context(key).get(), request, answer);
  }

  grpc::Status Decide(const std::string& key, const std::string& credit_id, bool approve,
                      v1::CreditRequest* answer, const std::string& reason = "") {
    v1::DecideCreditRequest request;
    request.set_credit_id(credit_id);
    request.set_reason(reason);
    return approve ? billing_->ApproveCredit(Context(key).get(), request, answer)
                   : billing_->RejectCredit(Context(key).get(), request, answer);
  }

  // The tenant's paid wallet.
  int64_t Paid() {
    v1::BillingService::Stub tenant(svd_->channel());
    v1::Balance balance;
    EXPECT_TRUE(tenant.GetBalance(Context(owner_).get(), {}, &balance).ok());
    return balance.paid_micros();
  }

  std::string url_;
  std::unique_ptr<SvdProcess> svd_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::BillingAdminService::Stub> billing_;
  std::string owner_, tenant_id_;
};

// Goal: a read-only operator (support, audit) reads what operators read
// and changes nothing but its own API keys, whose every new key is as
// read-only; it does not count as the operator the platform must keep;
// removed and added again as a full operator, it changes things.
TEST_F(OperatorsTest, ReadOnlyOperatorsReadButChangeNothing) {
  v1::AddOperatorRequest add;
  add.set_email("support@ops.example");
  add.set_read_only(true);
  v1::AddOperatorResponse added;
  ASSERT_TRUE(admin_->AddOperator(Context(svd_->admin_key()).get(), add, &added).ok());
  EXPECT_TRUE(added.operator_user().read_only());
  const std::string support = added.api_key();
  const std::string support_id = added.operator_user().user_id();
  v1::Account account;
  ASSERT_TRUE(Whoami(support, &account).ok());
  EXPECT_EQ(account.role(), v1::OPERATOR);
  EXPECT_TRUE(account.read_only_operator());
  bool listed = false;
  for (const auto& o : Operators()) {
    if (o.user_id() == support_id) listed = o.read_only();
  }
  EXPECT_TRUE(listed);

  // Reads across tenants work.
  v1::GetTenantRequest get;
  get.set_tenant_id(tenant_id_);
  v1::TenantStanding standing;
  EXPECT_TRUE(admin_->GetTenant(Context(support).get(), get, &standing).ok());
  v1::ListOperatorsResponse operators;
  EXPECT_TRUE(admin_->ListOperators(Context(support).get(), {}, &operators).ok());
  v1::ListTenantBalancesResponse balances;
  EXPECT_TRUE(
      billing_->ListTenantBalances(Context(support).get(), {}, &balances).ok());

  // Changes are refused, with the reason, and change nothing.
  auto refused_read_only = [](const grpc::Status& status) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(ReasonOf(status), "READ_ONLY_OPERATOR") << status.error_message();
  };
  v1::CreditRequest answer;
  refused_read_only(Request(support, "ro-1", 5 * kYuan, &answer));
  v1::SuspendTenantRequest suspend;
  suspend.set_tenant_id(tenant_id_);
  suspend.set_reason("test");
  v1::SuspendTenantResponse suspended;
  refused_read_only(admin_->SuspendTenant(Context(support).get(), suspend, &suspended));
  v1::AddOperatorRequest another;
  another.set_email("mallory@ops.example");
  v1::AddOperatorResponse made;
  refused_read_only(admin_->AddOperator(Context(support).get(), another, &made));
  EXPECT_EQ(Paid(), 0);
  EXPECT_EQ(Operators().size(), 2u);
  ASSERT_TRUE(admin_->GetTenant(Context(support).get(), get, &standing).ok());
  EXPECT_EQ(standing.suspensions_size(), 0);

  // Its own keys it manages; a "full" key of its is read-only all the same.
  v1::ApiKeyService::Stub keys(svd_->channel());
  v1::CreateApiKeyRequest create;
  create.set_name("laptop");
  create.set_scope(v1::KEY_SCOPE_FULL);
  v1::CreateApiKeyResponse created;
  grpc::Status status = keys.CreateApiKey(Context(support).get(), create, &created);
  ASSERT_TRUE(status.ok()) << status.error_message();
  refused_read_only(Request(created.secret(), "ro-2", 5 * kYuan, &answer));
  // Only its own: another operator's keys it can neither list, rotate (and
  // be handed a full operator's key) nor revoke.
  v1::ListApiKeysResponse admin_keys;
  ASSERT_TRUE(keys.ListApiKeys(Context(svd_->admin_key()).get(), {}, &admin_keys).ok());
  ASSERT_GE(admin_keys.keys_size(), 1);
  const std::string admin_key_id = admin_keys.keys(0).id();
  v1::ListApiKeysRequest everyone;
  everyone.set_all_users(true);
  v1::ListApiKeysResponse listed_keys;
  EXPECT_EQ(keys.ListApiKeys(Context(support).get(), everyone, &listed_keys).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::RotateApiKeyRequest rotate;
  rotate.set_id(admin_key_id);
  v1::CreateApiKeyResponse rotated;
  status = keys.RotateApiKey(Context(support).get(), rotate, &rotated);
  EXPECT_EQ(ReasonOf(status), "API_KEY_NOT_FOUND") << status.error_message();
  EXPECT_TRUE(rotated.secret().empty());
  v1::RevokeApiKeyRequest revoke;
  revoke.set_id(admin_key_id);
  v1::ApiKey revoked_key;
  status = keys.RevokeApiKey(Context(support).get(), revoke, &revoked_key);
  EXPECT_EQ(ReasonOf(status), "API_KEY_NOT_FOUND") << status.error_message();
  ASSERT_TRUE(Whoami(svd_->admin_key(), &account).ok());
  // Its own it rotates.
  rotate.set_id(created.key().id());
  status = keys.RotateApiKey(Context(support).get(), rotate, &rotated);
  EXPECT_TRUE(status.ok()) << status.error_message();

  // The platform must keep an operator who may change things: with the
  // bootstrap operator the only one, it stays (LAST_OPERATOR, checked
  // before its key file is).
  std::string bootstrap_id;
  for (const auto& o : Operators()) {
    if (o.bootstrap()) bootstrap_id = o.user_id();
  }
  status = Remove(svd_->admin_key(), bootstrap_id);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReasonOf(status), "LAST_OPERATOR");

  // Removed (its keys revoked: the first and the rotated one) and added
  // again as a full operator.
  v1::RemoveOperatorResponse removed;
  ASSERT_TRUE(Remove(svd_->admin_key(), support_id, &removed).ok());
  EXPECT_EQ(removed.keys_revoked(), 2);
  EXPECT_EQ(Whoami(support, &account).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::string promoted = AddOperator("support@ops.example");
  ASSERT_TRUE(Whoami(promoted, &account).ok());
  EXPECT_FALSE(account.read_only_operator());
  status = Request(promoted, "full-1", 5 * kYuan, &answer);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Paid(), 5 * kYuan);
}

// Goal: operators add operators whose keys are operator keys; removing one
// revokes its keys at once; the last operator and the one of svd's key file
// stay; tenants cannot manage operators.
TEST_F(OperatorsTest, OperatorsAddListAndRemoveOperators) {
  std::vector<v1::OperatorUser> before = Operators();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_TRUE(before[0].bootstrap());
  const std::string bootstrap_id = before[0].user_id();

  std::string alice_id, bob_id;
  const std::string alice = AddOperator("alice@ops.example", &alice_id);
  const std::string bob = AddOperator("bob@ops.example", &bob_id);
  v1::Account account;
  ASSERT_TRUE(Whoami(alice, &account).ok());
  EXPECT_EQ(account.role(), v1::OPERATOR);
  v1::ListTenantBalancesResponse balances;
  EXPECT_TRUE(billing_->ListTenantBalances(Context(alice).get(), {}, &balances).ok());
  std::vector<v1::OperatorUser> three = Operators();
  ASSERT_EQ(three.size(), 3u);
  for (const auto& o : three) {
    if (o.user_id() != alice_id) continue;
    EXPECT_EQ(o.email(), "alice@ops.example");
    EXPECT_EQ(o.active_key_count(), 1);
    EXPECT_FALSE(o.bootstrap());
  }

  // Addresses in use.
  v1::AddOperatorRequest again;
  again.set_email("alice@ops.example");
  v1::AddOperatorResponse added;
  grpc::Status status = admin_->AddOperator(Context(bob).get(), again, &added);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(ReasonOf(status), "ALREADY_AN_OPERATOR");
  v1::UserService::Stub users(svd_->channel());
  v1::ListUsersResponse members;
  ASSERT_TRUE(users.ListUsers(Context(owner_).get(), {}, &members).ok());
  ASSERT_FALSE(members.users().empty());
  again.set_email(members.users(0).email());
  status = admin_->AddOperator(Context(bob).get(), again, &added);
  EXPECT_EQ(ReasonOf(status), "USER_EXISTS");
  again.set_email("not an address");
  EXPECT_EQ(ReasonOf(admin_->AddOperator(Context(bob).get(), again, &added)), "INVALID_EMAIL");

  // Tenants hold no admin.operators permission.
  again.set_email("mallory@tenant.example");
  status = admin_->AddOperator(Context(owner_).get(), again, &added);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ReasonOf(Remove(owner_, alice_id)), "PERMISSION_DENIED");

  // Bad ids; the key file's operator.
  EXPECT_EQ(Remove(bob, "").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ReasonOf(Remove(bob, "usr-nosuchuser")), "OPERATOR_NOT_FOUND");
  status = Remove(bob, bootstrap_id);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReasonOf(status), "BOOTSTRAP_OPERATOR");
  v1::RemoveOperatorRequest no_reason;
  no_reason.set_user_id(alice_id);
  v1::RemoveOperatorResponse removed;
  EXPECT_EQ(admin_->RemoveOperator(Context(bob).get(), no_reason, &removed).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // Bob removes Alice: her key stops working at once.
  ASSERT_TRUE(Remove(bob, alice_id, &removed).ok());
  EXPECT_EQ(removed.keys_revoked(), 1);
  EXPECT_EQ(Whoami(alice, &account).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ReasonOf(Remove(bob, alice_id)), "OPERATOR_NOT_FOUND");
  // The key file's operator removes Bob; then it is the last one.
  ASSERT_TRUE(Remove(svd_->admin_key(), bob_id).ok());
  EXPECT_EQ(Whoami(bob, &account).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  status = Remove(svd_->admin_key(), bootstrap_id);
  EXPECT_EQ(ReasonOf(status), "LAST_OPERATOR");
  ASSERT_EQ(Operators().size(), 1u);
  // A removed operator is a member without a tenant's trial: it gets an
  // empty grant, so billing's sweep of members without one does not put
  // 10 CNY of trial credit in the operators' tenant (it did, once).
  {
    pqxx::connection c(url_);
    pqxx::nontransaction n(c);
    for (const std::string& id : {alice_id, bob_id}) {
      auto grant = n.exec_params(
          "SELECT amount_micros, expired FROM trial_grants WHERE user_id = $1", id);
      ASSERT_EQ(grant.size(), 1u) << id;
      EXPECT_EQ(grant[0][0].as<int64_t>(), 0);
      EXPECT_TRUE(grant[0][1].as<bool>());
    }
  }

  // A former operator can be made one again, with a new key; the old key
  // stays revoked.
  std::string alice_again_id;
  const std::string alice2 = AddOperator("alice@ops.example", &alice_again_id);
  EXPECT_EQ(alice_again_id, alice_id);
  ASSERT_TRUE(Whoami(alice2, &account).ok());
  EXPECT_EQ(account.role(), v1::OPERATOR);
  EXPECT_EQ(Whoami(alice, &account).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // svctl.
  auto svctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {SvctlPath(), "--token", svd_->admin_key(), "admin"});
    return RunCapture(args, {"SVCTL_ENDPOINT=" + svd_->endpoint(), "HOME=/nonexistent",
                             "XDG_CONFIG_HOME="});
  };
  RunResult listed = svctl({"operators", "list"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("alice@ops.example"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("--admin-key-file"), std::string::npos) << listed.out;
  RunResult carol = svctl({"operators", "add", "carol@ops.example"});
  EXPECT_EQ(carol.exit_code, 0) << carol.err;
  EXPECT_NE(carol.out.find("sv_"), std::string::npos) << carol.out;
  RunResult gone = svctl({"operators", "remove", alice_id, "--reason", "rotation"});
  EXPECT_EQ(gone.exit_code, 0) << gone.err;
  EXPECT_NE(gone.out.find("1 key(s) revoked"), std::string::npos) << gone.out;
}

// Goal: a tenant owner cannot turn an operator's account into a member of
// its tenant, and a key of an operator's user in another tenant is never an
// operator key (the escalation this closes: AddUser with an operator's
// e-mail used to mint a platform-admin key).
TEST_F(OperatorsTest, TenantsCannotBorrowAnOperatorsAccount) {
  v1::UserService::Stub users(svd_->channel());
  v1::AddUserRequest request;
  request.set_email("operator@sv.local");  // The key file's operator.
  request.set_role(v1::TENANT_ROLE_VIEWER);
  v1::AddUserResponse response;
  grpc::Status status = users.AddUser(Context(owner_).get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReasonOf(status), "USER_IS_OPERATOR");
  EXPECT_TRUE(response.first_key().secret().empty());

  // Were such a membership and key written some other way, the key is a
  // tenant key of the tenant, not an operator's.
  api::GeneratedKey key = api::NewApiKey();
  ExecSql(url_, "INSERT INTO memberships (tenant_id, user_id, role, created_at) "
                "SELECT '" + tenant_id_ + "', id, 'viewer', now() FROM users "
                "WHERE email = 'operator@sv.local'");
  ExecSql(url_, "INSERT INTO api_keys (id, user_id, tenant_id, salt, secret_hash, "
                "created_at, name) SELECT '" + key.key_id + "', id, '" + tenant_id_ + "', '" +
                    key.salt + "', '" + key.secret_hash +
                    "', now(), 'planted' FROM users WHERE email = 'operator@sv.local'");
  v1::Account account;
  ASSERT_TRUE(Whoami(key.plaintext, &account).ok());
  EXPECT_EQ(account.role(), v1::MEMBER);
  v1::ListTenantBalancesResponse balances;
  status = billing_->ListTenantBalances(Context(key.plaintext).get(), {}, &balances);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// Goal: the operators' tenant holds operators only, operators' memberships
// change only through Add/RemoveOperator, and an owner there who is not an
// operator (one written before these rules) never reaches the operators'
// keys: listing, rotating (which would hand it a new operator key) and
// revoking them all read as unknown.
TEST_F(OperatorsTest, OperatorsKeysAreOutOfReachOfTheirTenantsOwners) {
  const std::string admin = svd_->admin_key();
  v1::UserService::Stub users(svd_->channel());
  v1::AddUserRequest add;
  add.set_email("helper@ops.example");
  add.set_role(v1::TENANT_ROLE_OWNER);
  v1::AddUserResponse added;
  grpc::Status status = users.AddUser(Context(admin).get(), add, &added);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReasonOf(status), "OPERATORS_TENANT");

  std::string alice_id;
  AddOperator("alice@ops.example", &alice_id);
  v1::SetUserRoleRequest demote;
  demote.set_user_id(alice_id);
  demote.set_role(v1::TENANT_ROLE_VIEWER);
  v1::User user;
  EXPECT_EQ(ReasonOf(users.SetUserRole(Context(admin).get(), demote, &user)), "OPERATOR_ACCOUNT");
  v1::RemoveUserRequest remove;
  remove.set_user_id(alice_id);
  v1::RemoveUserResponse removed;
  EXPECT_EQ(ReasonOf(users.RemoveUser(Context(admin).get(), remove, &removed)),
            "OPERATOR_ACCOUNT");

  // An owner of the operators' tenant who is not an operator, planted.
  api::GeneratedKey key = api::NewApiKey();
  ExecSql(url_,
          "INSERT INTO users (id, tenant_id, email, role, created_at) SELECT 'usr-planted', "
          "tenant_id, 'planted@ops.example', 'member', now() FROM users "
          "WHERE email = 'operator@sv.local'");
  ExecSql(url_,
          "INSERT INTO memberships (tenant_id, user_id, role, created_at) SELECT tenant_id, "
          "'usr-planted', 'owner', now() FROM users WHERE id = 'usr-planted'");
  ExecSql(url_, "INSERT INTO api_keys (id, user_id, tenant_id, salt, secret_hash, created_at, "
                "name) SELECT '" + key.key_id + "', id, tenant_id, '" + key.salt + "', '" +
                    key.secret_hash + "', now(), 'planted' FROM users WHERE id = 'usr-planted'");
  const std::string planted = key.plaintext;
  v1::ApiKeyService::Stub keys(svd_->channel());
  v1::ListApiKeysRequest all;
  all.set_all_users(true);
  v1::ListApiKeysResponse listed;
  ASSERT_TRUE(keys.ListApiKeys(Context(planted).get(), all, &listed).ok());
  ASSERT_EQ(listed.keys_size(), 1) << "only its own key";
  EXPECT_EQ(listed.keys(0).id(), key.key_id);
  ASSERT_TRUE(keys.ListApiKeys(Context(admin).get(), all, &listed).ok());
  std::string bootstrap_key_id;
  for (const auto& k : listed.keys()) {
    if (k.name() == "bootstrap") bootstrap_key_id = k.id();
  }
  ASSERT_FALSE(bootstrap_key_id.empty());
  v1::RotateApiKeyRequest rotate;
  rotate.set_id(bootstrap_key_id);
  rotate.set_overlap_seconds(86'400);
  v1::CreateApiKeyResponse rotated;
  status = keys.RotateApiKey(Context(planted).get(), rotate, &rotated);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(rotated.secret().empty());
  v1::RevokeApiKeyRequest revoke;
  revoke.set_id(bootstrap_key_id);
  v1::ApiKey revoked;
  EXPECT_EQ(keys.RevokeApiKey(Context(planted).get(), revoke, &revoked).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::Account account;
  ASSERT_TRUE(Whoami(admin, &account).ok()) << "the operator's key still works";
}

// Goal: a member demoted to viewer or billing, roles without instance
// rights, loses the SSH keys it added (as a removed member does), so it
// logs in to none of the tenant's instances.
TEST_F(OperatorsTest, DemotedMembersLoseTheirSshKeys) {
  v1::UserService::Stub users(svd_->channel());
  v1::AddUserRequest add;
  add.set_email("dev@payer.example");
  add.set_role(v1::TENANT_ROLE_MEMBER);
  v1::AddUserResponse added;
  ASSERT_TRUE(users.AddUser(Context(owner_).get(), add, &added).ok());
  const std::string member = added.first_key().secret();
  v1::SshKeyService::Stub ssh(svd_->channel());
  v1::AddSshKeyRequest key;
  key.set_public_key(
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP70Y+xCt5EzReeUR50s3jvnEg4Zp0K69t/uLvsMIhiw dev@test");
  v1::SshKey added_key;
  ASSERT_TRUE(ssh.AddSshKey(Context(member).get(), key, &added_key).ok());
  v1::ListSshKeysResponse listed;
  ASSERT_TRUE(ssh.ListSshKeys(Context(owner_).get(), {}, &listed).ok());
  ASSERT_EQ(listed.keys_size(), 1);

  v1::SetUserRoleRequest demote;
  demote.set_user_id(added.user().id());
  demote.set_role(v1::TENANT_ROLE_MEMBER);
  v1::User user;
  ASSERT_TRUE(users.SetUserRole(Context(owner_).get(), demote, &user).ok());
  ASSERT_TRUE(ssh.ListSshKeys(Context(owner_).get(), {}, &listed).ok());
  EXPECT_EQ(listed.keys_size(), 1) << "member keeps its keys";
  demote.set_role(v1::TENANT_ROLE_VIEWER);
  ASSERT_TRUE(users.SetUserRole(Context(owner_).get(), demote, &user).ok());
  ASSERT_TRUE(ssh.ListSshKeys(Context(owner_).get(), {}, &listed).ok());
  EXPECT_EQ(listed.keys_size(), 0);
}

// Goal: a credit up to the limit is posted at once; a larger one, or one
// that takes an operator's own credits of the day above it, waits for a
// second operator; the requester cannot approve it; approving twice at once
// posts it once; rejected and expired requests cannot be approved; nothing
// reaches the tenant before approval.
TEST_F(OperatorsTest, CreditsAboveTheLimitNeedASecondOperator) {
  const std::string first = svd_->admin_key();
  const std::string second = AddOperator("second@ops.example");
  const std::string third = AddOperator("third@ops.example");
  const int64_t paid_before = Paid();

  v1::CreditRequest answer;
  ASSERT_TRUE(Request(first, "small", 5 * kYuan, &answer).ok());
  EXPECT_EQ(answer.state(), v1::CREDIT_POSTED);
  EXPECT_FALSE(answer.needs_approval());
  EXPECT_EQ(answer.transfer().idempotency_key(), "credit:small");
  EXPECT_EQ(Paid(), paid_before + 5 * kYuan);

  // IssueCredit refuses a large credit and writes nothing.
  v1::IssueCreditRequest direct;
  direct.set_tenant_id(tenant_id_);
  direct.set_credit_id("direct-big");
  direct.set_amount_micros(2'000 * kYuan);
  direct.set_reason("outage of pod 3");
  v1::Transfer transfer;
  grpc::Status status = billing_->IssueCredit(Context(first).get(), direct, &transfer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReasonOf(status), "CREDIT_NEEDS_APPROVAL");

  // A large request waits; replays return it; a changed one is refused.
  ASSERT_TRUE(Request(first, "big", 2'000 * kYuan, &answer).ok());
  EXPECT_EQ(answer.state(), v1::CREDIT_PENDING_APPROVAL);
  EXPECT_TRUE(answer.needs_approval());
  EXPECT_FALSE(answer.has_transfer());
  EXPECT_EQ(answer.requested_by(), "operator@sv.local");
  ASSERT_TRUE(Request(first, "big", 2'000 * kYuan, &answer).ok());
  EXPECT_EQ(answer.state(), v1::CREDIT_PENDING_APPROVAL);
  EXPECT_EQ(ReasonOf(Request(first, "big", 3'000 * kYuan, &answer)), "IDEMPOTENCY_KEY_REUSED");
  EXPECT_EQ(ReasonOf(Request(first, "small", 5 * kYuan + 1, &answer)), "IDEMPOTENCY_KEY_REUSED");
  direct.set_credit_id("big");
  direct.set_amount_micros(5 * kYuan);
  EXPECT_EQ(ReasonOf(billing_->IssueCredit(Context(first).get(), direct, &transfer)),
            "CREDIT_REQUESTED");
  EXPECT_EQ(Paid(), paid_before + 5 * kYuan);

  v1::ListCreditRequestsRequest pending_only;
  pending_only.set_pending_only(true);
  v1::ListCreditRequestsResponse listed;
  ASSERT_TRUE(billing_->ListCreditRequests(Context(second).get(), pending_only, &listed).ok());
  ASSERT_EQ(listed.credit_requests_size(), 1);
  EXPECT_EQ(listed.credit_requests(0).credit_id(), "big");
  EXPECT_EQ(listed.approval_above_micros(), 1'000 * kYuan);

  // Not by the one who asked.
  status = Decide(first, "big", true, &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReasonOf(status), "SAME_OPERATOR");
  EXPECT_EQ(ReasonOf(Decide(second, "nope", true, &answer)), "CREDIT_REQUEST_NOT_FOUND");
  EXPECT_EQ(Decide(second, "", true, &answer).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Decide(second, "big", false, &answer).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT)
      << "a rejection needs a reason";

  // Two operators approve at once: one posting.
  auto approve = [&](const std::string& key) {
    v1::CreditRequest out;
    grpc::Status s = Decide(key, "big", true, &out, "checked the incident");
    return std::make_pair(s.ok(), out);
  };
  auto a = std::async(std::launch::async, approve, second);
  auto b = std::async(std::launch::async, approve, third);
  auto [a_ok, a_out] = a.get();
  auto [b_ok, b_out] = b.get();
  EXPECT_TRUE(a_ok && b_ok);
  EXPECT_EQ(a_out.state(), v1::CREDIT_POSTED);
  EXPECT_EQ(a_out.decided_by(), b_out.decided_by());
  EXPECT_EQ(a_out.transfer().id(), b_out.transfer().id());
  EXPECT_EQ(Paid(), paid_before + 2'005 * kYuan);
  status = Decide(second, "big", false, &answer, "too late");
  EXPECT_EQ(ReasonOf(status), "CREDIT_ALREADY_POSTED");

  // Splitting: small credits of one operator add up over 24 hours.
  ASSERT_TRUE(Request(second, "part-1", 600 * kYuan, &answer).ok());
  EXPECT_EQ(answer.state(), v1::CREDIT_POSTED);
  ASSERT_TRUE(Request(second, "part-2", 600 * kYuan, &answer).ok());
  EXPECT_EQ(answer.state(), v1::CREDIT_PENDING_APPROVAL);
  direct.set_credit_id("part-3");
  direct.set_amount_micros(600 * kYuan);
  EXPECT_EQ(ReasonOf(billing_->IssueCredit(Context(second).get(), direct, &transfer)),
            "CREDIT_NEEDS_APPROVAL");
  // The requester withdraws it; it cannot be approved after.
  ASSERT_TRUE(Decide(second, "part-2", false, &answer, "split by mistake").ok());
  EXPECT_EQ(answer.state(), v1::CREDIT_REJECTED);
  EXPECT_EQ(answer.decision_reason(), "split by mistake");
  EXPECT_EQ(ReasonOf(Decide(third, "part-2", true, &answer)), "CREDIT_REJECTED");
  EXPECT_EQ(Paid(), paid_before + 2'605 * kYuan);

  // A request not approved within 7 days expires.
  ASSERT_TRUE(Request(third, "late", 1'500 * kYuan, &answer).ok());
  v1::DevClockService::Stub clock(svd_->channel());
  v1::AdvanceClockRequest advance;
  advance.mutable_by()->set_seconds(8 * 24 * 3600);
  v1::ClockTime now;
  ASSERT_TRUE(clock.AdvanceClock(Context(first).get(), advance, &now).ok());
  status = Decide(first, "late", true, &answer);
  EXPECT_EQ(ReasonOf(status), "CREDIT_REQUEST_EXPIRED");
  ASSERT_TRUE(billing_->ListCreditRequests(Context(first).get(), pending_only, &listed).ok());
  EXPECT_EQ(listed.credit_requests_size(), 0);
  ASSERT_TRUE(billing_->ListCreditRequests(Context(first).get(), {}, &listed).ok());
  ASSERT_EQ(listed.credit_requests_size(), 5);
  EXPECT_EQ(listed.credit_requests(0).credit_id(), "late");
  EXPECT_EQ(listed.credit_requests(0).state(), v1::CREDIT_EXPIRED);
  EXPECT_EQ(Paid(), paid_before + 2'605 * kYuan);
  // Pages of two: the same five, newest first; a bad token is refused.
  v1::ListCreditRequestsRequest paged;
  paged.set_page_size(2);
  std::vector<std::string> ids;
  for (int page = 0; page < 5; ++page) {
    v1::ListCreditRequestsResponse got;
    ASSERT_TRUE(billing_->ListCreditRequests(Context(first).get(), paged, &got).ok());
    for (const auto& c : got.credit_requests()) ids.push_back(c.credit_id());
    if (got.next_page_token().empty()) break;
    paged.set_page_token(got.next_page_token());
  }
  ASSERT_EQ(ids.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ids[i], listed.credit_requests(i).credit_id());
  paged.set_page_token("x");
  EXPECT_EQ(ReasonOf(billing_->ListCreditRequests(Context(first).get(), paged, &listed)),
            "INVALID_PAGE_TOKEN");

  // svctl: a pending request, listed, approved by the other operator.
  auto svctl = [&](const std::string& key, std::vector<std::string> args) {
    args.insert(args.begin(), {SvctlPath(), "--token", key, "admin"});
    return RunCapture(args, {"SVCTL_ENDPOINT=" + svd_->endpoint(), "HOME=/nonexistent",
                             "XDG_CONFIG_HOME="});
  };
  RunResult asked = svctl(first, {"credit", "payer", "1200", "--credit-id", "cli-big",
                                  "--reason", "SLA goodwill"});
  EXPECT_EQ(asked.exit_code, 0) << asked.err;
  EXPECT_NE(asked.out.find("PENDING_APPROVAL"), std::string::npos) << asked.out;
  EXPECT_NE(asked.out.find("svctl admin credits approve cli-big"), std::string::npos)
      << asked.out;
  RunResult pending = svctl(second, {"credits", "list", "--pending"});
  EXPECT_EQ(pending.exit_code, 0) << pending.err;
  EXPECT_NE(pending.out.find("cli-big"), std::string::npos) << pending.out;
  EXPECT_NE(pending.out.find("credits above 1000.000000 CNY need a second operator"),
            std::string::npos)
      << pending.out;
  RunResult self = svctl(first, {"credits", "approve", "cli-big"});
  EXPECT_NE(self.exit_code, 0);
  EXPECT_NE(self.err.find("SAME_OPERATOR"), std::string::npos) << self.err;
  RunResult approved = svctl(second, {"credits", "approve", "cli-big"});
  EXPECT_EQ(approved.exit_code, 0) << approved.err;
  EXPECT_NE(approved.out.find("POSTED"), std::string::npos) << approved.out;
  EXPECT_EQ(Paid(), paid_before + 3'805 * kYuan);

  // The ledger still balances.
  v1::RunAuditResponse audit;
  ASSERT_TRUE(billing_->RunAudit(Context(first).get(), {}, &audit).ok());
  EXPECT_TRUE(audit.ok()) << (audit.failures().empty() ? "" : audit.failures(0));
}

}  // namespace
}  // namespace sv::testing
