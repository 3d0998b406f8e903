// Read paths: balances, transfers, usage, tenants' balances, revenue.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "billing/billing.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"
#include "store/charges_sql.h"

namespace sv::billing {
namespace {

using store::SqlTime;

constexpr int kNoticesMax = 20;
constexpr int64_t kMaxUs = 253'402'300'799'000'000;  // 9999-12-31, in µs.
constexpr int64_t kMinUs = -62'135'596'800'000'000;  // 0001-01-01, in µs.
constexpr int64_t kMinuteUs = 60'000'000;

// Balances of one tenant from the columns of kFundsColumns.
constexpr char kFundsColumns[] =
    "t.billing_mode, "
    "max(a.balance_micros) FILTER (WHERE a.kind = 'paid_wallet'), "
    "max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), "
    "max(a.balance_micros) FILTER (WHERE a.kind = 'receivable'), "
    "max(a.credit_limit_micros) FILTER (WHERE a.kind = 'receivable'), "
    "(SELECT max((extract(epoch from g.expires_at) * 1000000)::bigint) FROM trial_grants g "
    " WHERE g.tenant_id = t.id AND NOT g.expired AND g.amount_micros > 0), "
    "(coalesce((SELECT sum(i.gpu_count * coalesce((SELECT p.unit_price_micros FROM price_book p "
    "  WHERE p.item_kind = 'gpu_minute' AND p.item IN (i.gpu_model, '*') "
    "  AND p.effective_from <= $2::timestamptz ORDER BY (p.item = '*'), p.effective_from DESC "
    "  LIMIT 1), 0)) FROM instances i WHERE i.tenant_id = t.id AND i.state = 'RUNNING'), 0) "
    // Hourly prices: the fees of running apps and the tenant's live volumes.
    " + div(coalesce((SELECT sum(ap.price_per_hour_micros) FROM instances i "
    "    JOIN instance_apps ap ON ap.instance_id = i.id "
    "    WHERE i.tenant_id = t.id AND i.state = 'RUNNING'), 0) "
    "  + coalesce((SELECT sum(v.size_gib * coalesce((SELECT p.unit_price_micros FROM price_book p "
    "      WHERE p.item_kind = 'storage_gib_hour' AND p.item IN (v.kind, '*') "
    "      AND p.effective_from <= $2::timestamptz "
    "      ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0)) "
    "    FROM volumes v WHERE v.tenant_id = t.id AND v.deleted_at IS NULL), 0), 60))"
    "::bigint";

Balance ReadBalance(const pqxx::row& row, int offset) {
  Balance b;
  b.mode = row[offset].as<std::string>() == "postpaid" ? BillingMode::kPostpaid
                                                       : BillingMode::kPrepaid;
  b.paid_micros = row[offset + 1].as<int64_t>();
  b.trial_micros = row[offset + 2].as<int64_t>();
  b.receivable_micros = row[offset + 3].as<int64_t>();
  b.credit_limit_micros = row[offset + 4].as<int64_t>();
  if (!row[offset + 5].is_null()) {
    b.trial_expires_at = absl::FromUnixMicros(row[offset + 5].as<int64_t>());
  }
  b.burn_micros_per_minute = row[offset + 6].as<int64_t>();
  b.available_micros = b.trial_micros + (b.mode == BillingMode::kPostpaid
                                             ? b.receivable_micros + b.credit_limit_micros
                                             : b.paid_micros);
  return b;
}

// The low-credit warning for these funds and running cost. The wording is
// that of the rows WarnLowCredit writes (billing/metering.cc).
std::string LowCreditMessage(int64_t available_micros, int64_t per_minute_micros) {
  const int64_t minutes = std::max<int64_t>(0, available_micros) / per_minute_micros;
  return absl::StrCat("credit for about ", minutes, " more minutes at ", Yuan(per_minute_micros),
                      " per minute; top up to keep instances running and volumes paid for");
}

}  // namespace

absl::StatusOr<Balance> Billing::GetBalance(const std::string& tenant_id, absl::Time now) {
  Balance balance;
  bool found = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(
        absl::StrCat("SELECT ", kFundsColumns, " FROM tenants t JOIN ledger_accounts a "
                     "ON a.tenant_id = t.id WHERE t.id = $1 GROUP BY t.id"),
        tenant_id, SqlTime(now));
    found = !rows.empty();
    if (!found) return absl::OkStatus();
    balance = ReadBalance(rows[0], 0);
    // Whether each notice still holds (the rows stay either way): a credit
    // stop of an instance until the instance runs again; unpaid storage
    // while a live volume of the tenant is unpaid, so a tenant who paid is
    // no longer told its volumes will be deleted.
    auto notices = txn.exec_params(
        "SELECT n.kind, coalesce(n.instance_id, ''), n.message, "
        "(extract(epoch from n.at) * 1000000)::bigint, "
        "CASE WHEN n.kind <> 'credit_exhausted' THEN true "
        "     WHEN n.instance_id IS NULL THEN EXISTS (SELECT 1 FROM volumes v "
        "       WHERE v.tenant_id = n.tenant_id AND v.unpaid_since_minute IS NOT NULL "
        "       AND v.deleted_at IS NULL) "
        "     ELSE NOT EXISTS (SELECT 1 FROM instance_events e "
        "       WHERE e.instance_id = n.instance_id AND e.to_state = 'RUNNING' "
        "       AND e.at > n.at) END "
        "FROM billing_notices n "
        "WHERE n.tenant_id = $1 AND n.kind NOT IN ('instance_ended', 'instance_running') "
        "ORDER BY n.at DESC, n.id DESC LIMIT $2",
        tenant_id, kNoticesMax);
    // A low-credit warning is shown while it holds: once a top-up, a
    // higher limit or fewer running GPUs cover the warning's minutes, it
    // no longer asks the tenant to top up (the row stays). While it holds,
    // the newest warning alone is shown, with the minutes left and the
    // running cost of now: the row's figures are those of when it was
    // written (warnings are written at most once an hour), and a tenant
    // who started more GPUs since read "about 40 more minutes" with 10 left.
    const bool credit_low =
        balance.burn_micros_per_minute > 0 &&
        balance.available_micros <
            balance.burn_micros_per_minute * options_.low_credit_warning_minutes;
    bool low_credit_shown = false;
    for (const auto& n : notices) {
      std::string message = n[2].as<std::string>();
      if (n[0].as<std::string>() == "low_credit") {
        if (!credit_low || low_credit_shown) continue;
        low_credit_shown = true;
        message = LowCreditMessage(balance.available_micros, balance.burn_micros_per_minute);
      }
      if (!n[4].as<bool>()) continue;
      balance.notices.push_back({n[0].as<std::string>(), n[1].as<std::string>(),
                                 std::move(message), absl::FromUnixMicros(n[3].as<int64_t>())});
    }
    return absl::OkStatus();
  }));
  if (!found) return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
  return balance;
}

