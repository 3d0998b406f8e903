// Cached authentication across replicas (docs/security.md, "Cached
// authentication"): two real svd processes on one real PostgreSQL. A key,
// role, membership or tenant change made through replica A (or straight in
// the database) is honoured by replica B, which had the key cached, within
// the bound the docs promise; a wrong secret for a cached key id is refused;
// while B's LISTEN connection is gone B serves nothing from its cache; and a
// revoked node credential refuses its agent and ends its open stream on the
// other replica. Every wait is bounded (a few seconds).

#include <chrono>
#include <pqxx/pqxx>
#include <thread>

#include "api/errors.h"
#include "gtest/gtest.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/security.grpc.pb.h"
#include "sv/v1/sla.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;

// docs/security.md: a change is refused on every replica within the trust
// window (1 s) of its commit; in practice within milliseconds.
constexpr auto kRevocationBound = std::chrono::milliseconds(1000);

// Polls `metric` until it equals `value`, for at most 5 s.
bool WaitMetric(SvdProcess& svd, const std::string& metric, double value) {
  for (int i = 0; i < 500; ++i) {
    if (MetricSample(svd, metric) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

grpc::Status Whoami(SvdProcess& svd, const std::string& token, v1::Account* out = nullptr) {
  v1::AccountService::Stub stub(svd.channel());
  v1::Account account;
  grpc::Status s = stub.GetCurrentAccount(Context(token).get(), {}, &account);
  if (out != nullptr) *out = account;
  return s;
}

using AgentStream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>;

// Opens an agent stream to `svd` and sends the registration.
std::unique_ptr<AgentStream> OpenAgentStream(SvdProcess& svd, grpc::ClientContext* context,
                                             const std::string& credential,
                                             const std::string& node) {
  context->AddMetadata("authorization", "Bearer " + credential);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = v1::AgentService::NewStub(svd.channel())->Connect(context);
  stream->Write(AgentRegistration(node));
  return stream;
}

class AuthCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = CreateTestDatabase();
    // The tests poll every few milliseconds, failures included.
    const std::vector<std::string> no_limits = {
        "--rate-limit-key-rps", "0", "--rate-limit-tenant-rps", "0",
        "--rate-limit-auth-failures-rps", "0"};
    a_ = std::make_unique<SvdProcess>(SvdOptions{url_, 0, 1, no_limits});
    b_ = std::make_unique<SvdProcess>(SvdOptions{url_, 0, 1, no_limits});
    ASSERT_TRUE(a_->Start());
    ASSERT_TRUE(b_->Start());
    owner_ = CreateTenant(*a_, "cache-a");
    ASSERT_TRUE(WaitMetric(*b_, "sv_auth_cache_trusted", 1)) << "B's cache never became trusted";
  }

  v1::CreateApiKeyResponse NewKey(const std::string& token) {
    v1::ApiKeyService::Stub stub(a_->channel());
    v1::CreateApiKeyRequest request;
    request.set_name("cache");
    v1::CreateApiKeyResponse response;
    grpc::Status s = stub.CreateApiKey(Context(token).get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  // Calls B until `token` is cached there: the last call must be a hit.
  void WarmOnB(const std::string& token) {
    ASSERT_TRUE(Whoami(*b_, token).ok());
    const double hits = MetricSample(*b_, "sv_auth_cache_hits_total");
    ASSERT_TRUE(Whoami(*b_, token).ok());
    ASSERT_GT(MetricSample(*b_, "sv_auth_cache_hits_total"), hits) << "B did not serve from its cache";
  }

  // Calls B with `token` until `refused` says so, then for 200 ms more.
  // Every call that starts later than the bound after `since` must be
  // refused, and so must every call after the first refusal. Returns when
  // the first refused call started, after `since`. (Call starts, not ends,
  // are compared: on a loaded machine one call can take long.)
  template <typename Refused>
  std::chrono::milliseconds RefusedOnB(const std::string& token, Refused refused,
                                       SteadyClock::time_point since) {
    std::chrono::milliseconds took{-1};
    while (SteadyClock::now() - since < kRevocationBound + std::chrono::seconds(2)) {
      const auto started = SteadyClock::now();
      v1::Account account;
      grpc::Status s = Whoami(*b_, token, &account);
      if (refused(s, account)) {
        took = std::chrono::duration_cast<std::chrono::milliseconds>(started - since);
        break;
      }
      EXPECT_LE(started - since, kRevocationBound)
          << "a success for a call that started after the bound: " << s.error_message();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_GE(took.count(), 0) << "B never refused";
    const auto until = SteadyClock::now() + std::chrono::milliseconds(200);
    while (took.count() >= 0 && SteadyClock::now() < until) {
      v1::Account account;
      grpc::Status s = Whoami(*b_, token, &account);
      EXPECT_TRUE(refused(s, account)) << "a stale success after the refusal";
    }
    std::printf("refused on replica B for a call started %lld ms after the change committed\n",
                static_cast<long long>(took.count()));
    return took;
  }

  void Sql(const std::string& statement) {
    pqxx::connection connection(url_);
    pqxx::work txn(connection);
    txn.exec(statement);
    txn.commit();
  }

  std::string url_;
  std::unique_ptr<SvdProcess> a_;
  std::unique_ptr<SvdProcess> b_;
  std::string owner_;
};

auto Unauthenticated(const std::string& reason) {
  return [reason](const grpc::Status& s, const v1::Account&) {
    return s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
           (reason.empty() || api::ReasonOf(s) == reason);
  };
}

// Goal: a key revoked through replica A is refused by replica B, which had
// it cached, within the bound, with API_KEY_REVOKED; A refuses it at once.
TEST_F(AuthCacheTest, KeyRevokedOnAIsRefusedOnB) {
  const auto key = NewKey(owner_);
  WarmOnB(key.secret());
  ASSERT_TRUE(Whoami(*a_, key.secret()).ok());  // Cached on A too.
  v1::ApiKeyService::Stub stub(a_->channel());
  v1::RevokeApiKeyRequest request;
  request.set_id(key.key().id());
  v1::ApiKey revoked;
  ASSERT_TRUE(stub.RevokeApiKey(Context(owner_).get(), request, &revoked).ok());
  const auto committed = SteadyClock::now();
  grpc::Status on_a = Whoami(*a_, key.secret());
  EXPECT_EQ(on_a.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(on_a), "API_KEY_REVOKED");
  RefusedOnB(key.secret(), Unauthenticated("API_KEY_REVOKED"), committed);
  EXPECT_TRUE(Whoami(*b_, owner_).ok()) << "other keys stay valid";
}

// Goal: expiry is checked against the clock on every hit: a cached key
// whose expiry is moved into the past (in the database, as an operator
// would) is refused with API_KEY_EXPIRED.
TEST_F(AuthCacheTest, ExpiryChangeReachesB) {
  const auto key = NewKey(owner_);
  WarmOnB(key.secret());
  Sql("UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = '" +
      key.key().id() + "'");
  RefusedOnB(key.secret(), Unauthenticated("API_KEY_EXPIRED"), SteadyClock::now());
}

// Goal: a role change, a tenant change and a user's removal made through
// A reach B's cached Principal within the bound.
TEST_F(AuthCacheTest, RoleChangeTenantChangeAndRemovalReachB) {
  v1::UserService::Stub users(a_->channel());
  v1::AddUserRequest add;
  add.set_email("member@cache.example");
  add.set_role(v1::TENANT_ROLE_MEMBER);
  v1::AddUserResponse member;
  ASSERT_TRUE(users.AddUser(Context(owner_).get(), add, &member).ok());
  const std::string token = member.first_key().secret();
  WarmOnB(token);

  v1::SetUserRoleRequest demote;
  demote.set_user_id(member.user().id());
  demote.set_role(v1::TENANT_ROLE_VIEWER);
  v1::User user;
  ASSERT_TRUE(users.SetUserRole(Context(owner_).get(), demote, &user).ok());
  RefusedOnB(
      token,
      [](const grpc::Status& s, const v1::Account& a) {
        return s.ok() && a.tenant_role() == v1::TENANT_ROLE_VIEWER;
      },
      SteadyClock::now());
  // The viewer may no longer write, on B either.
  v1::InstanceService::Stub instances(b_->channel());
  v1::DeleteInstanceRequest del;
  del.set_id("ins-doesnotexist");
  v1::Instance out;
  EXPECT_EQ(instances.DeleteInstance(Context(token).get(), del, &out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  WarmOnB(token);
  Sql("UPDATE tenants SET name = 'cache-a-renamed' WHERE name = 'cache-a'");
  RefusedOnB(
      token,
      [](const grpc::Status& s, const v1::Account& a) {
        return s.ok() && a.tenant_name() == "cache-a-renamed";
      },
      SteadyClock::now());

  WarmOnB(token);
  v1::RemoveUserRequest remove;
  remove.set_user_id(member.user().id());
  v1::RemoveUserResponse removed;
  ASSERT_TRUE(users.RemoveUser(Context(owner_).get(), remove, &removed).ok());
  RefusedOnB(token, Unauthenticated(""), SteadyClock::now());
}

// Goal: a wrong secret for a key id that B has cached is refused, with the
// same answer as an unknown key, and does not disturb the right one.
TEST_F(AuthCacheTest, WrongSecretForACachedKeyIsRefused) {
  const auto key = NewKey(owner_);
  WarmOnB(key.secret());
  std::string wrong = key.secret();
  wrong.back() = wrong.back() == 'a' ? 'b' : 'a';
  const double hits = MetricSample(*b_, "sv_auth_cache_hits_total");
  grpc::Status s = Whoami(*b_, wrong);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(s), "API_KEY_UNKNOWN");
  EXPECT_GT(MetricSample(*b_, "sv_auth_cache_hits_total"), hits) << "the cached entry was consulted";
  EXPECT_TRUE(Whoami(*b_, key.secret()).ok());
}

// Goal: while B's LISTEN connection is gone (its backend terminated, and
// the database refusing new connections so it cannot come back), B serves
// nothing from its cache: a key revoked meanwhile, whose signal B can never
// receive, is refused on B's very first call. When the connection returns
// the cache is trusted again, empty of what it held, and an agent stream
// whose node credential was revoked meanwhile (a lost signal) is ended.
TEST_F(AuthCacheTest, LostListenConnectionBypassesTheCache) {
  const auto key = NewKey(owner_);
  WarmOnB(key.secret());
  v1::NodeCredentialService::Stub credentials(a_->channel());
  v1::CreateNodeCredentialRequest mint;
  mint.set_node_name("cache-node-2");
  v1::CreateNodeCredentialResponse node;
  ASSERT_TRUE(credentials.CreateNodeCredential(Context(a_->admin_key()).get(), mint, &node).ok());
  grpc::ClientContext live;
  auto stream = OpenAgentStream(*b_, &live, node.credential(), "cache-node-2");
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply) && reply.has_registered());
  const double pid = MetricSample(*b_, "sv_auth_revocation_backend_pid");
  ASSERT_GT(pid, 0);
  const double connections = MetricSample(*b_, "sv_auth_revocation_connections_total");
  pqxx::connection test_db(url_);  // Opened before connections are refused.
  const std::string db = test_db.dbname();
  pqxx::connection admin(url_ + " dbname=postgres");
  {
    pqxx::nontransaction txn(admin);
    txn.exec("ALTER DATABASE \"" + db + "\" ALLOW_CONNECTIONS false");
    txn.exec("SELECT pg_terminate_backend(" + std::to_string(static_cast<int>(pid)) + ")");
  }
  {
    pqxx::nontransaction txn(test_db);
    txn.exec("UPDATE api_keys SET revoked_at = now() WHERE id = '" + key.key().id() + "'");
    txn.exec("UPDATE node_credentials SET revoked_at = now() WHERE id = '" +
             node.credential_id() + "'");
  }
  ASSERT_TRUE(WaitMetric(*b_, "sv_auth_revocation_listening", 0));
  const double bypasses = MetricSample(*b_, "sv_auth_cache_bypasses_total");
  grpc::Status first = Whoami(*b_, key.secret());
  EXPECT_EQ(first.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "a stale success";
  EXPECT_EQ(api::ReasonOf(first), "API_KEY_REVOKED");
  EXPECT_GT(MetricSample(*b_, "sv_auth_cache_bypasses_total"), bypasses);
  EXPECT_TRUE(Whoami(*b_, owner_).ok()) << "B still serves, from the database";
  {
    pqxx::nontransaction txn(admin);
    txn.exec("ALTER DATABASE \"" + db + "\" ALLOW_CONNECTIONS true");
  }
  const auto allowed = SteadyClock::now();
  ASSERT_TRUE(WaitMetric(*b_, "sv_auth_cache_trusted", 1));
  EXPECT_GT(MetricSample(*b_, "sv_auth_revocation_connections_total"), connections);
  // B's monitor re-reads its streams' credentials after the reconnect
  // (every second): the stream ends.
  while (stream->Read(&reply)) {
  }
  EXPECT_LE(SteadyClock::now() - allowed, std::chrono::seconds(5));
  EXPECT_FALSE(stream->Finish().ok());
  EXPECT_NE(MetricSample(*b_, "sv_auth_revocation_backend_pid"), pid);
  EXPECT_EQ(api::ReasonOf(Whoami(*b_, key.secret())), "API_KEY_REVOKED");
  WarmOnB(owner_);  // The cache works again.
}

// Goal: the operator revokes a node credential through A (svctl admin
// node-credential revoke); the agent's open stream on B ends, B refuses its
// next connection with NODE_CREDENTIAL_REVOKED, and the call is audited.
TEST_F(AuthCacheTest, RevokedNodeCredentialIsRefusedEverywhere) {
  const std::vector<std::string> env = {"SVCTL_ENDPOINT=" + a_->endpoint(),
                                        "SVCTL_ADMIN_TOKEN=" + a_->admin_key(), "HOME=/tmp",
                                        "XDG_CONFIG_HOME="};
  RunResult minted = RunCapture(
      {SvctlPath(), "-o", "json", "admin", "node-credential", "create", "cache-node-1"}, env);
  ASSERT_EQ(minted.exit_code, 0) << minted.err;
  const auto field = [&](const std::string& name) {
    const std::string key = "\"" + name + "\": \"";
    const size_t at = minted.out.find(key);
    if (at == std::string::npos) return std::string();
    const size_t start = at + key.size();
    return minted.out.substr(start, minted.out.find('"', start) - start);
  };
  const std::string credential = field("credential");
  const std::string credential_id = field("credential_id");
  ASSERT_FALSE(credential.empty()) << minted.out;
  ASSERT_FALSE(credential_id.empty()) << minted.out;

  grpc::ClientContext live;
  auto stream = OpenAgentStream(*b_, &live, credential, "cache-node-1");
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply) && reply.has_registered());
  // The node's telemetry stream on B too; B has taken it once it counts
  // the batch's sample (for nobody's GPU: dropped).
  grpc::ClientContext telemetry_context;
  telemetry_context.AddMetadata("authorization", "Bearer " + credential);
  telemetry_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::StreamTelemetryResponse telemetry_totals;
  auto telemetry = v1::SlaTelemetryService::NewStub(b_->channel())
                       ->StreamTelemetry(&telemetry_context, &telemetry_totals);
  v1::SlaTelemetryBatch batch;
  batch.add_gpu_samples()->set_gpu_index(0);
  ASSERT_TRUE(telemetry->Write(batch));
  const std::string dropped = "sv_sla_samples_total{result=\"dropped\"}";
  for (int i = 0; i < 500 && MetricSample(*b_, dropped) < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(MetricSample(*b_, dropped), 1);

  // A stream that passed the credential check but has not registered: it
  // was entered among B's streams only at registration, so a revocation in
  // between missed it, and it then registered and ran for the node (desired
  // sets, heartbeats, exit reports) until its client closed it.
  grpc::ClientContext silent_context;
  silent_context.AddMetadata("authorization", "Bearer " + credential);
  silent_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto silent = v1::AgentService::NewStub(b_->channel())->Connect(&silent_context);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // B reads the credential.

  // A tenant's key may not revoke node credentials.
  v1::NodeCredentialService::Stub credentials(a_->channel());
  v1::RevokeNodeCredentialRequest request;
  request.set_credential_id(credential_id);
  v1::RevokeNodeCredentialResponse response;
  EXPECT_EQ(credentials.RevokeNodeCredential(Context(owner_).get(), request, &response)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  request.set_credential_id("ncr-doesnotexist00");
  EXPECT_EQ(credentials.RevokeNodeCredential(Context(a_->admin_key()).get(), request, &response)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);

  RunResult revoked = RunCapture(
      {SvctlPath(), "admin", "node-credential", "revoke", credential_id}, env);
  ASSERT_EQ(revoked.exit_code, 0) << revoked.err;
  EXPECT_NE(revoked.out.find("revoked " + credential_id), std::string::npos) << revoked.out;
  const auto committed = SteadyClock::now();
  // The stream on B ends (the agent would reconnect and be refused).
  while (stream->Read(&reply)) {
  }
  const auto ended = SteadyClock::now() - committed;
  EXPECT_LE(ended, kRevocationBound) << "B's stream outlived the bound";
  EXPECT_FALSE(stream->Finish().ok());
  // The silent stream was ended too: it registers nothing.
  silent->Write(AgentRegistration("cache-node-1"));
  v1::ServerMessage silent_reply;
  EXPECT_FALSE(silent->Read(&silent_reply) && silent_reply.has_registered())
      << "a stream that had not yet registered outlived the revocation";
  EXPECT_FALSE(silent->Finish().ok());
  // So does the telemetry stream: a revoked node sends no more samples.
  bool telemetry_open = true;
  while (telemetry_open && SteadyClock::now() - committed < kRevocationBound) {
    telemetry_open = telemetry->Write(batch);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(telemetry_open) << "B's telemetry stream outlived the bound";
  EXPECT_EQ(telemetry->Finish().error_code(), grpc::StatusCode::CANCELLED);

  grpc::ClientContext again;
  auto refused = OpenAgentStream(*b_, &again, credential, "cache-node-1");
  EXPECT_FALSE(refused->Read(&reply));
  grpc::Status status = refused->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(status), "NODE_CREDENTIAL_REVOKED");

  // Revoking twice is a no-op.
  request.set_credential_id(credential_id);
  EXPECT_TRUE(
      credentials.RevokeNodeCredential(Context(a_->admin_key()).get(), request, &response).ok());
  EXPECT_EQ(response.node_name(), "cache-node-1");

  pqxx::connection connection(url_);
  pqxx::work txn(connection);
  EXPECT_GE(txn.exec1("SELECT count(*) FROM audit_log WHERE method LIKE "
                      "'%RevokeNodeCredential' AND code = 'OK'")[0]
                .as<int>(),
            2);
}

}  // namespace
}  // namespace sv::testing
