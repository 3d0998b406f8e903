#include "api/auth.h"

#include "api/api_keys.h"
#include "common/ids.h"
#include "common/status.h"

namespace sv::api {
namespace {
absl::Status Unauthenticated(absl::string_view reason, absl::string_view message) {
  return Error(absl::StatusCode::kUnauthenticated, reason, message);
}
}  // namespace

absl::StatusOr<store::Principal> Authenticator::Authenticate(
    const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return Unauthenticated("MISSING_CREDENTIALS",
                           "missing 'authorization: Bearer <api key>' metadata");
  }
  std::string header(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || header.compare(0, kBearer.size(), kBearer) != 0) {
    return Unauthenticated("MALFORMED_CREDENTIALS",
                           "authorization metadata must be 'Bearer <api key>'");
  }
  auto key = ParseApiKey(header.substr(kBearer.size()));
  if (!key.has_value()) {
    return Unauthenticated("MALFORMED_CREDENTIALS", "the API key is malformed");
  }
  auto record = store_.LookupApiKey(key->key_id);
  if (!record.ok()) return record.status();
  // Compare digests in constant time; an unknown key id and a wrong secret
  // give the same answer so neither can be probed.
  if (!ConstantTimeEquals(Sha256Hex(key->secret), record->secret_sha256)) {
    return Unauthenticated("API_KEY_UNKNOWN", "the API key is not known");
  }
  if (record->revoked) return Unauthenticated("API_KEY_REVOKED", "the API key was revoked");
  return record->principal;
}

}  // namespace sv::api