namespace {

// One ListTransfers query: the page after `after` (decoded cursor) among the
// rows whose key lies in [from, to).
//
// The order is (key, source, id or instance number, minute, leg). A
// transfer's key is its posting time; a minute charge's key is the end of the
// minute it charges. The tenant's charges are found by probing the primary
// key (minute, tenant number, instance number) once per minute of [minute
// bounds], which the caller keeps to a window next to the page's position,
// never the tenant's whole history. The time filter applies to the same key:
// charges are selected by the minute charged, as invoices are. The minute
// bounds only narrow the probes; the exact comparisons on the key follow.
std::vector<TransferRecord> ReadTransferPage(pqxx::work& txn, const std::string& tenant_id,
                                             const TransferFilter& filter,
                                             std::optional<int64_t> from_us,
                                             std::optional<int64_t> to_us, bool has_cursor,
                                             const int64_t (&after)[5]) {
  auto floor_minute = [](int64_t us) {
    return us >= 0 ? us / kMinuteUs : -((-us + kMinuteUs - 1) / kMinuteUs);
  };
  std::optional<int64_t> lo_us = from_us, hi_us = to_us;
  if (has_cursor && !filter.newest_first) lo_us = std::max(lo_us.value_or(after[0]), after[0]);
  if (has_cursor && filter.newest_first) hi_us = std::min(hi_us.value_or(after[0]), after[0]);
  std::optional<int64_t> minute_lo, minute_hi;
  if (lo_us) minute_lo = floor_minute(*lo_us) - 1;
  if (hi_us) minute_hi = floor_minute(*hi_us);

  const char* cmp = filter.newest_first ? "<" : ">";
  const char* cmp_eq = filter.newest_first ? "<=" : ">=";
  const char* dir = filter.newest_first ? " DESC" : "";
  const std::string cursor_row =
      "('epoch'::timestamptz + $8::bigint * interval '1 microsecond', $9::smallint, "
      "$10::bigint, $11::bigint, $12::smallint)";
  const std::string cursor_at = "('epoch'::timestamptz + $8::bigint * interval '1 microsecond')";
  const std::string from_at = "('epoch'::timestamptz + $4::bigint * interval '1 microsecond')";
  const std::string to_at = "('epoch'::timestamptz + $5::bigint * interval '1 microsecond')";
  const std::string charge_key = "('epoch'::timestamptz + (c.minute + 1) * interval '1 minute')";
  const std::string sql = absl::StrCat(
      "WITH t AS ((",
      // Transfers other than minute charges: the tenant's, in posting order
      // (index ledger_transfers_tenant_at, migration 0080).
      "SELECT t.id, t.idempotency_key, t.leg, t.kind, t.from_account_id, t.to_account_id, "
      "t.amount_micros, t.instance_id, t.usage_minute, t.at, t.at AS k, 0::smallint AS src, "
      "t.id AS src_no, 0::bigint AS src_minute FROM ledger_transfers t "
      "WHERE t.tenant_id = $1 AND $2 <> 'charge' AND ($2 = '' OR t.kind = $2) "
      "AND ($3 = '' OR t.instance_id = $3) "
      "AND ($4::bigint IS NULL OR t.at >= ", from_at, ") "
      "AND ($5::bigint IS NULL OR t.at < ", to_at, ") "
      "AND ($7::int = 0 OR (t.at ", cmp_eq, " ", cursor_at, " AND (t.at, 0::smallint, t.id, "
      "0::bigint, t.leg) ", cmp, " ", cursor_row, ")) ",
      "ORDER BY t.at", dir, ", t.id", dir, ", t.leg", dir, " LIMIT $6) UNION ALL (",
      // Minute charges: the tenant's, probed minute by minute through the
      // primary key (minute, tenant number, instance number) over the
      // window's minutes, which lie between the tenant's creation and the
      // last billed minute. Within a minute the order is the key's.
      "SELECT NULL::bigint, 'charge:' || i.id || ':' || c.minute, l.leg::smallint, "
      "'charge'::text, l.from_account_id, c.revenue_account, l.amount, i.id, c.minute, c.at, "
      "c.k, 1::smallint, c.instance_no, c.minute FROM (SELECT c.*, ", charge_key, " AS k FROM ",
      store::TenantChargesSql("$1", "$13::bigint",
                              "$14::bigint + 1"),
      " c WHERE $2 IN ('', 'charge') "
      "AND ($3 = '' OR c.instance_no = (SELECT billing_no FROM instances "
      "WHERE id = $3 AND tenant_id = $1)) "
      "AND ($4::bigint IS NULL OR ", charge_key, " >= ", from_at, ") "
      "AND ($5::bigint IS NULL OR ", charge_key, " < ", to_at, ") "
      "AND ($7::int = 0 OR (", charge_key, ", 1::smallint, c.instance_no, c.minute) ", cmp_eq,
      " ($8::bigint * interval '1 microsecond' + 'epoch'::timestamptz, $9::smallint, "
      "$10::bigint, $11::bigint)) "
      // One charge row more than a page: the row at the cursor may have no
      // leg left after it.
      "ORDER BY c.minute", dir, ", c.instance_no", dir, " LIMIT $6 + 1) c "
      "JOIN instances i ON i.billing_no = c.instance_no "
      "CROSS JOIN LATERAL (VALUES (0, c.trial_account, c.trial_micros), "
      "(1, c.main_account, c.main_micros)) AS l (leg, from_account_id, amount) "
      "WHERE l.amount > 0)) "
      "SELECT ", internal::kTransferColumns, ", (extract(epoch from t.k) * 1000000)::bigint "
      "FROM t", internal::kTransferJoins,
      "WHERE ($7::int = 0 OR (t.k, t.src, t.src_no, t.src_minute, t.leg) ", cmp, " ", cursor_row,
      ") ORDER BY t.k", dir, ", t.src", dir, ", t.src_no", dir, ", t.src_minute", dir, ", t.leg",
      dir, " LIMIT $6");
  auto rows = txn.exec_params(sql, tenant_id, filter.kind, filter.instance_id, from_us, to_us,
                              filter.limit, has_cursor ? 1 : 0, after[0], after[1], after[2],
                              after[3], after[4], minute_lo, minute_hi);
  std::vector<TransferRecord> out;
  for (const auto& row : rows) {
    TransferRecord t = internal::ReadTransfer(row, tenant_id);
    t.cursor = absl::StrCat(row[15].as<int64_t>(), ".", row[12].as<int>(), ".",
                            row[13].as<int64_t>(), ".", row[14].as<int64_t>(), ".", t.leg);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<TransferRecord>> Billing::ListTransfers(
    const std::string& tenant_id, const TransferFilter& filter) {
  // The cursor is "key_us.src.no.minute.leg" (TransferRecord::cursor).
  int64_t after[5] = {0, 0, 0, 0, 0};
  const bool has_cursor = !filter.after.empty();
  if (has_cursor) {
    std::vector<std::string> parts = absl::StrSplit(filter.after, '.');
    bool ok = parts.size() == 5;
    for (size_t i = 0; ok && i < parts.size(); ++i) ok = absl::SimpleAtoi(parts[i], &after[i]);
    // The key is a time PostgreSQL can hold: the windows below add to it
    // (a forged key near the int64 limit overflowed), and the database
    // refused one before 4713 BC; the source and the leg are smallints.
    if (ok && (after[0] < kMinUs || after[0] > kMaxUs || after[1] < 0 || after[1] > 1 ||
               after[4] < 0 || after[4] > 32767)) {
      ok = false;
    }
    if (!ok) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                   "page_token is not one this server returned");
    }
  }
  // Times outside what PostgreSQL stores are clamped to sane bounds.
  auto clamp_us = [](absl::Time t) {
    return std::clamp<int64_t>(absl::ToUnixMicros(t), -kMaxUs, kMaxUs);
  };
  std::optional<int64_t> from_us, to_us;
  if (filter.from) from_us = clamp_us(*filter.from);
  if (filter.to) to_us = clamp_us(*filter.to);
  // Charges of many instances are read in a window of keys next to the
  // page's position, widened until it holds a page: a tenant with hundreds
  // of instances running at once fills a page from a minute or two of them,
  // where one page per instance would read hundreds of pages. The rows of
  // a window are exactly the first rows of the whole order: every row
  // outside it is later (earlier, newest first) than every row inside it.
  // Charges are read minute by minute (primary key (minute, tenant number,
  // instance number)), so one instance's are windowed too; a page without
  // charges needs no window.
  const bool windowed = filter.kind.empty() || filter.kind == "charge";
  std::vector<TransferRecord> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    txn.exec("SET LOCAL jit = off");  // See store::TenantChargesSql.
    if (!windowed) {
      out = ReadTransferPage(txn, tenant_id, filter, from_us, to_us, has_cursor, after);
      internal::FillReasons(txn, &out);
      return absl::OkStatus();
    }
    // Where the tenant's history starts (nothing has a key before it), and
    // how many instances run now (their minutes fill a window).
    auto stats = txn.exec_params(
        "SELECT least((SELECT (extract(epoch from min(created_at)) * 1000000)::bigint "
        "FROM instances WHERE tenant_id = $1), (SELECT (extract(epoch from min(at)) * "
        "1000000)::bigint FROM ledger_transfers WHERE tenant_id = $1)), "
        "(SELECT count(*) FROM instances WHERE tenant_id = $1 AND state = 'RUNNING' "
        "AND ($2 = '' OR id = $2))",
        tenant_id, filter.instance_id);
    if (stats[0][0].is_null()) return absl::OkStatus();  // No history at all.
    const int64_t earliest_us = stats[0][0].as<int64_t>();
    const int64_t running = std::max<int64_t>(1, stats[0][1].as<int64_t>());
    // Where windows of the newest-first order start (a minute is charged
    // after it ends, so no charge's key is much later than now). Only the
    // cost depends on it: a window bounds one side, and rows beyond its
    // start on the other side are read all the same.
    const int64_t latest_us = std::min(kMaxUs, absl::ToUnixMicros(clock_.Now() + absl::Minutes(2)));
    int64_t width_us = (2 + (filter.limit + running - 1) / running) * kMinuteUs;
    for (int round = 0;; ++round) {
      std::optional<int64_t> from = from_us, to = to_us;
      bool last = round >= 10;
      if (!filter.newest_first) {
        const int64_t base = std::max({from_us.value_or(earliest_us), earliest_us,
                                       has_cursor ? after[0] : earliest_us});
        const int64_t end = base + width_us;
        if (end >= to_us.value_or(kMaxUs) || end > latest_us) last = true;
        if (!last) to = end;
      } else {
        const int64_t base = std::min({to_us.value_or(latest_us), latest_us,
                                       has_cursor ? after[0] + 1 : latest_us});
        const int64_t start = base - width_us;
        if (start <= from_us.value_or(-kMaxUs) || start < earliest_us) last = true;
        if (!last) from = start;
      }
      out = ReadTransferPage(txn, tenant_id, filter, from, to, has_cursor, after);
      if (last || out.size() >= static_cast<size_t>(filter.limit)) {
        internal::FillReasons(txn, &out);
        return absl::OkStatus();
      }
      width_us *= 4;
    }
  }));
  return out;
}

