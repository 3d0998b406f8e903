// Per-minute metering: one charge per instance per started minute of its
// RUNNING intervals, written set-wise in batches under an advisory lock.
#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "billing/billing.h"
#include "billing/internal/addons.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::billing {
namespace {

using store::SqlTime;

// The CTEs of a batch, ending in `batch`: every instance-minute of [$3, $4)
// with its price, the amount the tenant's funds can still pay (trial
// first), and first_cap, the instance's first minute that could not be paid
// in full. $1/$2 are the same range as timestamps.
//
// Most of a batch takes the short way, `s`: an instance that is RUNNING
// and has not left RUNNING since $1 (no event from RUNNING after it) has
// one interval that matters, the open one from running_since, so its
// minutes are those of [$3, $4) from the minute of running_since on, at its
// GPU count, priced per GPU model and minute. Only the instances in
// `recent` (they left RUNNING or were resized after $1, or are RUNNING
// without running_since) need their intervals from the events
// (PricedMinutesCtes: the union of their intervals, each minute once at the
// largest GPU count held).
//
// A tenant whose funds cover all its minutes of the batch (from the trial
// wallet alone, or with an empty trial wallet from the paid wallet or
// receivable alone) is "easy": every minute is charged in full from one
// account, so no running sum is needed. A tenant with no instance in
// `recent` that is easy by `sf` is charged straight from `s`. Every other
// tenant's minutes (`slow`: its rows of `s` and those from the events) go
// through the full computation below, as all of them once did: `fundsx`
// decides again whether it is easy, and the window spends trial credit
// first, minute by minute in (minute, instance id) order, and caps what is
// left. Each tenant's minutes take exactly one of the two ways, decided on
// all of its minutes, so the charges are those of the full computation.
//
// The common case, every tenant easy and no instance in `recent`, is
// written by ShortBatchSql: only `recent`, `hard`, the prices and the short
// way, planned in about a third of the time of the whole statement. The
// tenants it leaves (not easy, or with an instance in `recent`) are then
// written by the whole statement with `listed_only`: `s` keeps only the
// instances of the tenants in $7 (text[]), the tenants of `sf` that were
// not easy; `recent` and the events are as before, and their tenants were
// never easy. A tenant's funds are read before any of its minutes is
// written, and each tenant is written by one of the two statements, so
// the charges are the same as those of the whole statement alone.
constexpr char kRecentCtes[] = R"sql(
recent AS (
  SELECT instance_id AS id FROM instance_events
  WHERE from_state = 'RUNNING' AND at > $1::timestamptz
  UNION
  SELECT id FROM instances WHERE state = 'RUNNING' AND running_since IS NULL
), hard AS MATERIALIZED (
  SELECT DISTINCT i.tenant_id FROM recent r JOIN instances i ON i.id = r.id
))sql";

// The short way (fms, fmp, s, sf), after `recent`, `hard`, `ms` and
// `prices`.
std::string ShortWayCtes(bool listed_only) {
  return absl::StrCat(R"sql(
fms AS MATERIALIZED (
  -- Each minute with the start of the next and the default GPU price.
  SELECT ms.minute, to_timestamp((ms.minute + 1) * 60) AS next_start,
         (SELECT d.price FROM prices d WHERE d.item = '*' AND ms.minute * 60000000 >= d.from_us
            AND (d.until_us IS NULL OR ms.minute * 60000000 < d.until_us)) AS default_price
  FROM ms
), fmp AS MATERIALIZED (
  -- The GPU models with a price of their own, per minute.
  SELECT p.item, ms.minute, p.price FROM prices p JOIN ms ON ms.minute * 60000000 >= p.from_us
    AND (p.until_us IS NULL OR ms.minute * 60000000 < p.until_us)
  WHERE p.item <> '*'
), s AS MATERIALIZED (
  SELECT i.id AS instance_id, i.billing_no, i.tenant_id, i.gpu_count, m.minute,
         coalesce(g.price, m.default_price, 0) AS unit_price, i.running_since
  FROM instances i JOIN fms m ON i.running_since < m.next_start
  LEFT JOIN fmp g ON g.item = i.gpu_model AND g.minute = m.minute
  WHERE i.state = 'RUNNING' AND i.running_since IS NOT NULL
    AND i.running_since < $2::timestamptz
    AND NOT EXISTS (SELECT 1 FROM recent r WHERE r.id = i.id)
    AND coalesce(g.price, m.default_price, 0) > 0)sql",
                      listed_only ? "\n    AND i.tenant_id = ANY($7::text[])" : "", R"sql(
), sf AS MATERIALIZED (
  SELECT t.id AS tenant_id, t.billing_no AS tenant_no, tw.id AS trial_id,
         CASE WHEN t.billing_mode = 'postpaid' THEN r.id ELSE pw.id END AS main_id,
         tw.balance_micros >= st.total AS all_trial,
         NOT EXISTS (SELECT 1 FROM hard h WHERE h.tenant_id = t.id)
           AND (tw.balance_micros >= st.total
                OR (tw.balance_micros = 0
                    AND CASE WHEN t.billing_mode = 'postpaid'
                             THEN r.balance_micros + r.credit_limit_micros
                             ELSE pw.balance_micros END >= st.total)) AS easy,
         st.n, st.total
  FROM (SELECT tenant_id, sum(gpu_count * unit_price)::bigint AS total, count(*) AS n
        FROM s GROUP BY tenant_id) st
  JOIN tenants t ON t.id = st.tenant_id
  JOIN ledger_accounts tw ON tw.tenant_id = t.id AND tw.kind = 'trial_wallet' AND tw.owner = ''
  JOIN ledger_accounts pw ON pw.tenant_id = t.id AND pw.kind = 'paid_wallet' AND pw.owner = ''
  JOIN ledger_accounts r ON r.tenant_id = t.id AND r.kind = 'receivable' AND r.owner = ''
))sql");
}

