#include "api/auth.h"

#include "api/api_keys.h"
#include "common/ids.h"
#include "common/status.h"

namespace sv::api {
namespace {
absl::Status Unauthenticated(absl::string_view reason, absl::string_view message) {
  return Error(absl::StatusCode::kUnauthenticated, reason, message);
}

absl::Status RateLimited(const std::string& what, absl::Duration wait) {
  const int64_t ms = absl::ToInt64Milliseconds(wait);
  return WithRetryAfter(Error(absl::StatusCode::kResourceExhausted, "RATE_LIMITED",
                              "too many requests for " + what + "; retry in " +
                                  std::to_string(ms) + " ms"),
                        ms);
}
}  // namespace

Authenticator::Authenticator(store::Store& store, const Clock& clock, AuthOptions options)
    : store_(store),
      per_key_(clock, options.per_key),
      per_tenant_(clock, options.per_tenant),
      failures_per_peer_(clock, options.failures_per_peer) {}

absl::StatusOr<store::Principal> Authenticator::Authenticate(
    const grpc::ServerContext& context) const {
  auto who = Identify(context);
  if (!who.ok()) {
    if (who.status().code() != absl::StatusCode::kUnauthenticated) return who.status();
    // The peer is "ipv4:127.0.0.1:port"; limit by address, not by port.
    std::string peer = context.peer();
    peer = peer.substr(0, peer.rfind(':'));
    absl::Duration wait = failures_per_peer_.Take(peer);
    if (wait > absl::ZeroDuration()) return RateLimited("failed authentications", wait);
    return who.status();
  }
  absl::Duration wait = per_key_.Take(who->api_key_id);
  if (wait > absl::ZeroDuration()) return RateLimited("this API key", wait);
  wait = per_tenant_.Take(who->tenant_id);
  if (wait > absl::ZeroDuration()) return RateLimited("this tenant", wait);
  return who;
}

absl::StatusOr<store::Principal> Authenticator::Identify(
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
