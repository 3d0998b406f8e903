#ifndef SV_STORE_WEBHOOK_STORE_H_
#define SV_STORE_WEBHOOK_STORE_H_

// PostgreSQL side of the tenants' webhooks (docs/notifications.md,
// migration 0112): the webhook, the notices still to deliver, and what each
// attempt did. Times come from the caller.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::store {

struct WebhookRow {
  std::string tenant_id;
  std::string url;
  std::string secret;
  std::string created_by;
  absl::Time created_at;
  int64_t starts_after = 0;
  int attempts = 0;  // Failed tries since the last delivery.
  std::optional<absl::Time> next_attempt_at;
  std::optional<absl::Time> last_attempt_at;
  std::string last_error;
  std::optional<absl::Time> last_delivered_at;
  // The first failure since the last delivery; unset while delivering.
  std::optional<absl::Time> failing_since;
  // Turned off after failing too long; Set turns it back on.
  std::optional<absl::Time> disabled_at;
  std::string disabled_reason;
  int64_t pending = 0;  // Notices not yet delivered (Get only).
};

// One notice to send.
struct WebhookNotice {
  int64_t id = 0;
  std::string kind;
  std::string instance_id;
  std::string message;
  absl::Time at;
};

class WebhookStore {
 public:
  explicit WebhookStore(Database& db) : db_(db) {}

  // Sets the tenant's webhook. A new one receives the notices written from
  // now on; a replaced one keeps its place (what was not delivered goes to
  // the new URL, unless `skip_backlog`), is turned back on if it was off,
  // and retries at once. NOT_FOUND for an unknown tenant.
  absl::StatusOr<WebhookRow> Set(const std::string& tenant_id, const std::string& url,
                                 const std::string& secret, const std::string& created_by,
                                 bool skip_backlog, absl::Time now);
  // NOT_FOUND / WEBHOOK_NOT_FOUND when the tenant has none.
  absl::StatusOr<WebhookRow> Get(const std::string& tenant_id);
  // False when there was none.
  absl::StatusOr<bool> Delete(const std::string& tenant_id);

  // Webhooks that are on, with a notice to deliver whose retry (if any) is
  // due by `now`.
  absl::StatusOr<std::vector<WebhookRow>> Due(absl::Time now, int limit);
  // The tenant's undelivered notices after `starts_after`, oldest first.
  absl::StatusOr<std::vector<WebhookNotice>> Pending(const std::string& tenant_id,
                                                     int64_t starts_after, int limit);
  // A 2xx answer: the notice is delivered and the retry count starts over.
  absl::Status RecordDelivered(const std::string& tenant_id, const std::string& url,
                               int64_t notice_id, int http_status, absl::Time now);
  // A failed try: the next one waits `retry_in`; but when the webhook has
  // been failing for `give_up_after` (zero: never), it is turned off and
  // the tenant told, in the same transaction. Returns whether it was.
  absl::StatusOr<bool> RecordFailure(const std::string& tenant_id, const std::string& error,
                                     absl::Duration retry_in, absl::Duration give_up_after,
                                     absl::Time now);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_WEBHOOK_STORE_H_