std::string BatchCtes(bool listed_only) {
  return absl::StrCat("WITH ", kRecentCtes, ", ",
                      internal::PricedMinutesCtes(internal::IntervalSource::kEventsOfRecent), ", ",
                      ShortWayCtes(listed_only), R"sql(, slow AS (
  SELECT s.instance_id, s.billing_no, s.tenant_id, s.gpu_count, s.minute,
         (extract(epoch from s.running_since) * 1000000)::bigint AS start_us, s.unit_price,
         s.gpu_count * s.unit_price AS gross
  FROM s JOIN sf f USING (tenant_id) WHERE NOT f.easy
  UNION ALL
  SELECT instance_id, billing_no, tenant_id, gpu_count, minute, start_us, unit_price, gross
  FROM priced WHERE gross > 0
), tot AS (
  SELECT tenant_id, sum(gross)::bigint AS total, count(*) AS n FROM slow GROUP BY tenant_id
), funds AS (
  SELECT t.id AS tenant_id, t.billing_no AS tenant_no, tw.id AS trial_id,
         tw.balance_micros AS trial_avail,
         CASE WHEN t.billing_mode = 'postpaid' THEN r.id ELSE pw.id END AS main_id,
         CASE WHEN t.billing_mode = 'postpaid'
              THEN r.balance_micros + r.credit_limit_micros
              ELSE pw.balance_micros END AS main_avail,
         tot.total, tot.n
  FROM tot JOIN tenants t ON t.id = tot.tenant_id
  JOIN ledger_accounts tw ON tw.tenant_id = t.id AND tw.kind = 'trial_wallet' AND tw.owner = ''
  JOIN ledger_accounts pw ON pw.tenant_id = t.id AND pw.kind = 'paid_wallet' AND pw.owner = ''
  JOIN ledger_accounts r ON r.tenant_id = t.id AND r.kind = 'receivable' AND r.owner = ''
), fundsx AS (
  SELECT f.*, (f.trial_avail >= f.total OR (f.trial_avail = 0 AND f.main_avail >= f.total))
                AS easy
  FROM funds f
), cum AS (
  SELECT p.*, f.tenant_no, f.trial_id, f.main_id, f.trial_avail, f.main_avail,
         (sum(p.gross) OVER (PARTITION BY p.tenant_id ORDER BY p.minute, p.instance_id)
           - p.gross)::bigint AS before
  FROM slow p JOIN fundsx f USING (tenant_id)
  WHERE NOT f.easy
), capped AS (
  SELECT c.*, greatest(0, least(c.gross, c.trial_avail + c.main_avail - c.before)) AS charged,
         greatest(0, least(c.gross, c.trial_avail - c.before)) AS from_trial
  FROM cum c
), capped_rows AS MATERIALIZED (
  -- The minutes of tenants that are not easy, with each instance's first
  -- capped minute; a join with the few capped rows is cheaper than a window
  -- sort. Only these rows can have a first_cap, so the shortfalls, stops
  -- and notices read them instead of the whole batch.
  SELECT c.instance_id, c.billing_no, c.tenant_id, c.tenant_no, c.minute, c.gpu_count,
         c.unit_price, c.gross, c.start_us, c.trial_id, c.main_id, c.charged, c.from_trial,
         f.first_cap
  FROM capped c LEFT JOIN (SELECT instance_id, min(minute) AS first_cap FROM capped
                           WHERE charged < gross GROUP BY instance_id) f
    ON f.instance_id = c.instance_id
), batch AS (
  -- Read once by the charges (and by app_rent), so usually not materialized.
  -- start_us matters only in a capped row (the stop), so the easy rows of
  -- `s` leave it out.
  SELECT s.instance_id, s.billing_no, s.tenant_id, f.tenant_no, s.minute, s.gpu_count,
         s.unit_price, s.gpu_count * s.unit_price AS gross, NULL::bigint AS start_us, f.trial_id,
         f.main_id,
         s.gpu_count * s.unit_price AS charged,
         CASE WHEN f.all_trial THEN s.gpu_count * s.unit_price ELSE 0 END AS from_trial,
         NULL::bigint AS first_cap
  FROM s JOIN sf f USING (tenant_id)
  WHERE f.easy
  UNION ALL
  SELECT p.instance_id, p.billing_no, p.tenant_id, f.tenant_no, p.minute, p.gpu_count,
         p.unit_price, p.gross, p.start_us, f.trial_id, f.main_id, p.gross AS charged,
         CASE WHEN f.trial_avail >= f.total THEN p.gross ELSE 0 END AS from_trial,
         NULL::bigint AS first_cap
  FROM slow p JOIN fundsx f USING (tenant_id)
  WHERE f.easy
  UNION ALL
  SELECT * FROM capped_rows
))sql");
}

// What a batch writes besides the charges, for the rows of `src`: every
// minute of an instance from its first capped one on records what was not
// collected (the instance ran in it: its RUNNING interval says so), and the
// first capped minute stops the instance and tells the tenant, unless the
// instance has already stopped (a later batch of an instance stopped after
// an earlier cap: its last minutes are shortfall only). `firsts` holds
// every row of `src` that can have minute >= first_cap (all of `src`, or
// only its capped rows). $5 is now. With `app_rent`, the rent minutes of
// app instances also go to the temporary table billing_batch, for their
// app fees (billing/addons.cc), and CTE app_rent returns one row for each.
std::string ShortfallCtes(const std::string& src, const std::string& firsts, bool app_rent) {
  std::string sql = absl::StrCat(R"sql(
shortfalls AS (
  INSERT INTO billing_shortfalls (instance_id, usage_minute, tenant_id, gross_micros,
    charged_micros, shortfall_micros, at)
  SELECT instance_id, minute, tenant_id, gross, charged, gross - charged, $5::timestamptz
  FROM )sql", firsts, R"sql( WHERE minute >= first_cap
  ON CONFLICT DO NOTHING
), stops AS (
  INSERT INTO billing_stops (instance_id, tenant_id, stop_at)
  SELECT f.instance_id, f.tenant_id,
         CASE WHEN f.charged > 0 THEN to_timestamp((f.minute + 1) * 60)
              ELSE greatest(to_timestamp(f.minute * 60), to_timestamp(f.start_us / 1000000.0))
         END
  FROM )sql", firsts, R"sql( f WHERE f.minute = f.first_cap AND )sql", internal::InstanceStoppableSql("f.instance_id"), R"sql(
  ON CONFLICT DO NOTHING
), notices AS (
  INSERT INTO billing_notices (tenant_id, kind, instance_id, message, at)
  SELECT f.tenant_id, 'credit_exhausted', f.instance_id,
         'credit ran out in minute ' || to_char(to_timestamp(f.minute * 60) AT TIME ZONE 'UTC',
         'YYYY-MM-DD HH24:MI') || ' UTC; instance ' || f.instance_id
         || ' is stopped; uncollected: '
         || )sql", internal::YuanSql("f.gross - f.charged"), R"sql( || ' so far', $5::timestamptz
  FROM )sql", firsts, R"sql( f WHERE f.minute = f.first_cap AND )sql", internal::InstanceStoppableSql("f.instance_id"), R"sql(
))sql");
  if (app_rent) {
    absl::StrAppend(&sql, R"sql(, app_rent AS (
  INSERT INTO billing_batch (instance_id, tenant_id, minute, first_cap)
  SELECT b.instance_id, b.tenant_id, b.minute, b.first_cap FROM )sql", src, R"sql( b
  WHERE EXISTS (SELECT 1 FROM instance_apps a WHERE a.instance_id = b.instance_id)
  RETURNING 1
))sql");
  }
  return sql;
}

