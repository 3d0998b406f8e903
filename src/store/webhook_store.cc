#include "store/webhook_store.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace sv::store {
namespace {

const std::string kWebhookColumns = absl::StrCat(
    "w.tenant_id, w.url, w.secret, w.created_by, ", MicrosOf("w.created_at"),
    ", w.starts_after, w.attempts, ", MicrosOf("w.next_attempt_at"), ", ",
    MicrosOf("w.last_attempt_at"), ", w.last_error, ", MicrosOf("w.last_delivered_at"), ", ",
    MicrosOf("w.failing_since"), ", ", MicrosOf("w.disabled_at"), ", w.disabled_reason");

std::optional<absl::Time> OptionalTime(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return TimeFromMicros(f.as<int64_t>());
}

WebhookRow WebhookFromRow(const pqxx::row& r) {
  WebhookRow w;
  w.tenant_id = r[0].as<std::string>();
  w.url = r[1].as<std::string>();
  w.secret = r[2].as<std::string>();
  w.created_by = r[3].as<std::string>();
  w.created_at = TimeFromMicros(r[4].as<int64_t>());
  w.starts_after = r[5].as<int64_t>();
  w.attempts = r[6].as<int>();
  w.next_attempt_at = OptionalTime(r[7]);
  w.last_attempt_at = OptionalTime(r[8]);
  w.last_error = r[9].as<std::string>();
  w.last_delivered_at = OptionalTime(r[10]);
  w.failing_since = OptionalTime(r[11]);
  w.disabled_at = OptionalTime(r[12]);
  w.disabled_reason = r[13].as<std::string>();
  return w;
}

// The tenant's notices after the webhook's start that no delivery answered.
constexpr char kUndelivered[] =
    "FROM billing_notices n WHERE n.tenant_id = w.tenant_id AND n.id > w.starts_after "
    "AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.notice_id = n.id)";

}  // namespace

absl::StatusOr<WebhookRow> WebhookStore::Set(const std::string& tenant_id,
                                             const std::string& url, const std::string& secret,
                                             const std::string& created_by,
                                             bool skip_backlog, absl::Time now) {
  WebhookRow row;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1", tenant_id).empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
    }
    auto rows = txn.exec_params(
        absl::StrCat(
            "INSERT INTO tenant_webhooks AS w (tenant_id, url, secret, created_at, created_by, "
            "starts_after) VALUES ($1, $2, $3, $4::timestamptz, $5, "
            "coalesce((SELECT max(id) FROM billing_notices WHERE tenant_id = $1), 0)) "
            "ON CONFLICT (tenant_id) DO UPDATE SET url = EXCLUDED.url, "
            "secret = EXCLUDED.secret, created_at = EXCLUDED.created_at, "
            "created_by = EXCLUDED.created_by, attempts = 0, next_attempt_at = NULL, "
            "starts_after = CASE WHEN $6 THEN EXCLUDED.starts_after ELSE w.starts_after END, "
            "last_error = '', failing_since = NULL, disabled_at = NULL, "
            "disabled_reason = '' RETURNING ",
            kWebhookColumns),
        tenant_id, url, secret, SqlTime(now), created_by, skip_backlog);
    row = WebhookFromRow(rows[0]);
    return absl::OkStatus();
  }));
  return row;
}

absl::StatusOr<WebhookRow> WebhookStore::Get(const std::string& tenant_id) {
  std::optional<WebhookRow> row;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    row.reset();
    auto rows = txn.exec_params(absl::StrCat("SELECT ", kWebhookColumns,
                                             ", (SELECT count(*) ", kUndelivered,
                                             ") FROM tenant_webhooks w WHERE w.tenant_id = $1"),
                                tenant_id);
    if (rows.empty()) return absl::OkStatus();
    row = WebhookFromRow(rows[0]);
    row->pending = rows[0][14].as<int64_t>();
    return absl::OkStatus();
  }));
  if (!row.has_value()) {
    return Error(absl::StatusCode::kNotFound, "WEBHOOK_NOT_FOUND",
                 "the tenant has no webhook (svctl webhook set URL)");
  }
  return *row;
}

absl::StatusOr<bool> WebhookStore::Delete(const std::string& tenant_id) {
  bool deleted = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    deleted = !txn.exec_params("DELETE FROM tenant_webhooks WHERE tenant_id = $1 RETURNING 1",
                               tenant_id)
                   .empty();
    return absl::OkStatus();
  }));
  return deleted;
}

