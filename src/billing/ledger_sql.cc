#include "billing/internal/ledger_sql.h"

#include <cassert>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace sv::billing::internal {

using store::SqlTime;

const char kTransferColumns[] =
    "coalesce(t.id, 0), t.idempotency_key, t.leg, t.kind, fa.kind, ta.kind, t.amount_micros, "
    "fa.tenant_id IS NOT NULL, ta.tenant_id IS NOT NULL, coalesce(t.instance_id, ''), "
    "t.usage_minute, (extract(epoch from t.at) * 1000000)::bigint, t.src, t.src_no, "
    "t.src_minute";
const char kTransferJoins[] =
    " JOIN ledger_accounts fa ON fa.id = t.from_account_id "
    "JOIN ledger_accounts ta ON ta.id = t.to_account_id ";

namespace {

// The GPU count an instance had at the start of a RUNNING interval (ev.at):
// the size set by the last resize at or before it, else the size before the
// first resize after it, else the instance's size. A minute is charged at
// the largest size the instance held in it (every GPU-minute started is
// charged), because DISTINCT ON in the minutes below keeps the interval
// with the most GPUs of each minute.
#define SV_GPU_COUNT_AT_EVENT                                                      \
  "coalesce((SELECT r.to_gpu_count FROM instance_resizes r WHERE r.instance_id = " \
  "i.id AND r.at <= ev.at ORDER BY r.at DESC, r.id DESC LIMIT 1), "                \
  "(SELECT r.from_gpu_count FROM instance_resizes r WHERE r.instance_id = i.id "   \
  "AND r.at > ev.at ORDER BY r.at, r.id LIMIT 1), i.gpu_count)"

// The RUNNING intervals of the instances that `FROM_CANDIDATES` joins to the
// events `e`: from a row with to_state RUNNING to the next row of that
// instance (which has from_state RUNNING), or open; those that overlap
// [$1, $2). The text after a `WITH ` or after the caller's own CTEs.
#define SV_RUNNING_INTERVALS(FROM_CANDIDATES)                                            \
  "ev AS (SELECT e.instance_id, e.at, e.to_state, lead(e.at) OVER w AS next_at "       \
  "FROM instance_events e " FROM_CANDIDATES " "                                        \
  "WHERE e.to_state = 'RUNNING' OR e.from_state = 'RUNNING' "                          \
  "WINDOW w AS (PARTITION BY e.instance_id ORDER BY e.at, e.id)) "                     \
  "SELECT ev.instance_id, i.billing_no, i.tenant_id, " SV_GPU_COUNT_AT_EVENT            \
  " AS gpu_count, i.gpu_model, (extract(epoch from ev.at) * 1000000)::bigint AS start_us, " \
  "(extract(epoch from ev.next_at) * 1000000)::bigint AS end_us "                      \
  "FROM ev JOIN instances i ON i.id = ev.instance_id "                                 \
  "WHERE ev.to_state = 'RUNNING' AND ev.at < $2::timestamptz "                         \
  "AND (ev.next_at IS NULL OR ev.next_at > $1::timestamptz)"

// Every RUNNING interval from the events: the instances RUNNING now and
// those that left RUNNING after $1.
constexpr char kIntervalsFromEventsSql[] =
    "WITH cand AS (SELECT id FROM instances WHERE state = 'RUNNING' UNION "
    "SELECT instance_id FROM instance_events WHERE from_state = 'RUNNING' "
    "AND at > $1::timestamptz), " SV_RUNNING_INTERVALS("JOIN cand c ON c.id = e.instance_id");

// The events-only intervals of the instances in the caller's CTE `recent`
// (id): metering's instances that left RUNNING after $1 or are RUNNING
// without running_since. Every other RUNNING instance has exactly one
// interval that matters, the open one from running_since (written with its
// RUNNING event), which metering reads from `instances` directly
// (billing/metering.cc). The auditor uses the events-only form, so it also
// checks that running_since agrees with the events.
constexpr char kIntervalsOfRecentSql[] =
    "WITH " SV_RUNNING_INTERVALS("JOIN recent c ON c.id = e.instance_id");

// The events-only intervals of the instances in the temporary table
// billing_recheck (late events, billing/adjustments.cc).
constexpr char kIntervalsOfRecheckSql[] =
    "WITH " SV_RUNNING_INTERVALS("JOIN billing_recheck c ON c.instance_id = e.instance_id");

#undef SV_RUNNING_INTERVALS
#undef SV_GPU_COUNT_AT_EVENT

}  // namespace