// The last columns of a batch statement: app rent rows written (0 without
// app_rent) and whether a volume is live in [$3, $4).
std::string AddOnColumnsSql(bool app_rent) {
  return absl::StrCat(app_rent ? "(SELECT count(*) FROM app_rent)" : "0::bigint", ", ",
                      internal::VolumesLiveSql("$3::bigint", "$4::bigint"));
}

// The charge rows of a batch: one per instance-minute that is paid at all
// and not after its instance's first capped minute.
std::string ChargeRowsSql(const std::string& src) {
  return absl::StrCat(R"sql(
  INSERT INTO ledger_charges (minute, tenant_no, instance_no, gpu_count, unit_price,
    trial_account, trial_micros, main_account, main_micros, revenue_account, at)
  SELECT b.minute, b.tenant_no, b.billing_no, b.gpu_count, b.unit_price,
         CASE WHEN b.from_trial > 0 THEN b.trial_id END, b.from_trial,
         CASE WHEN b.charged > b.from_trial THEN b.main_id END, b.charged - b.from_trial,
         $6::bigint, $5::timestamptz
  FROM )sql", src, R"sql( b
  WHERE b.charged > 0 AND (b.first_cap IS NULL OR b.minute <= b.first_cap)
  ORDER BY b.minute, b.tenant_no, b.billing_no)sql");
}

constexpr char kChargedRowsFilter[] =
    "charged > 0 AND (first_cap IS NULL OR minute <= first_cap)";

// The fast path: the batch is computed once and everything is written by
// one statement. A charge that already exists fails it (unique_violation);
// the caller then takes the slow path below.
// Returns (postings, app rent rows, volumes live). The postings are counted
// without another pass over the batch: every minute of an easy tenant (of
// `sf` or of `fundsx`) is charged, and of the others those that pass the
// filter.
std::string FastBatchSql(bool app_rent, bool listed_only) {
  return absl::StrCat(BatchCtes(listed_only), ", charges AS (", ChargeRowsSql("batch"), "), ",
                      ShortfallCtes("batch", "capped_rows", app_rent),
                      " SELECT (SELECT coalesce(sum(n), 0) FROM sf WHERE easy)::bigint + "
                      "(SELECT coalesce(sum(n), 0) FROM fundsx WHERE easy)::bigint + "
                      "(SELECT count(*) FROM capped_rows WHERE ", kChargedRowsFilter, "), ",
                      AddOnColumnsSql(app_rent));
}

// The common case (see kRecentCtes): the easy tenants' minutes, every one
// charged in full from one account. Returns (postings, the tenants of
// `sf` that are not easy or NULL, whether `recent` has an instance, whether
// a volume is live in [$3, $4), whether every account was found); the
// whole statement with listed_only follows when the second or third says
// so. With sv.charges_balanced on (migration 0090) the balance trigger
// does not fire: the statement moves the balances itself, from the sums of
// `sf` (each easy tenant's total from its one account, their sum to
// revenue) rather than from the new rows, the same deltas the trigger
// would apply; the last column checks that each of those accounts exists.
// It also moves the cursor to $4, so a batch that needs no other statement
// is done without another round trip.
std::string ShortBatchSql() {
  return absl::StrCat("WITH ", kRecentCtes, ", ", internal::MinutePriceCtes(), ", ",
                      ShortWayCtes(false), R"sql(, charges AS (
  INSERT INTO ledger_charges (minute, tenant_no, instance_no, gpu_count, unit_price,
    trial_account, trial_micros, main_account, main_micros, revenue_account, at)
  SELECT s.minute, f.tenant_no, s.billing_no, s.gpu_count, s.unit_price,
         CASE WHEN f.all_trial THEN f.trial_id END,
         CASE WHEN f.all_trial THEN s.gpu_count * s.unit_price ELSE 0 END,
         CASE WHEN NOT f.all_trial THEN f.main_id END,
         CASE WHEN f.all_trial THEN 0 ELSE s.gpu_count * s.unit_price END,
         $6::bigint, $5::timestamptz
  FROM s JOIN sf f USING (tenant_id)
  WHERE f.easy
  ORDER BY s.minute, f.tenant_no, s.billing_no
), deltas AS (
  SELECT CASE WHEN all_trial THEN trial_id ELSE main_id END AS account_id,
         -total AS delta
  FROM sf WHERE easy
  UNION ALL
  SELECT $6::bigint, sum(total)::bigint FROM sf WHERE easy HAVING count(*) > 0
), balances AS (
  UPDATE ledger_accounts a SET balance_micros = a.balance_micros + d.delta
  FROM deltas d WHERE a.id = d.account_id
  RETURNING 1
), moved AS (
  -- The cursor moves with the charges (locked by the first round trip).
  UPDATE billing_cursor SET billed_before_minute = $4::bigint,
         first_minute = coalesce(first_minute, $3::bigint), updated_at = $5::timestamptz
)
SELECT (SELECT coalesce(sum(n), 0) FROM sf WHERE easy)::bigint,
       (SELECT array_agg(tenant_id) FROM sf WHERE NOT easy),
       EXISTS (SELECT 1 FROM recent), )sql",
                      internal::VolumesLiveSql("$3::bigint", "$4::bigint"), R"sql(,
       (SELECT count(*) FROM balances) = (SELECT count(*) FROM deltas))sql");
}

