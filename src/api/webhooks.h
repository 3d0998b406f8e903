#ifndef SV_API_WEBHOOKS_H_
#define SV_API_WEBHOOKS_H_

// Tenants' webhooks (docs/notifications.md): the URL rules, the signature,
// one POST, and the leader-only loop that delivers the tenants' notices.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "store/database.h"
#include "store/leader_loop.h"
#include "store/webhook_store.h"

namespace sv::api {

struct WebhookOptions {
  // Dev and tests only: let URLs reach loopback and private addresses.
  bool allow_private_addresses = false;
  absl::Duration timeout = absl::Seconds(5);  // Connect, then answer.
  absl::Duration interval = absl::Seconds(1);
  absl::Duration max_backoff = absl::Hours(1);
  // A webhook failing this long since its last delivery is turned off and
  // the tenant told; zero: never.
  absl::Duration give_up_after = absl::Hours(72);
};

struct WebhookUrl {
  bool https = false;
  std::string host;
  int port = 0;
  std::string path;  // With the query; "/" when empty.
};

// http(s)://host[:port][/path], at most 2,048 characters, no user info or
// fragment: INVALID_ARGUMENT / INVALID_WEBHOOK_URL otherwise.
absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url);
// OK when every address the host resolves to is public (not loopback,
// private, link-local, shared, multicast or unspecified), or when
// `allow_private`; INVALID_ARGUMENT / WEBHOOK_URL_NOT_PUBLIC or
// UNRESOLVABLE_WEBHOOK_HOST otherwise. `address`, when given, gets the
// checked address to connect to (the first IPv4 one, else the first), so
// that the request goes where the check looked, not to whatever the name
// resolves to a moment later (DNS rebinding).
absl::Status CheckWebhookHost(const WebhookUrl& url, bool allow_private,
                              std::string* address = nullptr);
// "v1=" and the hex HMAC-SHA256 of "<timestamp>.<body>" under `secret`.
std::string WebhookSignature(const std::string& secret, int64_t timestamp,
                             const std::string& body);
// A new signing secret: "whsec_" and 32 random bytes in hex.
std::string NewWebhookSecret();

// The JSON body of a notice's delivery.
std::string WebhookNoticeBody(const std::string& tenant_id, const store::WebhookNotice& notice);

struct WebhookAttempt {
  int http_status = 0;  // 0: no answer.
  std::string error;    // Empty for a 2xx answer.
  bool ok() const { return error.empty(); }
};
// One signed POST (headers X-Sv-Event-Id, X-Sv-Timestamp, X-Sv-Signature);
// redirects are not followed. The host is checked again first.
WebhookAttempt PostWebhook(const std::string& url, const std::string& secret,
                           const std::string& event_id, const std::string& body,
                           absl::Time now, const WebhookOptions& options);

// Delivers every tenant's pending notices to its webhook, oldest first; a
// failure holds that tenant's later notices and is retried after a wait
// that doubles (1 s, 2 s, ... up to max_backoff), until it has failed for
// give_up_after: then it is turned off. Leader-only.
class WebhookDispatcher {
 public:
  WebhookDispatcher(store::Database& db, const Clock& clock, WebhookOptions options);
  void SetLeaderGate(const store::LeaderGate* gate) { loop_.SetLeaderGate(gate); }
  void Start() { loop_.Start(); }
  void Stop() { loop_.Stop(); }
  // One pass: the notices delivered.
  absl::StatusOr<int> RunOnce(absl::Time now);

 private:
  store::WebhookStore store_;
  const Clock& clock_;
  WebhookOptions options_;
  store::LeaderLoop loop_;
};

}  // namespace sv::api

#endif  // SV_API_WEBHOOKS_H_
