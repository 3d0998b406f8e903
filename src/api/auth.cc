#include "api/auth.h"

#include "api/api_keys.h"
#include "api/authz.h"
#include "api/authz_interceptor.h"
#include "common/ids.h"
#include "common/log_context.h"
#include "common/status.h"

namespace sv::api {

std::string CallerPeer(const grpc::ServerContextBase& context) {
  std::string peer = context.peer();
  // REST calls come over svd's in-process channel (no network peer), which
  // names the HTTP client's address; nobody else can reach that channel.
  // Its peer is "unknown" in Debian 12's gRPC (1.51), "inproc" in others; a
  // network peer is always ipv4:, ipv6: or unix:. (Checking "inproc" alone
  // left every REST call audited, and failed keys limited, as "unknown".)
  if (peer.rfind("inproc", 0) == 0 || peer == "unknown") {
    auto client = context.client_metadata().find("x-sv-rest-client");
    if (client != context.client_metadata().end()) {
      return "rest:" + std::string(client->second.data(), client->second.size());
    }
  }
  return peer;
}

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
      clock_(clock),
      cache_(options.cache),
      per_key_(clock, options.per_key),
      per_tenant_(clock, options.per_tenant),
      failures_per_peer_(clock, options.failures_per_peer) {}

absl::StatusOr<store::Principal> Authenticator::Authenticate(
    const grpc::ServerContextBase& context) const {
  auto call = CallRegistry::Default().Find(&context);
  if (!call.has_value()) {
    return Error(absl::StatusCode::kInternal, "NO_AUTHZ_CONTEXT",
                 "the call did not pass through the authorization interceptor");
  }
  if (call->rule == nullptr || call->rule->permission == Permission::kNodeAgent) {
    return Error(absl::StatusCode::kPermissionDenied, "NO_AUTHZ_RULE",
                 "the method " + call->method + " has no authorization rule");
  }
  // The peer is "ipv4:127.0.0.1:port"; limit by address, not by port.
  std::string peer = CallerPeer(context);
  if (peer.rfind("rest:", 0) != 0) peer = peer.substr(0, peer.rfind(':'));
  // A peer over its limit of failures gets no database read for a key id
  // that is neither cached nor known here (authenticated lately): guessing
  // keys cost a transaction each, however fast the guesses came. A known
  // key (its secret checked as always) still gets through, so others
  // behind the same address (a proxy, a NAT) who hold a key in use are not
  // locked out; a key never used before waits with the address.
  auto who = Identify(context, failures_per_peer_.Peek(peer));
  if (!who.ok()) {
    if (who.status().code() != absl::StatusCode::kUnauthenticated) return who.status();
    absl::Duration wait = failures_per_peer_.Take(peer);
    if (wait > absl::ZeroDuration()) return RateLimited("failed authentications", wait);
    return who.status();
  }
  logging::SetTenant(who->tenant_id);  // Log lines of this call name the tenant.
  absl::Duration wait = per_key_.Take(who->api_key_id);
  if (wait > absl::ZeroDuration()) return RateLimited("this API key", wait);
  wait = per_tenant_.Take(who->tenant_id);
  if (wait > absl::ZeroDuration()) return RateLimited("this tenant", wait);
  CallRegistry::Default().SetPrincipal(&context, *who);
  SV_RETURN_IF_ERROR(Authorize(*who, *call->rule));
  return who;
}

absl::StatusOr<store::Principal> Authenticator::Identify(
    const grpc::ServerContextBase& context, absl::Duration peer_throttled) const {
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
  auto record = Lookup(key->key_id, peer_throttled);
  if (!record.ok()) return record.status();
  // Compare digests in constant time; an unknown key id and a wrong secret
  // give the same answer so neither can be probed.
  if (!ConstantTimeEquals(SaltedSecretHash(record->salt, key->secret), record->secret_hash)) {
    return Unauthenticated("API_KEY_UNKNOWN", "the API key is not known");
  }
  if (record->revoked) return Unauthenticated("API_KEY_REVOKED", "the API key was revoked");
  if (record->expires_at.has_value() && clock_.Now() >= *record->expires_at) {
    return Unauthenticated("API_KEY_EXPIRED", "the API key has expired");
  }
  RememberKey(key->key_id);
  return record->principal;
}

namespace {
constexpr size_t kKnownKeysMax = 100000;
constexpr absl::Duration kKnownKeyAge = absl::Hours(24);
}  // namespace

bool Authenticator::KnownKey(const std::string& key_id) const {
  std::lock_guard<std::mutex> lock(known_mutex_);
  auto it = known_keys_.find(key_id);
  return it != known_keys_.end() && clock_.Now() - it->second < kKnownKeyAge;
}

void Authenticator::RememberKey(const std::string& key_id) const {
  const absl::Time now = clock_.Now();
  std::lock_guard<std::mutex> lock(known_mutex_);
  if (known_keys_.size() >= kKnownKeysMax && !known_keys_.count(key_id)) {
    for (auto it = known_keys_.begin(); it != known_keys_.end();) {
      it = now - it->second >= kKnownKeyAge ? known_keys_.erase(it) : std::next(it);
    }
    if (known_keys_.size() >= kKnownKeysMax) known_keys_.clear();  // Bounded, at worst.
  }
  known_keys_[key_id] = now;
}

absl::StatusOr<store::ApiKeyRecord> Authenticator::Lookup(const std::string& key_id,
                                                          absl::Duration peer_throttled) const {
  if (cache_ != nullptr) {
    if (auto hit = cache_->Find(key_id); hit.has_value()) return *std::move(hit);
  }
  if (peer_throttled > absl::ZeroDuration() && !KnownKey(key_id)) {
    return RateLimited("failed authentications", peer_throttled);
  }
  if (cache_ == nullptr) return store_.LookupApiKey(key_id);
  // Taken before the read: a revocation signal that arrives while the read
  // runs keeps its (possibly older) result out of the cache.
  const uint64_t generation = cache_->Generation();
  auto record = store_.LookupApiKey(key_id);
  // The secret is checked by the caller, on hits as on misses; a revoked
  // key is never stored (its refusal needs no speed).
  if (record.ok() && !record->revoked) cache_->Insert(key_id, *record, generation);
  return record;
}

void Authenticator::ForgetCachedCredentials() const {
  if (cache_ != nullptr) cache_->Flush();
}

}  // namespace sv::api