std::string MinutePriceCtes() {
  return R"sql(
ms AS MATERIALIZED (
  SELECT m AS minute FROM generate_series($3::bigint, $4::bigint - 1) AS m
), prices AS (
  SELECT item, unit_price_micros AS price,
         (extract(epoch from effective_from) * 1000000)::bigint AS from_us,
         (extract(epoch from lead(effective_from) OVER (PARTITION BY item
                                                        ORDER BY effective_from))
          * 1000000)::bigint AS until_us
  FROM price_book WHERE item_kind = 'gpu_minute'
))sql";
}

std::string PricedMinutesCtes(IntervalSource source) {
  const char* intervals = source == IntervalSource::kEventsOnly         ? kIntervalsFromEventsSql
                          : source == IntervalSource::kEventsOfRecheck ? kIntervalsOfRecheckSql
                                                                       : kIntervalsOfRecentSql;
  return absl::StrCat("iv AS (", intervals, "), ", MinutePriceCtes(), R"sql(,
mins AS MATERIALIZED (
  -- Each minute of an instance once, at the largest GPU count it held.
  -- Materialized: as a subquery the planner may join it with the prices
  -- in ways that made the auditor's check of every minute time out.
  SELECT DISTINCT ON (iv.instance_id, m)
         iv.instance_id, iv.billing_no, iv.tenant_id, iv.gpu_count, iv.gpu_model, m AS minute,
         iv.start_us
  FROM iv, generate_series(greatest($3::bigint, iv.start_us / 60000000),
                           least($4::bigint - 1,
                                 coalesce((iv.end_us - 1) / 60000000, $4::bigint - 1))) AS m
  WHERE iv.end_us IS NULL OR iv.end_us > iv.start_us
  ORDER BY iv.instance_id, m, iv.gpu_count DESC, iv.start_us
), mprice AS MATERIALIZED (
  -- The price of each GPU model in each minute, looked up once per model
  -- and minute rather than once per instance-minute.
  SELECT g.gpu_model, ms.minute, coalesce(p.price, d.price, 0) AS unit_price
  FROM (SELECT DISTINCT gpu_model FROM iv) g CROSS JOIN ms
  LEFT JOIN prices p ON p.item = g.gpu_model AND ms.minute * 60000000 >= p.from_us
       AND (p.until_us IS NULL OR ms.minute * 60000000 < p.until_us)
  LEFT JOIN prices d ON d.item = '*' AND ms.minute * 60000000 >= d.from_us
       AND (d.until_us IS NULL OR ms.minute * 60000000 < d.until_us)
), priced AS (
  SELECT m.*, mp.unit_price, m.gpu_count * mp.unit_price AS gross
  FROM mins m JOIN mprice mp ON mp.gpu_model = m.gpu_model AND mp.minute = m.minute
))sql");
}

int64_t PlatformAccount(pqxx::work& txn, const std::string& kind) {
  auto rows = txn.exec_params(
      "SELECT id FROM ledger_accounts WHERE tenant_id IS NULL AND kind = $1 AND owner = ''",
      kind);
  assert(rows.size() == 1);  // Created by migration 0002.
  return rows[0][0].as<int64_t>();
}

int64_t TenantAccount(pqxx::work& txn, const std::string& tenant_id, const std::string& kind) {
  auto rows = txn.exec_params(
      "SELECT id FROM ledger_accounts WHERE tenant_id = $1 AND kind = $2 AND owner = ''",
      tenant_id, kind);
  assert(rows.size() == 1);  // Opened by the tenants trigger of migration 0002.
  return rows[0][0].as<int64_t>();
}

int64_t PriceAt(pqxx::work& txn, const std::string& item_kind, const std::string& item,
                absl::Time at) {
  auto rows = txn.exec_params(
      "SELECT unit_price_micros FROM price_book WHERE item_kind = $1 "
      "AND item IN ($2, '*') AND effective_from <= $3::timestamptz "
      "ORDER BY (item = '*'), effective_from DESC LIMIT 1",
      item_kind, item, SqlTime(at));
  return rows.empty() ? 0 : rows[0][0].as<int64_t>();
}

int64_t GpuPriceAt(pqxx::work& txn, const std::string& gpu_model, absl::Time at) {
  return PriceAt(txn, "gpu_minute", gpu_model, at);
}

