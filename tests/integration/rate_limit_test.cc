// Rate limits on a real svd: per key, per tenant, and on failed logins,
// answered RESOURCE_EXHAUSTED with a RetryInfo that says when to come back.

#include <gtest/gtest.h>

#include <chrono>
#include <pqxx/pqxx>

#include "api/errors.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/error.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

int64_t RetryDelayMs(const grpc::Status& status) {
  v1::RpcStatus details;
  if (!details.ParseFromString(status.error_details())) return -1;
  for (const auto& any : details.details()) {
    v1::RetryInfo retry;
    if (any.UnpackTo(&retry)) {
      return retry.retry_delay().seconds() * 1000 + retry.retry_delay().nanos() / 1000000;
    }
  }
  return -1;
}

TEST(RateLimitTest, KeyOverItsBurstIsToldWhenToRetry) {
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 1, 1,
                            {"--rate-limit-key-rps", "1", "--rate-limit-key-burst", "5"}});
  ASSERT_TRUE(svd.Start());
  std::string token = CreateTenant(svd, "busy");
  std::string other = CreateTenant(svd, "calm");
  auto stub = v1::AccountService::NewStub(svd.channel());
  v1::Account account;
  int ok = 0;
  grpc::Status limited;
  for (int i = 0; i < 8; ++i) {
    grpc::Status s = stub->GetCurrentAccount(Context(token).get(), {}, &account);
    if (s.ok()) {
      ++ok;
    } else {
      limited = s;
    }
  }
  // The burst of 5, maybe one more refilled while we called.
  EXPECT_GE(ok, 5);
  EXPECT_LE(ok, 6);
  EXPECT_EQ(limited.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(limited), "RATE_LIMITED");
  int64_t delay = RetryDelayMs(limited);
  EXPECT_GT(delay, 0);
  EXPECT_LE(delay, 1000);
  // Another tenant's key is not slowed down.
  EXPECT_TRUE(stub->GetCurrentAccount(Context(other).get(), {}, &account).ok());
  stub.reset();
  // The operators' node-credential calls keep to the same limits (they had
  // the built-in defaults, whatever the flags said).
  auto credentials = v1::NodeCredentialService::NewStub(svd.channel());
  int minted = 0;
  grpc::Status held;
  for (int i = 0; i < 8; ++i) {
    v1::CreateNodeCredentialRequest request;
    request.set_node_name("node-" + std::to_string(i));
    v1::CreateNodeCredentialResponse response;
    grpc::Status s =
        credentials->CreateNodeCredential(Context(svd.admin_key()).get(), request, &response);
    if (s.ok()) {
      ++minted;
    } else {
      held = s;
    }
  }
  EXPECT_LE(minted, 6);
  EXPECT_EQ(held.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << held.error_message();
  credentials.reset();
}

TEST(RateLimitTest, GuessingKeysIsSlowedDown) {
  const std::string database_url = CreateTestDatabase();
  // The default burst (50); a refill slow enough that none comes during
  // the test, so the guesses below meet an empty bucket; and no cache of
  // key lookups, so only what the replica knows of a key can let it by.
  SvdProcess svd(SvdOptions{database_url, 1, 1,
                            {"--rate-limit-auth-failures-rps", "0.05",
                             "--auth-cache-max-age-ms", "0"}});
  ASSERT_TRUE(svd.Start());
  auto stub = v1::AccountService::NewStub(svd.channel());
  v1::Account account;
  const std::string in_use = CreateTenant(svd, "in-use");
  ASSERT_TRUE(stub->GetCurrentAccount(Context(in_use).get(), {}, &account).ok());
  const std::string unused = CreateTenant(svd, "unused");
  const std::string wrong = "sv_aaaaaaaaaaaaaa_" + std::string(40, 'a');
  int unauthenticated = 0, limited = 0;
  for (int i = 0; i < 80; ++i) {
    grpc::Status s = stub->GetCurrentAccount(Context(wrong).get(), {}, &account);
    unauthenticated += s.error_code() == grpc::StatusCode::UNAUTHENTICATED;
    limited += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_GE(unauthenticated, 50);  // The burst.
  EXPECT_GE(limited, 10);
  EXPECT_EQ(unauthenticated + limited, 80);
  // Over its limit, a guess is refused before any database read: with the
  // keys table locked, the answer still comes at once. (It was looked up
  // first, so each guess cost a transaction however fast they came; here
  // it waited for the lock and missed its deadline.)
  pqxx::connection db(database_url);
  pqxx::work lock(db);
  lock.exec("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE");
  auto context = Context(wrong);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::Status refused = stub->GetCurrentAccount(context.get(), {}, &account);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  lock.abort();
  // Others behind the same address are not locked out: a key that has
  // authenticated here still does (read from the database, as there is no
  // cache); one never used before waits with the address.
  EXPECT_TRUE(stub->GetCurrentAccount(Context(in_use).get(), {}, &account).ok());
  grpc::Status waits = stub->GetCurrentAccount(Context(unused).get(), {}, &account);
  EXPECT_EQ(waits.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << waits.error_message();
  stub.reset();
}

}  // namespace
}  // namespace sv::testing
