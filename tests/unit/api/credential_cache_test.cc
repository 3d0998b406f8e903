// The credential cache's rules on a fake clock: nothing is served or stored
// until a LISTEN connection has proven fresh, freshness lapses after the
// trust window, a lost or new connection empties it, each revocation signal
// drops exactly the entries it names, a read that raced a signal is not
// stored, and entries die after max_age.
#include "api/credential_cache.h"

#include "gtest/gtest.h"

namespace sv::api {
namespace {

store::ApiKeyRecord Record(const std::string& key, const std::string& user,
                           const std::string& tenant) {
  store::ApiKeyRecord r;
  r.principal.api_key_id = key;
  r.principal.user_id = user;
  r.principal.tenant_id = tenant;
  r.salt = "salt-" + key;
  r.secret_hash = std::string(64, 'a');
  return r;
}

class CredentialCacheTest : public ::testing::Test {
 protected:
  CredentialCacheTest() : clock_(absl::FromUnixSeconds(1'000'000)), cache_(clock_, Options()) {}
  static CredentialCacheOptions Options() {
    CredentialCacheOptions o;
    o.max_age = absl::Seconds(30);
    o.trust_window = absl::Seconds(1);
    o.entries_max = 3;
    return o;
  }
  // A listening connection whose round trip started now.
  void Listen() {
    cache_.OnListening();
    cache_.OnConfirmed(clock_.Now());
  }
  void Put(const std::string& key, const std::string& user, const std::string& tenant) {
    cache_.Insert(key, Record(key, user, tenant), cache_.Generation());
  }
  bool Has(const std::string& key) { return cache_.Find(key).has_value(); }

  FakeClock clock_;
  CredentialCache cache_;
};

TEST_F(CredentialCacheTest, NothingIsStoredOrServedBeforeTheFirstRoundTrip) {
  Put("k1", "u1", "t1");
  EXPECT_FALSE(Has("k1"));
  cache_.OnListening();  // LISTEN issued, no round trip yet.
  Put("k1", "u1", "t1");
  EXPECT_FALSE(Has("k1"));
  EXPECT_EQ(cache_.stats().bypasses, 2);
  cache_.OnConfirmed(clock_.Now());
  Put("k1", "u1", "t1");
  ASSERT_TRUE(Has("k1"));
  EXPECT_EQ(cache_.Find("k1")->salt, "salt-k1");
  EXPECT_EQ(cache_.stats().hits, 2);
}

TEST_F(CredentialCacheTest, TrustLapsesAfterTheWindowAndComesBackWithARoundTrip) {
  Listen();
  Put("k1", "u1", "t1");
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_TRUE(Has("k1"));
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(Has("k1"));  // No round trip for 1 s: the signal may be stuck.
  EXPECT_FALSE(cache_.stats().trusted);
  cache_.OnConfirmed(clock_.Now());
  EXPECT_TRUE(Has("k1"));  // Same connection: nothing was lost, only late.
}

TEST_F(CredentialCacheTest, LostOrNewConnectionEmptiesTheCache) {
  Listen();
  Put("k1", "u1", "t1");
  cache_.OnLost();
  cache_.OnConfirmed(clock_.Now());  // A late confirmation of the dead connection.
  EXPECT_FALSE(Has("k1"));
  Listen();
  EXPECT_FALSE(Has("k1"));  // Signals sent while nobody listened are lost.
  Put("k2", "u2", "t2");
  Listen();  // libpqxx reconnected under us: the same.
  EXPECT_FALSE(Has("k2"));
}

TEST_F(CredentialCacheTest, SignalsDropWhatTheyName) {
  Listen();
  Put("k1", "u1", "t1");
  Put("k2", "u2", "t1");
  Put("k3", "u3", "t2");
  cache_.OnNotification("key:k1");
  EXPECT_FALSE(Has("k1"));
  EXPECT_TRUE(Has("k2"));
  cache_.OnNotification("node:ncr-x");  // Not ours.
  EXPECT_TRUE(Has("k2"));
  cache_.OnNotification("user:u2");
  EXPECT_FALSE(Has("k2"));
  EXPECT_TRUE(Has("k3"));
  cache_.OnNotification("tenant:t2");
  EXPECT_FALSE(Has("k3"));
  Put("k1", "u1", "t1");
  cache_.OnNotification("all");
  EXPECT_FALSE(Has("k1"));
  Put("k1", "u1", "t1");
  cache_.OnNotification("something-new:x");  // Unknown: drop everything.
  EXPECT_FALSE(Has("k1"));
}

TEST_F(CredentialCacheTest, AReadThatRacedASignalIsNotStored) {
  Listen();
  const uint64_t before_read = cache_.Generation();
  // The revocation commits and its signal arrives while the read runs.
  cache_.OnNotification("key:k1");
  cache_.Insert("k1", Record("k1", "u1", "t1"), before_read);
  EXPECT_FALSE(Has("k1"));
  // A local change (Flush) counts the same.
  const uint64_t again = cache_.Generation();
  cache_.Flush();
  cache_.Insert("k1", Record("k1", "u1", "t1"), again);
  EXPECT_FALSE(Has("k1"));
}

TEST_F(CredentialCacheTest, EntriesDieAfterMaxAgeAndTheSizeIsBounded) {
  Listen();
  Put("k1", "u1", "t1");
  for (int i = 0; i < 29; ++i) {
    clock_.Advance(absl::Seconds(1));
    cache_.OnConfirmed(clock_.Now());
  }
  EXPECT_TRUE(Has("k1"));
  clock_.Advance(absl::Seconds(1));
  cache_.OnConfirmed(clock_.Now());
  EXPECT_FALSE(Has("k1"));
  Put("a", "u", "t");
  Put("b", "u", "t");
  Put("c", "u", "t");
  Put("d", "u", "t");
  EXPECT_EQ(cache_.stats().entries, 3);
  EXPECT_TRUE(Has("d"));
}

}  // namespace
}  // namespace sv::api
