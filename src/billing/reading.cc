// Read paths: balances, transfers, usage, tenants' balances, revenue.
#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "billing/billing.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"

namespace sv::billing {
namespace {

using store::SqlTime;

constexpr int kNoticesMax = 20;

// Balances of one tenant from the columns of kFundsColumns.
constexpr char kFundsColumns[] =
    "t.billing_mode, "
    "max(a.balance_micros) FILTER (WHERE a.kind = 'paid_wallet'), "
    "max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), "
    "max(a.balance_micros) FILTER (WHERE a.kind = 'receivable'), "
    "max(a.credit_limit_micros) FILTER (WHERE a.kind = 'receivable'), "
    "(SELECT max((extract(epoch from g.expires_at) * 1000000)::bigint) FROM trial_grants g "
    " WHERE g.tenant_id = t.id AND NOT g.expired), "
    "coalesce((SELECT sum(i.gpu_count * coalesce((SELECT p.unit_price_micros FROM price_book p "
    "  WHERE p.item_kind = 'gpu_minute' AND p.item IN (i.gpu_model, '*') "
    "  AND p.effective_from <= $2::timestamptz ORDER BY (p.item = '*'), p.effective_from DESC "
    "  LIMIT 1), 0)) FROM instances i WHERE i.tenant_id = t.id AND i.state = 'RUNNING'), 0)"
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
    auto notices = txn.exec_params(
        "SELECT kind, coalesce(instance_id, ''), message, "
        "(extract(epoch from at) * 1000000)::bigint FROM billing_notices "
        "WHERE tenant_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
        tenant_id, kNoticesMax);
    for (const auto& n : notices) {
      balance.notices.push_back({n[0].as<std::string>(), n[1].as<std::string>(),
                                 n[2].as<std::string>(),
                                 absl::FromUnixMicros(n[3].as<int64_t>())});
    }
    return absl::OkStatus();
  }));
  if (!found) return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
  return balance;
}

absl::StatusOr<std::vector<TransferRecord>> Billing::ListTransfers(
    const std::string& tenant_id, const TransferFilter& filter) {
  // The cursor is "at_us.src.no.minute.leg" (TransferRecord::cursor).
  int64_t after[5] = {0, 0, 0, 0, 0};
  if (!filter.after.empty()) {
    std::vector<std::string> parts = absl::StrSplit(filter.after, '.');
    bool ok = parts.size() == 5;
    for (size_t i = 0; ok && i < parts.size(); ++i) ok = absl::SimpleAtoi(parts[i], &after[i]);
    if (!ok) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                   "page_token is not one this server returned");
    }
  }
  std::vector<TransferRecord> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    // Transfers and minute charges (ledger_all_transfers, migration 0030) in
    // one keyset order; $8 = 0 marks the first page.
    auto rows = txn.exec_params(
        absl::StrCat("SELECT ", internal::kTransferColumns, " FROM ledger_all_transfers t",
                     internal::kTransferJoins,
                     "WHERE t.tenant_id = $1 "
                     "AND ($3 = '' OR t.kind = $3) AND ($4 = '' OR t.instance_id = $4) "
                     "AND ($5::timestamptz IS NULL OR t.at >= $5::timestamptz) "
                     "AND ($6::timestamptz IS NULL OR t.at < $6::timestamptz) "
                     "AND ($8::int = 0 OR (t.at, t.src, t.src_no, t.src_minute, t.leg) ",
                     filter.newest_first ? "<" : ">",
                     "  ('epoch'::timestamptz + $2::bigint * interval '1 microsecond', "
                     "   $9::smallint, $10::bigint, $11::bigint, $12::smallint)) ",
                     filter.newest_first
                         ? "ORDER BY t.at DESC, t.src DESC, t.src_no DESC, t.src_minute DESC, "
                           "t.leg DESC LIMIT $7"
                         : "ORDER BY t.at, t.src, t.src_no, t.src_minute, t.leg LIMIT $7"),
        tenant_id, after[0], filter.kind, filter.instance_id,
        filter.from ? std::optional<std::string>(SqlTime(*filter.from)) : std::nullopt,
        filter.to ? std::optional<std::string>(SqlTime(*filter.to)) : std::nullopt,
        filter.limit, filter.after.empty() ? 0 : 1, after[1], after[2], after[3], after[4]);
    for (const auto& row : rows) out.push_back(internal::ReadTransfer(row, tenant_id));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::vector<UsageRow>> Billing::GetUsage(const std::string& tenant_id,
                                                        absl::Time from, absl::Time to,
                                                        const std::string& instance_id) {
  std::vector<UsageRow> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    // Days are Asia/Shanghai days: UTC+8, without daylight saving since 1991.
    auto rows = txn.exec_params(
        "SELECT t.instance_id, to_char(to_timestamp(t.usage_minute * 60 + 8 * 3600) "
        "AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, t.gpu_model, "
        "count(DISTINCT t.usage_minute) * max(i.gpu_count), count(DISTINCT t.usage_minute), "
        "sum(t.amount_micros)::bigint "
        "FROM ledger_charge_legs t JOIN instances i ON i.id = t.instance_id "
        "AND i.tenant_id = t.tenant_id "
        "WHERE t.tenant_id = $1 AND t.kind = 'charge' AND t.usage_minute >= $2 "
        "AND t.usage_minute < $3 AND ($4 = '' OR t.instance_id = $4) "
        "GROUP BY 1, 2, 3 ORDER BY 2, 1 LIMIT 10000",
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
        absl::StrCat("SELECT t.id, t.name, ", kFundsColumns,
                     " FROM tenants t JOIN ledger_accounts a ON a.tenant_id = t.id "
                     "WHERE t.id > $1 GROUP BY t.id ORDER BY t.id LIMIT $3"),
        after_id, SqlTime(now), limit);
    for (const auto& r : rows) {
      out.push_back({r[0].as<std::string>(), r[1].as<std::string>(), ReadBalance(r, 2)});
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
        "coalesce(sum(t.amount_micros) FILTER (WHERE t.kind = 'sla_refund'), 0)::bigint "
        "FROM ledger_all_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id "
        "WHERE t.at >= $1::timestamptz AND t.at < $2::timestamptz",
        SqlTime(from), SqlTime(to));
    s.charged_micros = rows[0][0].as<int64_t>();
    s.trial_spent_micros = rows[0][1].as<int64_t>();
    s.topups_micros = rows[0][2].as<int64_t>();
    s.trial_granted_micros = rows[0][3].as<int64_t>();
    s.trial_expired_micros = rows[0][4].as<int64_t>();
    s.sla_refunds_micros = rows[0][5].as<int64_t>();
    auto shortfall = txn.exec_params(
        "SELECT coalesce(sum(shortfall_micros), 0)::bigint FROM billing_shortfalls "
        "WHERE at >= $1::timestamptz AND at < $2::timestamptz",
        SqlTime(from), SqlTime(to));
    s.shortfall_micros = shortfall[0][0].as<int64_t>();
    s.platform_revenue_balance_micros =
        txn.exec("SELECT balance_micros FROM ledger_accounts WHERE tenant_id IS NULL "
                 "AND kind = 'platform_revenue'")[0][0].as<int64_t>();
    return absl::OkStatus();
  }));
  return s;
}

}  // namespace sv::billing
