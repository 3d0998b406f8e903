#ifndef SV_API_AUTH_H_
#define SV_API_AUTH_H_

#include <grpcpp/server_context.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "api/credential_cache.h"
#include "api/rate_limiter.h"
#include "common/clock.h"
#include "store/store.h"

namespace sv::api {

// Resolves the caller of an RPC from its `authorization: Bearer <key>`
// header. Fails with UNAUTHENTICATED (and a reason) for a missing, malformed,
// unknown, wrong, expired or revoked key.
//
// It is also the single authorization point: the call's method comes from
// the AuthzInterceptor (authz_interceptor.h), its rule from the table of
// authz.h, and a caller without the permission gets PERMISSION_DENIED. A call
// that did not pass through the interceptor, or whose method has no rule,
// is refused (fail closed). Every service calls Authenticate first.
//
// Authenticated calls are then rate limited per key and per tenant (token
// buckets); over a limit the answer is RESOURCE_EXHAUSTED / RATE_LIMITED
// with a RetryInfo. Failed authentications are limited per peer address,
// so guessing keys is slow.
// Who called, for rate limits and the audit log: the gRPC peer, or for a
// REST call (svd's in-process channel, which only the gateway reaches)
// "rest:" and the HTTP client's address.
std::string CallerPeer(const grpc::ServerContextBase& context);

struct AuthOptions {
  RateLimit per_key{100, 300};
  RateLimit per_tenant{300, 1000};
  RateLimit failures_per_peer{5, 50};
  // Successful key lookups are cached here when set (credential_cache.h);
  // nullptr: every call reads the database.
  CredentialCache* cache = nullptr;
};

class Authenticator {
 public:
  Authenticator(store::Store& store, const Clock& clock, AuthOptions options = {});
  absl::StatusOr<store::Principal> Authenticate(const grpc::ServerContextBase& context) const;
  // This replica changed a key, user, membership or tenant: drop cached
  // lookups now rather than when the revocation signal comes back.
  void ForgetCachedCredentials() const;

 private:
  // `peer_throttled`: how long the caller's address must wait for its next
  // failed authentication; while it waits, a key that is neither cached nor
  // known (authenticated here lately) is refused without reading the
  // database.
  absl::StatusOr<store::Principal> Identify(const grpc::ServerContextBase& context,
                                            absl::Duration peer_throttled) const;
  absl::StatusOr<store::ApiKeyRecord> Lookup(const std::string& key_id,
                                             absl::Duration peer_throttled) const;

  store::Store& store_;
  const Clock& clock_;
  CredentialCache* const cache_;
  mutable RateLimiter per_key_;
  mutable RateLimiter per_tenant_;
  mutable RateLimiter failures_per_peer_;
  // Key ids (never secrets) that authenticated on this replica lately, and
  // when: a throttled address does not lock out the others behind it (a
  // proxy, a NAT) who hold keys in use, whatever the cache holds.
  bool KnownKey(const std::string& key_id) const;
  void RememberKey(const std::string& key_id) const;
  mutable std::mutex known_mutex_;
  mutable std::unordered_map<std::string, absl::Time> known_keys_;
};

}  // namespace sv::api

#endif  // SV_API_AUTH_H_