// The slow path, after a charge of the batch was found present: the batch
// goes to a temporary table, present keys are skipped and compared with
// their recomputation column by column (same content: a no-op; different
// content: CHARGE_CONTENT_CLASH).
std::string SlowBatchTableSql() {
  return absl::StrCat("CREATE TEMP TABLE billing_batch_full ON COMMIT DROP AS ", BatchCtes(false),
                      " SELECT * FROM batch");
}

// The same columns as FastBatchSql, with the same parameters ($1/$2 only
// typed here).
std::string SlowBatchWriteSql(bool app_rent) {
  return absl::StrCat("WITH params AS (SELECT $1::timestamptz, $2::timestamptz), "
                      "charges AS (", ChargeRowsSql("billing_batch_full"),
                      " ON CONFLICT (minute, tenant_no, instance_no) DO NOTHING RETURNING 1), ",
                      ShortfallCtes("billing_batch_full", "billing_batch_full", app_rent),
                      " SELECT (SELECT count(*) FROM charges), ", AddOnColumnsSql(app_rent));
}

constexpr char kClashSql[] = R"sql(
SELECT count(*) FROM billing_batch_full b JOIN ledger_charges c
  ON c.minute = b.minute AND c.tenant_no = b.tenant_no AND c.instance_no = b.billing_no
WHERE b.charged > 0 AND (b.first_cap IS NULL OR b.minute <= b.first_cap)
  AND (c.gpu_count, c.unit_price, c.trial_micros, c.main_micros,
       coalesce(c.trial_account, 0), coalesce(c.main_account, 0))
      IS DISTINCT FROM
      (b.gpu_count, b.unit_price, b.from_trial, b.charged - b.from_trial,
       CASE WHEN b.from_trial > 0 THEN b.trial_id ELSE 0 END,
       CASE WHEN b.charged > b.from_trial THEN b.main_id ELSE 0 END)
)sql";

// Whether a stop of an instance whose tenant ran out is written and not yet
// applied (billing_stops_pending keeps this an index probe).
constexpr char kStopsPendingSql[] = "EXISTS (SELECT 1 FROM billing_stops WHERE NOT applied)";

}  // namespace