absl::StatusOr<std::vector<UsageRow>> Billing::GetUsage(const std::string& tenant_id,
                                                        absl::Time from, absl::Time to,
                                                        const std::string& instance_id) {
  std::vector<UsageRow> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    txn.exec("SET LOCAL jit = off");  // See store::TenantChargesSql.
    // Days are Asia/Shanghai days: UTC+8, without daylight saving since 1991.
    // GPU-minutes are those charged: each minute at the GPU count of its
    // charge (a resized instance's minutes differ), not the instance's size
    // today.
    auto rows = txn.exec_params(
        absl::StrCat("SELECT i.id, to_char(to_timestamp(c.minute * 60 + 8 * 3600) "
                     "AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, i.gpu_model, "
                     "sum(c.gpu_count)::bigint, count(*), "
                     "sum(c.trial_micros + c.main_micros)::bigint FROM ",
                     store::TenantChargesSql("$1",
                                             "$2::bigint", "$3::bigint"),
                     " c JOIN instances i ON i.billing_no = c.instance_no "
                     "WHERE ($4 = '' OR i.id = $4) "
                     "GROUP BY 1, 2, 3 ORDER BY 2, 1 LIMIT 10000"),
        tenant_id, MinuteOf(from), MinuteOf(to), instance_id);
    for (const auto& r : rows) {
      out.push_back({r[0].as<std::string>(), r[1].as<std::string>(), r[2].as<std::string>(),
                     r[3].as<int64_t>(), r[4].as<int64_t>(), r[5].as<int64_t>()});
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<TenantBalance>> Billing::ListTenantBalances(
    const std::string& after_id, int limit, absl::Time now) {
  std::vector<TenantBalance> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params(
        absl::StrCat("SELECT t.id, t.name, EXISTS (SELECT 1 FROM tenant_suspensions s "
                     "WHERE s.tenant_id = t.id AND s.resumed_at IS NULL), ", kFundsColumns,
                     " FROM tenants t JOIN ledger_accounts a ON a.tenant_id = t.id "
                     "WHERE t.id > $1 GROUP BY t.id ORDER BY t.id LIMIT $3"),
        after_id, SqlTime(now), limit);
    for (const auto& r : rows) {
      out.push_back({r[0].as<std::string>(), r[1].as<std::string>(), ReadBalance(r, 3),
                     r[2].as<bool>()});
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<PriceRow>> Billing::ListPrices(absl::Time now) {
  std::vector<PriceRow> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    // App prices are the marketplace's (ListImages), not here.
    auto rows = txn.exec_params(
        "SELECT item_kind, item, unit_price_micros, "
        "(extract(epoch from effective_from) * 1000000)::bigint, "
        "(extract(epoch from until) * 1000000)::bigint FROM ("
        "  SELECT item_kind, item, unit_price_micros, effective_from, "
        "  lead(effective_from) OVER (PARTITION BY item_kind, item ORDER BY effective_from) "
        "    AS until "
        "  FROM price_book WHERE item_kind IN ('gpu_minute', 'storage_gib_hour')) p "
        "WHERE until IS NULL OR until > $1::timestamptz "
        "ORDER BY item_kind, item = '*', item, effective_from",
        SqlTime(now));
    for (const auto& r : rows) {
      PriceRow p{r[0].as<std::string>(), r[1].as<std::string>(), r[2].as<int64_t>(),
                 absl::FromUnixMicros(r[3].as<int64_t>()), std::nullopt};
      if (!r[4].is_null()) p.until = absl::FromUnixMicros(r[4].as<int64_t>());
      out.push_back(std::move(p));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<RevenueSummary> Billing::GetRevenueSummary(absl::Time from, absl::Time to) {
  RevenueSummary s;
  // Timestamps outside what PostgreSQL stores are clamped to sane bounds.
  from = std::max(from, absl::UnixEpoch());
  to = std::min(to, absl::FromUnixSeconds(253'402'300'799));  // 9999-12-31.
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(
        "SELECT "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'charge'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'charge' "
        "  AND fa.kind = 'trial_wallet'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'topup'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'trial_grant'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'trial_expiry'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'sla_refund'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'app_fee'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'app_fee' "
        "  AND ta.kind = 'publisher_payable'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'storage'), 0)::bigint, "
        "coalesce(sum(CASE WHEN t.kind <> 'adjustment' THEN 0 "
        "  WHEN ta.kind = 'platform_revenue' THEN t.amount_micros "
        "  WHEN fa.kind = 'platform_revenue' THEN -t.amount_micros ELSE 0 END), 0)::bigint, "
        "coalesce(sum(CASE WHEN ta.kind = 'platform_revenue' THEN t.amount_micros "
        "  WHEN fa.kind = 'platform_revenue' THEN -t.amount_micros ELSE 0 END), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'topup_refund'), 0)::bigint, "
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'credit'), 0)::bigint "
        "FROM ledger_all_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id "
        "JOIN ledger_accounts ta ON ta.id = t.to_account_id "
        "WHERE t.at >= $1::timestamptz AND t.at < $2::timestamptz",
        SqlTime(from), SqlTime(to));
    s.charged_micros = rows[0][0].as<int64_t>();
    s.trial_spent_micros = rows[0][1].as<int64_t>();
    s.topups_micros = rows[0][2].as<int64_t>();
    s.trial_granted_micros = rows[0][3].as<int64_t>();
    s.trial_expired_micros = rows[0][4].as<int64_t>();
    s.sla_refunds_micros = rows[0][5].as<int64_t>();
    s.app_fees_micros = rows[0][6].as<int64_t>();
    s.app_fees_to_publishers_micros = rows[0][7].as<int64_t>();
    s.storage_micros = rows[0][8].as<int64_t>();
    s.adjustments_net_micros = rows[0][9].as<int64_t>();
    s.platform_revenue_micros = rows[0][10].as<int64_t>();
    s.topup_refunds_micros = rows[0][11].as<int64_t>();
    s.credits_micros = rows[0][12].as<int64_t>();
    auto shortfall = txn.exec_params(
        "SELECT coalesce(sum(shortfall_micros), 0)::bigint FROM billing_shortfalls "
        "WHERE at >= $1::timestamptz AND at < $2::timestamptz",
        SqlTime(from), SqlTime(to));
    s.shortfall_micros = shortfall[0][0].as<int64_t>();
    auto addons = txn.exec_params(
        "SELECT (SELECT coalesce(sum(fee_micros - charged_micros), 0) FROM storage_shortfalls "
        "        WHERE at >= $1::timestamptz AND at < $2::timestamptz)::bigint, "
        "       (SELECT coalesce(sum(fee_micros - charged_micros), 0) FROM app_fee_shortfalls "
        "        WHERE at >= $1::timestamptz AND at < $2::timestamptz)::bigint",
        SqlTime(from), SqlTime(to));
    s.storage_shortfall_micros = addons[0][0].as<int64_t>();
    s.app_fee_shortfall_micros = addons[0][1].as<int64_t>();
    s.platform_revenue_balance_micros =
        txn.exec("SELECT balance_micros FROM ledger_accounts WHERE tenant_id IS NULL "
                 "AND kind = 'platform_revenue'")[0][0].as<int64_t>();
    return absl::OkStatus();
  }));
  return s;
}

}  // namespace sv::billing
