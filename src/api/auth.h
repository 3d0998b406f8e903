#ifndef SV_API_AUTH_H_
#define SV_API_AUTH_H_

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "api/rate_limiter.h"
#include "common/clock.h"
#include "store/store.h"

namespace sv::api {

// Resolves the caller of an RPC from its `authorization: Bearer <key>`
// header. Fails with UNAUTHENTICATED (and a reason) for a missing, malformed,
// unknown, wrong or revoked key.
//
// Authenticated calls are then rate limited per key and per tenant (token
// buckets); over a limit the answer is RESOURCE_EXHAUSTED / RATE_LIMITED
// with a RetryInfo. Failed authentications are limited per peer address,
// so guessing keys is slow.
struct AuthOptions {
  RateLimit per_key{100, 300};
  RateLimit per_tenant{300, 1000};
  RateLimit failures_per_peer{5, 50};
};

class Authenticator {
 public:
  Authenticator(store::Store& store, const Clock& clock, AuthOptions options = {});
  absl::StatusOr<store::Principal> Authenticate(const grpc::ServerContext& context) const;

 private:
  absl::StatusOr<store::Principal> Identify(const grpc::ServerContext& context) const;

  store::Store& store_;
  mutable RateLimiter per_key_;
  mutable RateLimiter per_tenant_;
  mutable RateLimiter failures_per_peer_;
};

}  // namespace sv::api

#endif  // SV_API_AUTH_H_