absl::StatusOr<MeteringResult> Billing::BillMinutesBefore(int64_t before_minute,
                                                          absl::Time now) {
  MeteringResult result;
  // Whether the last batch left stops to apply; a batch that stopped
  // nothing costs no pass over billing_stops afterwards.
  bool stops_pending = false;
  int stop_passes = 0;
  // Minutes before this one are billed one per batch: a batch of several
  // found a tenant's funds running out in it (AddOnsPosted::out_of_order).
  int64_t split_before = 0;
  for (int round = 0; round < 100'000; ++round) {
    bool done = false, stops_first = false;
    int64_t minutes = 0, postings = 0, cursor_after = 0;
    const int64_t split_was = split_before;
    absl::Status batch = db_.Transact([&](pqxx::work& txn) -> absl::Status {
      done = stops_first = stops_pending = false;
      minutes = postings = 0;
      // One round trip for the lock, the settings and what the batch needs
      // to know. Only one svd bills at a time; a second one waits for the
      // lock and then finds the cursor moved on. JIT compilation costs more
      // than it saves on these set-wise statements, and the sorts of a batch
      // should stay in memory. The batch statement is prepared once per
      // connection (parsing it cost about 3.5 ms of a 12,500-row batch) but
      // planned for each batch's own range: a generic plan was slower. An
      // app instance can be in the batch only if it is RUNNING or left
      // RUNNING after the cursor (as the intervals of PricedMinutesCtes);
      // only then is the app-rent table created. The RUNNING instances are
      // counted (to size the batch) only when more than one minute is due,
      // and the cursor row is locked before the savepoint of the fast path,
      // which the same round trip takes.
      auto head = txn.exec(absl::StrCat(
          "SELECT pg_advisory_xact_lock(", internal::kMeteringLockKey, "); "
          "SET LOCAL jit = off; SET LOCAL work_mem = '256MB'; "
          "SET LOCAL plan_cache_mode = force_custom_plan; "
          "SELECT FROM billing_cursor FOR UPDATE; SAVEPOINT billing_fast; "
          "SET LOCAL sv.charges_balanced = on; "
          "SELECT c.billed_before_minute, ", kStopsPendingSql, ", "
          "CASE WHEN c.billed_before_minute >= ", before_minute - 1, " THEN 1 "
          "ELSE (SELECT count(*) FROM instances WHERE state = 'RUNNING') END, "
          "(SELECT id FROM ledger_accounts WHERE tenant_id IS NULL "
          " AND kind = 'platform_revenue' AND owner = ''), "
          "EXISTS (SELECT 1 FROM instance_apps a JOIN instances i ON i.id = a.instance_id "
          "        WHERE i.state = 'RUNNING') "
          "OR EXISTS (SELECT 1 FROM instance_events e JOIN instance_apps a "
          "           ON a.instance_id = e.instance_id WHERE e.from_state = 'RUNNING' "
          "           AND e.at > to_timestamp(c.billed_before_minute * 60)) "
          "FROM billing_cursor c"));
      // Stops first: the next minutes must see them (an earlier run may have
      // ended before applying its stops).
      if (head[0][1].as<bool>()) {
        stops_first = true;
        return absl::OkStatus();
      }
      if (head[0][3].is_null()) {
        return Error(absl::StatusCode::kInternal, "LEDGER_ACCOUNT_MISSING",
                     "the platform_revenue account is missing");
      }
      const int64_t revenue = head[0][3].as<int64_t>();
      bool app_rent = head[0][4].as<bool>();
      int64_t cursor = 0;
      if (head[0][0].is_null()) {
        // An empty ledger starts at the first RUNNING time, at most
        // first_run_lookback ago.
        auto first = txn.exec_params(
            "SELECT coalesce(min((extract(epoch from at))::bigint / 60), $1) "
            "FROM instance_events WHERE to_state = 'RUNNING'",
            MinuteOf(now));
        cursor = std::max(first[0][0].as<int64_t>(), MinuteOf(now - options_.first_run_lookback));
        cursor = std::min(cursor, before_minute);
        app_rent = true;  // The check above had no cursor to go by.
      } else {
        cursor = head[0][0].as<int64_t>();
      }
      if (cursor >= before_minute) {
        done = true;
        cursor_after = cursor;
        txn.exec_params("UPDATE billing_cursor SET billed_before_minute = $1, "
                        "first_minute = $1 WHERE billed_before_minute IS NULL", cursor);
        return absl::OkStatus();
      }
      const int64_t active = std::max<int64_t>(1, head[0][2].as<int64_t>());
      const int64_t span =
          cursor < split_before
              ? 1
              : std::clamp<int64_t>(options_.batch_rows_max / active, 1,
                                    options_.batch_minutes_max);
      const int64_t end = std::min(before_minute, cursor + span);
      // The fast path may fail on a charge already present; the savepoint
      // (taken by the first round trip) keeps the rest of the transaction.
      // sv.charges_balanced (migration 0090) stays on only for the
      // statement of the easy tenants: every other statement that inserts
      // charges runs with the balance trigger (the rollback to the savepoint
      // turns it off for the slow path).
      if (app_rent) {
        txn.exec(absl::StrCat(internal::kCreateAppRentTableSql,
                              "; SET LOCAL sv.charges_balanced = off"));
      }
      internal::AddOnBatch addons;
      addons.unpaid_storage_grace_minutes = absl::ToInt64Minutes(options_.unpaid_storage_grace);
      addons.platform_account = revenue;
      bool present = false;
      // Whether the cursor has moved and no stop can have been recorded:
      // only the statement of the easy tenants ran (it moves the cursor and
      // records no stop; storage records none either).
      bool cursor_moved = false;
      try {
        if (app_rent) {
          // The statement writes a temporary table created by this
          // transaction, so it is not kept prepared.
          auto written = txn.exec_params(FastBatchSql(true, false), SqlTime(MinuteStart(cursor)),
                                         SqlTime(MinuteStart(end)), cursor, end, SqlTime(now),
                                         revenue);
          postings = written[0][0].as<int64_t>();
          addons.app_rent_rows = written[0][1].as<int64_t>() > 0;
          addons.volumes_live = written[0][2].as<bool>();
        } else {
          // The easy tenants first (kRecentCtes), then, only if some are
          // left, the whole statement for those.
          static const std::string* const kShortBatch = new std::string(ShortBatchSql());
          auto easy = store::ExecPrepared(txn, "sv_billing_batch_easy", *kShortBatch,
                                          SqlTime(MinuteStart(cursor)),
                                          SqlTime(MinuteStart(end)), cursor, end,
                                          SqlTime(now), revenue);
          postings = easy[0][0].as<int64_t>();
          addons.volumes_live = easy[0][3].as<bool>();
          if (!easy[0][4].as<bool>()) {
            return Error(absl::StatusCode::kInternal, "LEDGER_ACCOUNT_MISSING",
                         "a charge names an account that does not exist");
          }
          cursor_moved = true;
          if (!easy[0][1].is_null() || easy[0][2].as<bool>()) {
            cursor_moved = false;
            txn.exec("SET LOCAL sv.charges_balanced = off");
            // $7: the tenants left, as the text of the array returned.
            static const std::string* const kRestBatch =
                new std::string(FastBatchSql(false, true));
            auto rest = store::ExecPrepared(
                txn, "sv_billing_batch_rest", *kRestBatch, SqlTime(MinuteStart(cursor)),
                SqlTime(MinuteStart(end)), cursor, end, SqlTime(now), revenue,
                easy[0][1].is_null() ? std::string("{}") : easy[0][1].as<std::string>());
            postings += rest[0][0].as<int64_t>();
          }
        }
      } catch (const pqxx::unique_violation&) {
        present = true;  // A charge of the batch exists: undo the statement.
      }
      if (present) {
        cursor_moved = false;  // Rolled back with the statement.
        // The rollback also drops the app-rent table created after the
        // savepoint.
        txn.exec(app_rent ? absl::StrCat("ROLLBACK TO SAVEPOINT billing_fast; ",
                                         internal::kCreateAppRentTableSql)
                          : std::string("ROLLBACK TO SAVEPOINT billing_fast"));
        txn.exec_params(SlowBatchTableSql(), SqlTime(MinuteStart(cursor)),
                        SqlTime(MinuteStart(end)), cursor, end);
        auto written = txn.exec_params(SlowBatchWriteSql(app_rent), SqlTime(MinuteStart(cursor)),
                                       SqlTime(MinuteStart(end)), cursor, end, SqlTime(now),
                                       revenue);
        postings = written[0][0].as<int64_t>();
        addons.app_rent_rows = written[0][1].as<int64_t>() > 0;
        addons.volumes_live = written[0][2].as<bool>();
        auto clashes = txn.exec(kClashSql);
        if (clashes[0][0].as<int64_t>() > 0) {
          return Error(absl::StatusCode::kInternal, "CHARGE_CONTENT_CLASH",
                       "a minute charge already posted differs from its recomputation");
        }
      }
      // App fees and storage of the same minutes, after the rent
      // (billing/addons.cc).
      SV_ASSIGN_OR_RETURN(internal::AddOnsPosted addons_posted,
                          internal::PostAddOnCharges(txn, cursor, end, now, addons));
      if (addons_posted.out_of_order) {
        // A tenant's last funds went to later rent before earlier storage or
        // app fees: undo the batch and bill its minutes one by one.
        // Not kAborted: Transact would retry that as a conflict.
        split_before = end;
        return Error(absl::StatusCode::kFailedPrecondition, "BATCH_SPLIT",
                     "the batch is billed again minute by minute");
      }
      postings += addons_posted.legs;
      if (!cursor_moved) {
        auto moved = txn.exec_params(
            absl::StrCat("UPDATE billing_cursor SET billed_before_minute = $1, "
                         "first_minute = coalesce(first_minute, $3), "
                         "updated_at = $2::timestamptz RETURNING ", kStopsPendingSql),
            end, SqlTime(now), cursor);
        stops_pending = moved[0][0].as<bool>();
      }
      minutes = end - cursor;
      cursor_after = end;
      return absl::OkStatus();
    });
    if (!batch.ok() && split_before != split_was) continue;  // Rolled back; split.
    SV_RETURN_IF_ERROR(batch);
    if (stops_first) {
      // Each pass applies up to 1,000 stops and marks them; a stop that
      // stays pending after this many passes would otherwise spin here.
      if (++stop_passes > 1'000) {
        return Error(absl::StatusCode::kInternal, "STOPS_NOT_APPLIED",
                     "pending credit stops are not being applied; billing is held");
      }
      SV_RETURN_IF_ERROR(ApplyPendingStops(&result.stopped_instances));
      continue;
    }
    stop_passes = 0;
    result.minutes_billed += minutes;
    result.postings += postings;
    result.billed_before_minute = cursor_after;
    if (done || cursor_after >= before_minute) break;
    if (stops_pending) {
      SV_RETURN_IF_ERROR(ApplyPendingStops(&result.stopped_instances));
      stops_pending = false;
    }
  }
  if (stops_pending) SV_RETURN_IF_ERROR(ApplyPendingStops(&result.stopped_instances));
  return result;
}