absl::Status PostSingle(pqxx::work& txn, const Posting& p) {
  assert(p.amount_micros > 0 && p.from_account_id != p.to_account_id);
  const std::string content =
      absl::StrCat(p.kind, "|", p.tenant_id, "|", p.from_account_id, "|", p.to_account_id, "|",
                   p.amount_micros);
  auto inserted = txn.exec_params(
      "INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id, "
      "to_account_id, amount_micros, kind, tenant_id, at) "
      "VALUES ($1, 0, md5($2), $3, $4, $5, $6, $7, $8::timestamptz) "
      "ON CONFLICT (idempotency_key, leg) DO NOTHING RETURNING id",
      p.key, content, p.from_account_id, p.to_account_id, p.amount_micros, p.kind, p.tenant_id,
      SqlTime(p.at));
  if (!inserted.empty()) return absl::OkStatus();
  auto same = txn.exec_params(
      "SELECT content_hash = md5($2) FROM ledger_transfers WHERE idempotency_key = $1 "
      "AND leg = 0",
      p.key, content);
  if (!same.empty() && same[0][0].as<bool>()) return absl::OkStatus();  // A replay.
  return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED",
               absl::StrCat("'", p.key, "' was already used for a different transfer"));
}

TransferRecord ReadTransfer(const pqxx::row& row, const std::string& tenant_id) {
  TransferRecord t;
  t.id = row[0].as<int64_t>();
  t.idempotency_key = row[1].as<std::string>();
  t.leg = row[2].as<int>();
  t.kind = row[3].as<std::string>();
  t.from_kind = row[4].as<std::string>();
  t.to_kind = row[5].as<std::string>();
  t.amount_micros = row[6].as<int64_t>();
  const bool from_tenant = row[7].as<bool>();
  const bool to_tenant = row[8].as<bool>();
  if (from_tenant && !to_tenant) t.tenant_delta_micros = -t.amount_micros;
  if (to_tenant && !from_tenant) t.tenant_delta_micros = t.amount_micros;
  t.instance_id = row[9].as<std::string>();
  if (!row[10].is_null()) t.usage_minute = row[10].as<int64_t>();
  t.at = absl::FromUnixMicros(row[11].as<int64_t>());
  // The keyset cursor of ListTransfers: (at, source, id or instance number,
  // minute, leg), see ledger_all_transfers (migration 0030).
  t.cursor = absl::StrCat(row[11].as<int64_t>(), ".", row[12].as<int>(), ".",
                          row[13].as<int64_t>(), ".", row[14].as<int64_t>(), ".", t.leg);
  return t;
}

void FillReasons(pqxx::work& txn, std::vector<TransferRecord>* transfers) {
  std::vector<std::string> keys;
  for (const auto& t : *transfers) {
    if (t.kind == "credit" || t.kind == "topup_refund") {
      keys.push_back(txn.quote(t.idempotency_key));
    }
  }
  if (keys.empty()) return;
  auto rows = txn.exec(absl::StrCat(
      "SELECT idempotency_key, reason FROM ledger_transfer_reasons WHERE idempotency_key IN (",
      absl::StrJoin(keys, ", "), ")"));
  std::map<std::string, std::string> reasons;
  for (const auto& r : rows) reasons[r[0].as<std::string>()] = r[1].as<std::string>();
  for (auto& t : *transfers) {
    auto it = reasons.find(t.idempotency_key);
    if (it != reasons.end()) t.reason = it->second;
  }
}

absl::StatusOr<TransferRecord> FindTransfer(store::Database& db, const std::string& tenant_id,
                                            const std::string& key) {
  std::optional<TransferRecord> found;
  SV_RETURN_IF_ERROR(db.Transact([&](pqxx::work& txn) {
    // Postings of ledger_transfers only (top-ups): without the kind filter
    // the view would compute the key of every minute charge.
    auto rows = txn.exec_params(
        absl::StrCat("SELECT ", kTransferColumns, " FROM ledger_all_transfers t", kTransferJoins,
                     "WHERE t.tenant_id = $1 AND t.idempotency_key = $2 AND t.kind <> 'charge' "
                     "ORDER BY t.leg LIMIT 1"),
        tenant_id, key);
    if (rows.empty()) return absl::OkStatus();
    std::vector<TransferRecord> one = {ReadTransfer(rows[0], tenant_id)};
    FillReasons(txn, &one);
    found = std::move(one[0]);
    return absl::OkStatus();
  }));
  if (!found) {
    return Error(absl::StatusCode::kNotFound, "TRANSFER_NOT_FOUND", "no such transfer");
  }
  return *found;
}

std::string InstanceStoppableSql(const std::string& id_column) {
  return absl::StrCat("EXISTS (SELECT 1 FROM instances i WHERE i.id = ", id_column,
                      " AND i.state NOT IN ('STOPPED', 'DELETED', 'FAILED'))");
}

std::string YuanSql(const std::string& micros_expr) {
  const std::string v = absl::StrCat("((", micros_expr, ")::numeric / 1000000)");
  return absl::StrCat("((CASE WHEN scale(trim_scale(", v, ")) < 2 THEN round(", v,
                      ", 2) ELSE trim_scale(", v, ") END)::text || ' CNY')");
}

}  // namespace sv::billing::internal