absl::StatusOr<std::vector<WebhookRow>> WebhookStore::Due(absl::Time now, int limit) {
  std::vector<WebhookRow> due;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    due.clear();
    for (const auto& r : txn.exec_params(
             absl::StrCat("SELECT ", kWebhookColumns, " FROM tenant_webhooks w "
                          "WHERE w.disabled_at IS NULL AND (w.next_attempt_at IS NULL OR "
                          "w.next_attempt_at <= $1::timestamptz) AND EXISTS (SELECT 1 ",
                          kUndelivered,
                          ") ORDER BY w.tenant_id LIMIT $2"),
             SqlTime(now), limit)) {
      due.push_back(WebhookFromRow(r));
    }
    return absl::OkStatus();
  }));
  return due;
}

absl::StatusOr<std::vector<WebhookNotice>> WebhookStore::Pending(const std::string& tenant_id,
                                                                 int64_t starts_after,
                                                                 int limit) {
  std::vector<WebhookNotice> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    out.clear();
    for (const auto& r : txn.exec_params(
             absl::StrCat("SELECT n.id, n.kind, coalesce(n.instance_id, ''), n.message, ",
                          MicrosOf("n.at"), " FROM (SELECT $1::text AS tenant_id, "
                          "$2::bigint AS starts_after) w JOIN LATERAL (SELECT n.* ",
                          kUndelivered, " ORDER BY n.id LIMIT $3) n ON true"),
             tenant_id, starts_after, limit)) {
      out.push_back({r[0].as<int64_t>(), r[1].as<std::string>(), r[2].as<std::string>(),
                     r[3].as<std::string>(), TimeFromMicros(r[4].as<int64_t>())});
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::Status WebhookStore::RecordDelivered(const std::string& tenant_id, const std::string& url,
                                           int64_t notice_id, int http_status, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    txn.exec_params(
        "INSERT INTO webhook_deliveries (notice_id, tenant_id, url, delivered_at, http_status) "
        "VALUES ($1, $2, $3, $4::timestamptz, $5) ON CONFLICT (notice_id) DO NOTHING",
        notice_id, tenant_id, url, SqlTime(now), http_status);
    txn.exec_params(
        "UPDATE tenant_webhooks SET attempts = 0, next_attempt_at = NULL, last_error = '', "
        "failing_since = NULL, last_attempt_at = $2::timestamptz, "
        "last_delivered_at = $2::timestamptz "
        "WHERE tenant_id = $1",
        tenant_id, SqlTime(now));
    return absl::OkStatus();
  });
}

absl::StatusOr<bool> WebhookStore::RecordFailure(const std::string& tenant_id,
                                                 const std::string& error,
                                                 absl::Duration retry_in,
                                                 absl::Duration give_up_after, absl::Time now) {
  bool disabled = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto rows = txn.exec_params(
        "UPDATE tenant_webhooks SET attempts = attempts + 1, last_error = $2, "
        "last_attempt_at = $3::timestamptz, "
        "failing_since = coalesce(failing_since, $3::timestamptz), "
        "next_attempt_at = $3::timestamptz + make_interval(secs => $4) "
        "WHERE tenant_id = $1 AND disabled_at IS NULL "
        "RETURNING url, $5 > 0 AND failing_since <= $3::timestamptz - make_interval(secs => $5)",
        tenant_id, error.substr(0, 500), SqlTime(now),
        static_cast<double>(absl::ToInt64Milliseconds(retry_in)) / 1000.0,
        static_cast<double>(absl::ToInt64Milliseconds(give_up_after)) / 1000.0);
    disabled = !rows.empty() && rows[0][1].as<bool>();
    if (!disabled) return absl::OkStatus();
    const std::string reason =
        absl::StrCat("failing for more than ", absl::FormatDuration(give_up_after),
                     "; last error: ", error.substr(0, 300));
    txn.exec_params(
        "UPDATE tenant_webhooks SET disabled_at = $2::timestamptz, disabled_reason = $3, "
        "next_attempt_at = NULL WHERE tenant_id = $1",
        tenant_id, SqlTime(now), reason);
    txn.exec_params(
        "INSERT INTO billing_notices (tenant_id, kind, message, at) "
        "VALUES ($1, 'webhook_disabled', $2, $3::timestamptz)",
        tenant_id,
        absl::StrCat("Your webhook ", rows[0][0].as<std::string>(), " was turned off after ",
                     reason, ". Notices since are kept: set the webhook again (svctl webhook "
                     "set URL) to turn it back on and receive them."),
        SqlTime(now));
    return absl::OkStatus();
  }));
  return disabled;
}

}  // namespace sv::store