absl::Status Billing::ApplyPendingStops(int64_t* stopped_count) {
  std::vector<std::vector<std::string>> pending;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    pending.clear();
    auto rows = txn.exec(
        "SELECT instance_id, tenant_id, stop_at::text, "
        "(extract(epoch from stop_at) * 1000000)::bigint::text FROM billing_stops "
        "WHERE NOT applied ORDER BY stop_at LIMIT 1000");
    for (const auto& r : rows) {
      pending.push_back({r[0].as<std::string>(), r[1].as<std::string>(),
                         r[2].as<std::string>(), r[3].as<std::string>()});
    }
    return absl::OkStatus();
  }));
  for (const auto& p : pending) {
    // The instance stops now, not at stop_at: it has run since then (the
    // minutes after stop_at were metered as shortfall, or will be), and its
    // RUNNING interval must say how long it held its GPUs.
    const absl::Time stop_at = absl::FromUnixMicros(std::stoll(p[3]));
    auto stopped =
        store_.StopInstance(p[1], p[0], "credit exhausted", std::max(clock_.Now(), stop_at));
    if (!stopped.ok() && ReasonOf(stopped.status()) != "INSTANCE_FINISHED") {
      return stopped.status();
    }
    if (stopped.ok()) {
      ++*stopped_count;
      spdlog::info("billing: stopped {} tenant={}: credit exhausted (paid up to {})", p[0], p[1],
                   p[2]);
    }
    SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
      txn.exec_params("UPDATE billing_stops SET applied = true WHERE instance_id = $1 "
                      "AND stop_at = $2::timestamptz", p[0], p[2]);
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

// The GPU-minute price at $1 of each GPU model that runs, looked up once per
// model (CTE `price`): looked up per running instance it was most of the
// low-credit warning's time, 0.55 s for 100,000 running instances.
constexpr char kRunningPricesCte[] = R"sql(
      WITH price AS MATERIALIZED (
        SELECT m.gpu_model, coalesce(
          (SELECT p.unit_price_micros FROM price_book p WHERE p.item_kind = 'gpu_minute'
             AND p.item IN (m.gpu_model, '*') AND p.effective_from <= $1::timestamptz
           ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) AS unit
        FROM (SELECT DISTINCT gpu_model FROM instances WHERE state = 'RUNNING') m
      ))sql";

absl::Status Billing::StopUnfunded(absl::Time now, int64_t* stopped_count) {
  // Metering bills a minute only once the lag has passed after it, so it
  // finds a tenant's credit gone a minute or more after the minute that
  // took it. Here each running instance is charged in thought for its
  // minutes from the cursor (or its start) up to and including the minute
  // of `now`, at its present size, in metering's order (minute, then
  // instance id); those the tenant's credit cannot pay in full are stopped
  // now. The estimate counts no more than metering will charge (stopped
  // instances, earlier sizes and storage are left out, and an app's fee is
  // its hourly price / 60 rounded down), so an instance the credit covers
  // is never stopped; metering charges and caps the minutes later as usual.
  //
  // An app's fee is paid from the paid wallet (or the receivable) alone,
  // after the minute's rent, and the rent takes the trial credit first
  // (docs/marketplace.md). So an app instance is also stopped when what
  // the rent leaves of the paid credit cannot pay the tenant's fees
  // through its own: the rent of every minute up to the present one, then
  // the fees in the same order.
  struct Unfunded {
    std::string instance;
    std::string tenant;
    std::string minute;  // "YYYY-MM-DD HH:MM"
    bool for_fee = false;  // The rent would be paid, the app fee not.
  };
  std::vector<Unfunded> unfunded;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    unfunded.clear();
    for (const auto& r : txn.exec_params(absl::StrCat(kRunningPricesCte, R"sql(,
      run AS MATERIALIZED (
        SELECT i.id, i.tenant_id, (i.gpu_count * pr.unit)::bigint AS per_minute,
               coalesce(ap.price_per_hour_micros / 60, 0)::bigint AS fee_per_minute,
               greatest(coalesce((SELECT b.billed_before_minute FROM billing_cursor b), 0),
                        floor(extract(epoch from i.running_since) / 60)::bigint) AS from_minute
        FROM instances i JOIN price pr USING (gpu_model)
        LEFT JOIN instance_apps ap ON ap.instance_id = i.id
        WHERE i.state = 'RUNNING' AND i.running_since IS NOT NULL AND pr.unit > 0
      ), short AS (
        -- Tenants whose credit cannot pay all of it; only theirs are ordered.
        SELECT o.tenant_id, o.rent_owed, o.fee_owed,
               coalesce(sum(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'),
                        0)::bigint AS trial,
               coalesce(sum(CASE
                   WHEN a.kind = 'paid_wallet' AND t.billing_mode = 'prepaid'
                     THEN a.balance_micros
                   WHEN a.kind = 'receivable' AND t.billing_mode = 'postpaid'
                     THEN a.balance_micros + a.credit_limit_micros
                   ELSE 0 END), 0)::bigint AS main
        FROM (SELECT tenant_id,
                     sum(per_minute * ($2::bigint - from_minute + 1))::bigint AS rent_owed,
                     sum(fee_per_minute * ($2::bigint - from_minute + 1))::bigint AS fee_owed
              FROM run GROUP BY tenant_id) o
        JOIN tenants t ON t.id = o.tenant_id
        LEFT JOIN ledger_accounts a ON a.tenant_id = o.tenant_id
        GROUP BY o.tenant_id, o.rent_owed, o.fee_owed
      ), owed AS (
        SELECT r.id, r.tenant_id, r.fee_per_minute, s.trial, s.main,
               -- The paid credit the rent of every minute through the
               -- present one leaves for the fees.
               s.main - greatest(0, s.rent_owed - s.trial) AS left_for_fees,
               sum(r.per_minute * greatest($2::bigint - r.from_minute, 0))
                 OVER (PARTITION BY r.tenant_id) AS earlier,
               sum(r.per_minute) OVER (PARTITION BY r.tenant_id ORDER BY r.id
                                       ROWS UNBOUNDED PRECEDING) AS this_minute,
               sum(r.fee_per_minute * greatest($2::bigint - r.from_minute, 0))
                 OVER (PARTITION BY r.tenant_id) AS fees_earlier,
               sum(r.fee_per_minute) OVER (PARTITION BY r.tenant_id ORDER BY r.id
                                           ROWS UNBOUNDED PRECEDING) AS fees_this_minute
        FROM run r JOIN short s USING (tenant_id)
        WHERE s.trial + s.main < s.rent_owed
           OR (s.fee_owed > 0 AND s.main - greatest(0, s.rent_owed - s.trial) < s.fee_owed)
      ), verdict AS (
        SELECT id, tenant_id, trial + main < earlier + this_minute AS for_rent,
               fee_per_minute > 0 AND left_for_fees < fees_earlier + fees_this_minute AS for_fee
        FROM owed
      )
      SELECT id, tenant_id, NOT for_rent FROM verdict WHERE for_rent OR for_fee
      ORDER BY tenant_id, id)sql"),
                                         SqlTime(now), MinuteOf(now))) {
      unfunded.push_back({r[0].as<std::string>(), r[1].as<std::string>(),
                          absl::FormatTime("%Y-%m-%d %H:%M", MinuteStart(MinuteOf(now)),
                                           absl::UTCTimeZone()),
                          r[2].as<bool>()});
    }
    return absl::OkStatus();
  }));
  for (const Unfunded& u : unfunded) {
    auto before = store_.GetInstance(u.tenant, u.instance);
    if (!before.ok() || before->state != store::InstanceState::kRunning) continue;
    auto stopped = store_.StopInstance(u.tenant, u.instance, "credit exhausted", now);
    if (!stopped.ok()) {
      if (ReasonOf(stopped.status()) == "INSTANCE_FINISHED") continue;
      return stopped.status();
    }
    ++*stopped_count;
    spdlog::info("billing: stopped {} tenant={}: {} in minute {} UTC", u.instance, u.tenant,
                 u.for_fee ? "paid credit exhausted for the app fee" : "credit exhausted",
                 u.minute);
    SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
      txn.exec_params(
          "INSERT INTO billing_notices (tenant_id, kind, instance_id, message, at) "
          "VALUES ($1, 'credit_exhausted', $2, $3, $4::timestamptz)",
          u.tenant, u.instance,
          u.for_fee ? absl::StrCat("credit ran out for the app fee in minute ", u.minute,
                                   " UTC (trial credit pays rent only); instance ",
                                   u.instance, " is stopped; top up to start it again")
                    : absl::StrCat("credit ran out in minute ", u.minute, " UTC; instance ",
                                   u.instance, " is stopped; top up to start it again"),
          SqlTime(now));
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

absl::Status Billing::DeleteUnpaidVolumes(absl::Time now, int64_t* deleted_count) {
  const int64_t grace = absl::ToInt64Minutes(options_.unpaid_storage_grace);
  if (grace <= 0) return absl::OkStatus();
  std::vector<std::array<std::string, 2>> due;  // volume, tenant
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    due.clear();
    // Unpaid from a minute at least `grace` before the first minute not
    // yet billed: every minute since has been billed, and none was paid.
    for (const auto& r : txn.exec_params(
             "SELECT v.id, v.tenant_id FROM volumes v, billing_cursor b "
             "WHERE v.unpaid_since_minute IS NOT NULL AND v.deleted_at IS NULL "
             "  AND v.unpaid_since_minute <= b.billed_before_minute - $1::bigint "
             "ORDER BY v.unpaid_since_minute, v.id LIMIT 1000",
             grace)) {
      due.push_back({r[0].as<std::string>(), r[1].as<std::string>()});
    }
    return absl::OkStatus();
  }));
  for (const auto& [volume, tenant] : due) {
    bool deleted = false;
    SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
      deleted = false;
      // The same checks under the volume's lock, as DeleteVolume takes it.
      auto row = txn.exec_params(
          "SELECT v.size_gib, v.unpaid_since_minute FROM volumes v, billing_cursor b "
          "WHERE v.id = $1 AND v.deleted_at IS NULL AND v.unpaid_since_minute IS NOT NULL "
          "  AND v.unpaid_since_minute <= b.billed_before_minute - $2::bigint "
          "FOR UPDATE OF v",
          volume, grace);
      if (row.empty()) return absl::OkStatus();
      // A node an instance left may still mount it (migration 0124): the
      // data stays until that node says it does not.
      auto held = txn.exec_params(
          "SELECT a.instance_id FROM volume_attachments a JOIN instances i "
          "ON i.id = a.instance_id WHERE a.volume_id = $1 "
          "AND (i.state IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING') "
          "     OR cardinality(a.fenced_nodes) > 0)",
          volume);
      if (!held.empty()) {
        spdlog::warn("billing: volume {} unpaid past its grace is attached to {}, which "
                     "holds (or may still mount it on) a node; it is deleted once that "
                     "instance stops and its nodes let the volume go",
                     volume, held[0][0].as<std::string>());
        return absl::OkStatus();
      }
      // Attachments to instances that hold no node are only rows.
      txn.exec_params("DELETE FROM volume_attachments WHERE volume_id = $1", volume);
      txn.exec_params(
          "UPDATE volumes SET deleted_at = $2::timestamptz, updated_at = $2::timestamptz, "
          "move_to_instance_id = NULL, move_mount_path = NULL WHERE id = $1",
          volume, SqlTime(now));
      txn.exec_params(
          "INSERT INTO billing_notices (tenant_id, kind, message, at) VALUES "
          "($1, 'volume_deleted', 'volume ' || $2 || ' (' || $3 || ' GiB) is deleted: its "
          "storage was not paid for from minute ' || to_char(to_timestamp($4::bigint * 60) AT "
          "TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC on, for ' || $5 || ' or more', "
          "$6::timestamptz)",
          tenant, volume, row[0][0].as<int>(), row[0][1].as<int64_t>(),
          internal::GraceText(grace), SqlTime(now));
      deleted = true;
      return absl::OkStatus();
    }));
    if (deleted) {
      ++*deleted_count;
      spdlog::info("billing: deleted volume {} tenant={}: storage unpaid for {}", volume,
                   tenant, internal::GraceText(grace));
    }
  }
  return absl::OkStatus();
}

