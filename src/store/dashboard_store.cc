#include "store/dashboard_store.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"

namespace sv::store {
namespace {

// Timestamps outside what PostgreSQL stores are clamped to sane bounds.
absl::Time Clamp(absl::Time t) {
  return std::clamp(t, absl::UnixEpoch(), absl::FromUnixSeconds(253'402'300'799));
}

// Per tenant: trial grants posted, expiries posted, and the wallet's balance.
// Transfers other than charges have a partial index on (kind, at) (0026).
constexpr char kTenantTrialsSql[] = R"sql(
WITH grants AS (
  SELECT tenant_id, count(*)::int AS n, sum(amount_micros)::bigint AS amount
  FROM ledger_transfers WHERE kind = 'trial_grant' AND kind <> 'charge' GROUP BY tenant_id
), expiries AS (
  SELECT tenant_id, sum(amount_micros)::bigint AS amount
  FROM ledger_transfers WHERE kind = 'trial_expiry' AND kind <> 'charge' GROUP BY tenant_id
), dates AS (
  SELECT tenant_id, min(granted_at) AS first_grant, max(expires_at) AS expire
  FROM trial_grants WHERE amount_micros > 0 GROUP BY tenant_id
)
SELECT t.id, t.name, g.n, g.amount, coalesce(e.amount, 0)::bigint, w.balance_micros,
       coalesce((extract(epoch FROM d.first_grant) * 1000000)::bigint, 0),
       coalesce((extract(epoch FROM d.expire) * 1000000)::bigint, 0)
FROM grants g JOIN tenants t ON t.id = g.tenant_id
LEFT JOIN expiries e ON e.tenant_id = g.tenant_id
LEFT JOIN dates d ON d.tenant_id = g.tenant_id
JOIN ledger_accounts w ON w.tenant_id = g.tenant_id AND w.kind = 'trial_wallet' AND w.owner = ''
)sql";

}  // namespace

absl::StatusOr<std::vector<RevenuePointRow>> DashboardStore::RevenueSeries(absl::Time from,
                                                                           absl::Time to,
                                                                           bool monthly) {
  std::vector<RevenuePointRow> out;
  from = Clamp(from);
  to = Clamp(to);
  // Charges (ledger_charges, migration 0030) are found by their minute of
  // use, the first column of their primary key (migration 0091); the rest
  // by posting time. `side` is the tenant's account an amount left (a
  // charge, fee or top-up) or reached (an SLA refund, whose trial part goes
  // back to the trial wallet, or to the promotion expense once the trial
  // has expired: not money either way). A charge's trial part is paid from
  // the trial wallet (the auditor checks).
  const std::string sql = absl::StrCat(R"sql(
WITH t AS (
  SELECT 'charge'::text AS kind, l.amount AS amount_micros, l.side,
         to_timestamp(c.minute * 60) AS ts
  FROM ledger_charges c
  CROSS JOIN LATERAL (VALUES ('trial_wallet', c.trial_micros), ('main', c.main_micros))
    AS l (side, amount)
  WHERE c.minute >= $3 AND c.minute < $4 AND l.amount > 0
  UNION ALL
  -- Late-event adjustments (docs/billing.md, "Late events") correct the
  -- charges of their minute: a late charge adds, a refund subtracts, and a
  -- refund of trial credit gone to the promotion expense is trial money.
  SELECT 'charge', CASE WHEN ta.kind = 'platform_revenue' THEN t.amount_micros
                        ELSE -t.amount_micros END,
         CASE WHEN ta.kind = 'platform_revenue' THEN fa.kind
              WHEN ta.kind = 'promotion_expense' THEN 'trial_wallet' ELSE ta.kind END,
         to_timestamp(t.usage_minute * 60)
  FROM ledger_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id
  JOIN ledger_accounts ta ON ta.id = t.to_account_id
  WHERE t.kind = 'adjustment' AND t.usage_minute >= $3 AND t.usage_minute < $4
  UNION ALL
  SELECT t.kind, t.amount_micros,
         CASE WHEN t.kind = 'sla_refund' THEN ta.kind ELSE fa.kind END AS side, t.at AS ts
  FROM ledger_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id
  JOIN ledger_accounts ta ON ta.id = t.to_account_id
  WHERE t.kind IN ('sla_refund', 'topup', 'topup_refund', 'credit')
    AND t.at >= $1::timestamptz AND t.at < $2::timestamptz
  UNION ALL
  -- App fees (the platform's part) and storage, by posting time.
  SELECT t.kind, t.amount_micros, fa.kind AS side, t.at AS ts
  FROM ledger_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id
  JOIN ledger_accounts ta ON ta.id = t.to_account_id AND ta.kind = 'platform_revenue'
  WHERE t.kind IN ('app_fee', 'storage') AND t.at >= $1::timestamptz AND t.at < $2::timestamptz
  UNION ALL
  SELECT 'shortfall', s.shortfall_micros, '', to_timestamp(s.usage_minute * 60)
  FROM billing_shortfalls s WHERE s.usage_minute >= $3 AND s.usage_minute < $4
  UNION ALL
  SELECT 'storage_shortfall', s.fee_micros - s.charged_micros, '',
         to_timestamp(s.usage_minute * 60)
  FROM storage_shortfalls s WHERE s.usage_minute >= $3 AND s.usage_minute < $4
  UNION ALL
  SELECT 'app_fee_shortfall', s.fee_micros - s.charged_micros, '',
         to_timestamp(s.usage_minute * 60)
  FROM app_fee_shortfalls s WHERE s.usage_minute >= $3 AND s.usage_minute < $4
), p AS (
  SELECT date_trunc(')sql", monthly ? "month" : "day", R"sql(', ts AT TIME ZONE 'Asia/Shanghai') AS period, *
  FROM t
)
SELECT to_char(period, ')sql", monthly ? "YYYY-MM" : "YYYY-MM-DD", R"sql('),
       (extract(epoch FROM period AT TIME ZONE 'Asia/Shanghai') * 1000000)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'charge'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'charge' AND side = 'trial_wallet'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'sla_refund'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'sla_refund'
                AND side IN ('trial_wallet', 'promotion_expense')), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'topup'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'app_fee'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'app_fee' AND side = 'trial_wallet'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'storage'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'storage' AND side = 'trial_wallet'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'shortfall'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'storage_shortfall'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'app_fee_shortfall'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'topup_refund'), 0)::bigint,
       coalesce(sum(amount_micros) FILTER (WHERE kind = 'credit'), 0)::bigint
FROM p GROUP BY period ORDER BY period
)sql");
  const int64_t from_minute = absl::ToUnixSeconds(from) / 60;
  const int64_t to_minute = (absl::ToUnixSeconds(to) + 59) / 60;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params(sql, SqlTime(from), SqlTime(to), from_minute, to_minute);
    for (const auto& row : rows) {
      RevenuePointRow r;
      r.period = row[0].as<std::string>();
      r.period_start = TimeFromMicros(row[1].as<int64_t>());
      r.charged_micros = row[2].as<int64_t>();
      r.trial_charged_micros = row[3].as<int64_t>();
      r.sla_refunds_micros = row[4].as<int64_t>();
      r.sla_refunds_trial_micros = row[5].as<int64_t>();
      r.topups_micros = row[6].as<int64_t>();
      r.app_fees_micros = row[7].as<int64_t>();
      r.app_fees_trial_micros = row[8].as<int64_t>();
      r.storage_micros = row[9].as<int64_t>();
      r.storage_trial_micros = row[10].as<int64_t>();
      r.shortfall_micros = row[11].as<int64_t>();
      r.storage_shortfall_micros = row[12].as<int64_t>();
      r.app_fee_shortfall_micros = row[13].as<int64_t>();
      r.topup_refunds_micros = row[14].as<int64_t>();
      r.credits_micros = row[15].as<int64_t>();
      out.push_back(std::move(r));
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<SlaRefundMetricRow>> DashboardStore::SlaRefundsByMetric(
    absl::Time from, absl::Time to) {
  std::vector<SlaRefundMetricRow> out;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    // Keys are sla:{instance}:{hour}:{metric} (docs/billing.md); a refund
    // with a paid and a trial part is two legs of one key.
    auto rows = txn.exec_params(
        "SELECT split_part(idempotency_key, ':', 4) AS metric, "
        "count(*) FILTER (WHERE leg = 0)::bigint, "
        "sum(amount_micros)::bigint FROM ledger_transfers "
        "WHERE kind = 'sla_refund' AND at >= $1::timestamptz AND at < $2::timestamptz "
        "GROUP BY metric ORDER BY metric",
        SqlTime(Clamp(from)), SqlTime(Clamp(to)));
    for (const auto& row : rows) {
      out.push_back({row[0].as<std::string>(), row[1].as<int64_t>(), row[2].as<int64_t>()});
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<DashboardNodeRow>> DashboardStore::FleetNodes(int nodes_max) {
  std::vector<DashboardNodeRow> out;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params(R"sql(
WITH alloc AS (
  SELECT node_id, count(*)::int AS gpus, count(DISTINCT instance_id)::int AS instances
  FROM gpu_reservations GROUP BY node_id
)
SELECT n.name, n.pod, n.leaf_switch, n.state, n.gpu_count, coalesce(a.gpus, 0),
       coalesce(a.instances, 0)
FROM nodes n LEFT JOIN alloc a ON a.node_id = n.id
ORDER BY n.pod, n.leaf_switch, n.name LIMIT $1
)sql",
                                nodes_max);
    for (const auto& row : rows) {
      DashboardNodeRow r;
      r.name = row[0].as<std::string>();
      r.pod = row[1].as<std::string>();
      r.leaf_switch = row[2].as<std::string>();
      r.state = row[3].as<std::string>();
      r.gpu_count = row[4].as<int>();
      r.allocated_gpu_count = row[5].as<int>();
      r.instance_count = row[6].as<int>();
      out.push_back(std::move(r));
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

namespace {
TenantTrialRow TrialRowOf(const pqxx::row& row) {
  TenantTrialRow r;
  r.tenant_id = row[0].as<std::string>();
  r.tenant_name = row[1].as<std::string>();
  r.grant_count = row[2].as<int>();
  r.granted_micros = row[3].as<int64_t>();
  r.expired_micros = row[4].as<int64_t>();
  r.remaining_micros = row[5].as<int64_t>();
  r.burned_micros = r.granted_micros - r.expired_micros - r.remaining_micros;
  r.first_grant = TimeFromMicros(row[6].as<int64_t>());
  r.expire = TimeFromMicros(row[7].as<int64_t>());
  return r;
}
}  // namespace

absl::StatusOr<std::vector<TenantTrialRow>> DashboardStore::TenantTrials(
    const std::string& after_tenant_id, int limit) {
  std::vector<TenantTrialRow> out;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params(
        absl::StrCat(kTenantTrialsSql, " WHERE t.id > $1 ORDER BY t.id LIMIT $2"),
        after_tenant_id, limit);
    for (const auto& row : rows) out.push_back(TrialRowOf(row));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<TenantTrialRow> DashboardStore::TrialTotals() {
  TenantTrialRow totals;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    totals = TenantTrialRow{};
    auto rows = txn.exec(kTenantTrialsSql);
    for (const auto& row : rows) {
      TenantTrialRow r = TrialRowOf(row);
      totals.grant_count += r.grant_count;
      totals.granted_micros += r.granted_micros;
      totals.burned_micros += r.burned_micros;
      totals.expired_micros += r.expired_micros;
      totals.remaining_micros += r.remaining_micros;
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return totals;
}

absl::StatusOr<std::vector<TopUpRow>> DashboardStore::TopUps(absl::Time from, absl::Time to,
                                                             int64_t before_id, int limit) {
  std::vector<TopUpRow> out;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params(
        "SELECT l.id, coalesce(l.tenant_id, ''), coalesce(t.name, ''), "
        "substr(l.idempotency_key, 7), l.amount_micros, " + MicrosOf("l.at") +
        ", coalesce(r.amount_micros, 0) "
        "FROM ledger_transfers l LEFT JOIN tenants t ON t.id = l.tenant_id "
        "LEFT JOIN ledger_transfers r ON r.idempotency_key = "
        "'topup-refund:' || substr(l.idempotency_key, 7) AND r.leg = 0 "
        "WHERE l.kind = 'topup' AND l.at >= $1::timestamptz AND l.at < $2::timestamptz "
        "AND ($3 = 0 OR l.id < $3) ORDER BY l.id DESC LIMIT $4",
        SqlTime(Clamp(from)), SqlTime(Clamp(to)), before_id, limit);
    for (const auto& row : rows) {
      out.push_back({row[0].as<int64_t>(), row[1].as<std::string>(), row[2].as<std::string>(),
                     row[3].as<std::string>(), row[4].as<int64_t>(),
                     TimeFromMicros(row[5].as<int64_t>()), row[6].as<int64_t>()});
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<TopUpTotals> DashboardStore::TopUpTotalsIn(absl::Time from, absl::Time to) {
  TopUpTotals totals;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(
        "SELECT count(*)::bigint, coalesce(sum(l.amount_micros), 0)::bigint, "
        "coalesce(sum(r.amount_micros), 0)::bigint FROM ledger_transfers l "
        "LEFT JOIN ledger_transfers r ON r.idempotency_key = "
        "'topup-refund:' || substr(l.idempotency_key, 7) AND r.leg = 0 "
        "WHERE l.kind = 'topup' AND l.at >= $1::timestamptz AND l.at < $2::timestamptz",
        SqlTime(Clamp(from)), SqlTime(Clamp(to)));
    totals.count = rows[0][0].as<int64_t>();
    totals.amount_micros = rows[0][1].as<int64_t>();
    totals.refunded_micros = rows[0][2].as<int64_t>();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return totals;
}

}  // namespace sv::store
