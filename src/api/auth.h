#ifndef SV_API_AUTH_H_
#define SV_API_AUTH_H_

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace sv::api {

// Resolves the caller of an RPC from its `authorization: Bearer <key>`
// header. Fails with UNAUTHENTICATED (and a reason) for a missing, malformed,
// unknown, wrong or revoked key.
class Authenticator {
 public:
  explicit Authenticator(store::Store& store) : store_(store) {}
  absl::StatusOr<store::Principal> Authenticate(const grpc::ServerContext& context) const;

 private:
  store::Store& store_;
};

}  // namespace sv::api

#endif  // SV_API_AUTH_H_