absl::Status Billing::WarnLowCredit(absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) {
    // Tenants whose running instances can run fewer than the warning
    // minutes, warned at most once an hour.
    txn.exec_params(absl::StrCat(kRunningPricesCte, R"sql(, storage_price AS MATERIALIZED (
        SELECT k.kind, coalesce(
          (SELECT p.unit_price_micros FROM price_book p WHERE p.item_kind = 'storage_gib_hour'
             AND p.item IN (k.kind, '*') AND p.effective_from <= $1::timestamptz
           ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) AS unit
        FROM (VALUES ('network'), ('node_local')) k (kind)
      ), burn AS (
        -- The price once per GPU model: looked up per instance, it was most
        -- of this statement's time (0.55 s for 100,000 running instances).
        -- With the running apps' fees and the live volumes' storage, which
        -- have hourly prices: a tenant with only volumes is warned too.
        SELECT c.tenant_id, (sum(c.per_minute) + div(sum(c.per_hour), 60))::bigint AS per_minute
        FROM (SELECT i.tenant_id, i.gpu_count * pr.unit AS per_minute, 0 AS per_hour
              FROM instances i JOIN price pr USING (gpu_model) WHERE i.state = 'RUNNING'
              UNION ALL
              SELECT i.tenant_id, 0, ap.price_per_hour_micros
              FROM instance_apps ap JOIN instances i ON i.id = ap.instance_id
              WHERE i.state = 'RUNNING'
              UNION ALL
              SELECT v.tenant_id, 0, v.size_gib * sp.unit
              FROM volumes v JOIN storage_price sp USING (kind)
              WHERE v.deleted_at IS NULL) c
        GROUP BY c.tenant_id
      ), funds AS (
        SELECT b.tenant_id, b.per_minute, sum(CASE
            WHEN a.kind = 'trial_wallet' THEN a.balance_micros
            WHEN a.kind = 'paid_wallet' AND t.billing_mode = 'prepaid' THEN a.balance_micros
            WHEN a.kind = 'receivable' AND t.billing_mode = 'postpaid'
              THEN a.balance_micros + a.credit_limit_micros
            ELSE 0 END)::bigint AS available
        FROM burn b JOIN tenants t ON t.id = b.tenant_id
        JOIN ledger_accounts a ON a.tenant_id = b.tenant_id
        GROUP BY b.tenant_id, b.per_minute
      )
      INSERT INTO billing_notices (tenant_id, kind, message, at)
      SELECT f.tenant_id, 'low_credit',
             'credit for about ' || (f.available / f.per_minute) || ' more minutes at '
             || )sql", internal::YuanSql("f.per_minute"), R"sql( || ' per minute; top up to keep '
             || 'instances running and volumes paid for',
             $1::timestamptz
      FROM funds f
      WHERE f.per_minute > 0 AND f.available < f.per_minute * $2::bigint
        AND NOT EXISTS (SELECT 1 FROM billing_notices n WHERE n.tenant_id = f.tenant_id
                        AND n.kind = 'low_credit'
                        AND n.at > $1::timestamptz - interval '1 hour'))sql"),
                    SqlTime(now), options_.low_credit_warning_minutes);
    return absl::OkStatus();
  });
}

absl::StatusOr<MeteringResult> Billing::RunOnce(absl::Time now) {
  SV_RETURN_IF_ERROR(GrantMissingTrials(now).status());
  const int64_t target = MinuteOf(now - options_.metering_lag);
  // Trial credit pays for the minutes that start before its expiry: bill up
  // to each due expiry first, then reverse what is left of that grant.
  for (int round = 0; round < 1000; ++round) {
    std::optional<absl::Time> due;
    SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
      auto rows = txn.exec_params(
          "SELECT (extract(epoch from min(expires_at)) * 1000000)::bigint FROM trial_grants "
          "WHERE NOT expired AND expires_at <= $1::timestamptz",
          SqlTime(now));
      due.reset();
      if (!rows[0][0].is_null()) due = absl::FromUnixMicros(rows[0][0].as<int64_t>());
      return absl::OkStatus();
    }));
    if (!due) break;
    const int64_t before = MinuteOf(*due) + (MinuteStart(MinuteOf(*due)) == *due ? 0 : 1);
    if (before > target) break;  // Expires once metering has passed it.
    SV_RETURN_IF_ERROR(BillMinutesBefore(before, now).status());
    SV_RETURN_IF_ERROR(ExpireTrials(*due, now).status());
  }
  SV_ASSIGN_OR_RETURN(MeteringResult result, BillMinutesBefore(target, now));
  SV_ASSIGN_OR_RETURN(result.adjustment_legs, RecheckLateEvents(now));
  SV_RETURN_IF_ERROR(StopUnfunded(now, &result.stopped_instances));
  SV_RETURN_IF_ERROR(DeleteUnpaidVolumes(now, &result.deleted_volumes));
  SV_RETURN_IF_ERROR(WarnLowCredit(now));
  SV_RETURN_IF_ERROR(IssueDueInvoices(now));
  return result;
}

}  // namespace sv::billing
