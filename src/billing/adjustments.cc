// Late events: a RUNNING boundary recorded after its minutes were billed
// (a node's death found late, an agent that reports a stop after a
// partition). The loop rechecks the instances such events touch, from the
// events alone (as the auditor does), and posts `adjustment` transfers for
// the difference: a refund of minutes charged beyond the true RUNNING end,
// a charge of minutes missed. See docs/billing.md, "Late events".
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::billing {
namespace {

using store::SqlTime;

// Instances with a RUNNING boundary the recheck has not seen ($1: the
// cursor of seen events; a range scan of the primary key), or a RUNNING end
// in the recent window ($2; the partial index on ends by time), so that an
// end committed out of id order is still caught; only events before the
// metering cursor ($3) matter. from_minute is the earliest minute such an
// event can change, never before metering began ($4).
constexpr char kRecheckSetSql[] = R"sql(
CREATE TEMP TABLE billing_recheck ON COMMIT DROP AS
SELECT e.instance_id, i.tenant_id, tw.id AS trial_id,
       greatest(min((extract(epoch from e.at))::bigint / 60), $4::bigint) AS from_minute
FROM (SELECT instance_id, at FROM instance_events
      WHERE id > $1 AND at < $3::timestamptz
        AND (to_state = 'RUNNING' OR from_state = 'RUNNING')
      UNION ALL
      SELECT instance_id, at FROM instance_events
      WHERE from_state = 'RUNNING' AND at >= $2::timestamptz AND at < $3::timestamptz) e
JOIN instances i ON i.id = e.instance_id
JOIN ledger_accounts tw ON tw.tenant_id = i.tenant_id AND tw.kind = 'trial_wallet'
GROUP BY e.instance_id, i.tenant_id, tw.id
)sql";

// Every billed minute of those instances whose owed amount (from the
// events) differs from what the ledger holds for it: charges, earlier
// adjustments (net of refunds) and the recorded shortfall. $5 is the
// platform revenue account, $6 the promotion expense. Legs are told apart
// by account id (the tenant's trial wallet is in billing_recheck), not by
// joining the accounts: that join made every lookup scan them all.
std::string DiffSql() {
  return absl::StrCat("WITH ", internal::PricedMinutesCtes(internal::IntervalSource::kEventsOfRecheck),
                      R"sql(,
grid AS (
  SELECT r.instance_id, r.tenant_id, r.trial_id, m AS minute
  FROM billing_recheck r, generate_series(r.from_minute, $4::bigint - 1) AS m
)
SELECT g.instance_id, g.tenant_id, g.minute, coalesce(p.gross, 0) AS owed,
       coalesce(c.net, 0) + coalesce(a.net, 0) AS net,
       coalesce(c.trial, 0) + coalesce(a.trial, 0) AS net_trial,
       coalesce(s.shortfall_micros, 0) AS shortfall,
       coalesce(a.n, 0) AS adjustments, coalesce(p.gpu_model, c.gpu_model) AS gpu_model
FROM grid g
LEFT JOIN priced p ON p.instance_id = g.instance_id AND p.minute = g.minute
LEFT JOIN LATERAL (
  SELECT (ch.trial_micros + ch.main_micros)::bigint AS net,
         CASE WHEN ch.trial_account = g.trial_id THEN ch.trial_micros END AS trial,
         i.gpu_model
  FROM instances i JOIN tenants tn ON tn.id = i.tenant_id
  JOIN ledger_charges ch
    ON ch.minute = g.minute AND ch.tenant_no = tn.billing_no AND ch.instance_no = i.billing_no
  WHERE i.id = g.instance_id) c ON true
LEFT JOIN LATERAL (
  SELECT sum(CASE WHEN t.to_account_id = $5 THEN t.amount_micros
                  ELSE -t.amount_micros END)::bigint AS net,
         sum(CASE WHEN t.from_account_id = g.trial_id THEN t.amount_micros
                  WHEN t.to_account_id IN (g.trial_id, $6) THEN -t.amount_micros
                  ELSE 0 END)::bigint AS trial,
         count(DISTINCT t.idempotency_key) AS n
  FROM ledger_transfers t
  WHERE t.kind = 'adjustment' AND t.instance_id = g.instance_id
    AND t.usage_minute = g.minute) a ON true
LEFT JOIN billing_shortfalls s ON s.instance_id = g.instance_id AND s.usage_minute = g.minute
WHERE coalesce(p.gross, 0) <> coalesce(c.net, 0) + coalesce(a.net, 0)
                              + coalesce(s.shortfall_micros, 0)
ORDER BY g.instance_id, g.minute
)sql");
}

struct Leg {
  int64_t from = 0;
  int64_t to = 0;
  int64_t amount = 0;
};

}  // namespace

absl::StatusOr<int64_t> Billing::RecheckLateEvents(absl::Time now) {
  int64_t postings = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    postings = 0;
    // Under the metering lock: the cursor and the charges cannot move.
    txn.exec_params("SELECT pg_advisory_xact_lock($1)", internal::kMeteringLockKey);
    txn.exec("SET LOCAL jit = off");
    auto cursor = txn.exec("SELECT first_minute, billed_before_minute FROM billing_cursor");
    auto seen = txn.exec("SELECT events_seen_through FROM billing_recheck_cursor FOR UPDATE");
    auto last_event = txn.exec("SELECT coalesce(max(id), 0) FROM instance_events");
    if (cursor[0][1].is_null() || seen.empty()) return absl::OkStatus();
    const int64_t first = cursor[0][0].is_null() ? cursor[0][1].as<int64_t>()
                                                 : cursor[0][0].as<int64_t>();
    const int64_t billed_before = cursor[0][1].as<int64_t>();
    txn.exec_params(kRecheckSetSql, seen[0][0].as<int64_t>(),
                    SqlTime(MinuteStart(billed_before) - options_.late_event_recent_window),
                    SqlTime(MinuteStart(billed_before)), first);
    // A fresh temporary table has no statistics; without them the planner
    // may re-run the interval computation for every minute of the grid.
    txn.exec("ANALYZE billing_recheck");
    auto lowest = txn.exec("SELECT min(from_minute) FROM billing_recheck");
    if (!lowest[0][0].is_null() && lowest[0][0].as<int64_t>() < billed_before) {
      const int64_t from = lowest[0][0].as<int64_t>();
      const int64_t revenue = internal::PlatformAccount(txn, "platform_revenue");
      const int64_t promotion = internal::PlatformAccount(txn, "promotion_expense");
      auto diffs = txn.exec_params(DiffSql(), SqlTime(MinuteStart(from)),
                                   SqlTime(MinuteStart(billed_before)), from, billed_before,
                                   revenue, promotion);
      for (const auto& row : diffs) {
        const std::string instance = row["instance_id"].as<std::string>();
        const std::string tenant = row["tenant_id"].as<std::string>();
        const int64_t minute = row["minute"].as<int64_t>();
        const int64_t owed = row["owed"].as<int64_t>();
        const int64_t net = row["net"].as<int64_t>();
        const int64_t net_trial = row["net_trial"].as<int64_t>();
        const int64_t shortfall = row["shortfall"].as<int64_t>();
        const int64_t diff = owed - net - shortfall;
        auto accounts = txn.exec_params(
            "SELECT max(a.id) FILTER (WHERE a.kind = 'trial_wallet'), "
            "max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), "
            "max(CASE WHEN t.billing_mode = 'postpaid' THEN r.id ELSE a.id END) "
            "  FILTER (WHERE a.kind = 'paid_wallet'), "
            "max(CASE WHEN t.billing_mode = 'postpaid' "
            "  THEN r.balance_micros + r.credit_limit_micros ELSE a.balance_micros END) "
            "  FILTER (WHERE a.kind = 'paid_wallet'), "
            "bool_or(EXISTS (SELECT 1 FROM trial_grants g WHERE g.tenant_id = t.id "
            "  AND NOT g.expired AND g.amount_micros > 0)) "
            "FROM tenants t JOIN ledger_accounts a ON a.tenant_id = t.id "
            "JOIN ledger_accounts r ON r.tenant_id = t.id AND r.kind = 'receivable' "
            "WHERE t.id = $1 GROUP BY t.id",
            tenant);
        if (accounts.empty()) continue;
        const int64_t trial_id = accounts[0][0].as<int64_t>();
        const int64_t trial_avail = accounts[0][1].as<int64_t>();
        const int64_t main_now = accounts[0][2].as<int64_t>();
        const int64_t main_avail = accounts[0][3].as<int64_t>();
        const bool trial_valid = accounts[0][4].as<bool>();
        std::vector<Leg> legs;
        // What stays uncollected of the minute once this posting is made.
        int64_t shortfall_after = shortfall;
        if (diff < 0) {
          // Charged beyond the true RUNNING intervals: give back what was
          // paid beyond what is owed, the paid part first (trial credit is
          // spent first, so it is the last to come back). Trial credit
          // whose grants have all expired goes back to the promotion
          // expense, as expiry would have moved it. A minute that was
          // capped is owed less, not nothing: what was paid counts
          // against what is still owed, and the shortfall shrinks to the
          // rest (it used to count as paid, and all of the charge came
          // back).
          const int64_t refund = std::clamp<int64_t>(net - owed, 0, net);
          shortfall_after = std::max<int64_t>(0, owed - (net - refund));
          const int64_t main_back = std::clamp<int64_t>(net - net_trial, 0, refund);
          const int64_t trial_back = refund - main_back;
          // The paid part goes to the account the tenant's mode charges
          // now: the charge's own, unless the mode changed since, and
          // then the balance went there too (SetBillingMode).
          if (main_back > 0) legs.push_back({revenue, main_now, main_back});
          if (trial_back > 0) legs.push_back({revenue, trial_valid ? trial_id : promotion,
                                              trial_back});
        } else {
          // A minute owed but not charged (a RUNNING interval recorded
          // late): charge it now, trial first, capped at what is left.
          const int64_t from_trial = std::min(diff, trial_avail);
          const int64_t from_main = std::clamp<int64_t>(diff - from_trial, 0,
                                                        std::max<int64_t>(0, main_avail));
          if (from_trial > 0) legs.push_back({trial_id, revenue, from_trial});
          if (from_main > 0) legs.push_back({main_now, revenue, from_main});
          shortfall_after = shortfall + diff - from_trial - from_main;
        }
        // The rest of the minute is recorded as uncollected, as a capped
        // minute's is, even when nothing could be collected (it used to be
        // recorded only next to a posting: a late run of a tenant with
        // nothing left was neither charged nor recorded, and the auditor
        // reported it for ever).
        if (shortfall_after > 0 && shortfall_after != shortfall) {
          txn.exec_params(
              "INSERT INTO billing_shortfalls (instance_id, usage_minute, tenant_id, "
              "gross_micros, charged_micros, shortfall_micros, at) "
              "VALUES ($1, $2, $3, $4, $5, $6, $7::timestamptz) "
              "ON CONFLICT (instance_id, usage_minute) DO UPDATE SET "
              "gross_micros = EXCLUDED.gross_micros, charged_micros = EXCLUDED.charged_micros, "
              "shortfall_micros = EXCLUDED.shortfall_micros",
              instance, minute, tenant, owed, owed - shortfall_after, shortfall_after,
              SqlTime(now));
        } else if (shortfall_after == 0 && shortfall > 0) {
          // Found not owed beyond what was paid: nothing is uncollected.
          txn.exec_params(
              "DELETE FROM billing_shortfalls WHERE instance_id = $1 AND usage_minute = $2",
              instance, minute);
        }
        if (legs.empty() && shortfall_after == shortfall) continue;
        const std::string key = absl::StrCat("adjust:", instance, ":", minute, ":",
                                             row["adjustments"].as<int64_t>() + 1);
        std::string content = absl::StrCat(instance, "|", minute, "|", owed, "|", net);
        for (const Leg& leg : legs) {
          absl::StrAppend(&content, "|", leg.from, ">", leg.to, ":", leg.amount);
        }
        for (size_t i = 0; i < legs.size(); ++i) {
          // A plain INSERT: under the lock a key can only exist if the
          // recheck is wrong, and then the transaction must fail loudly.
          txn.exec_params(
              "INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, "
              "from_account_id, to_account_id, amount_micros, kind, tenant_id, instance_id, "
              "usage_minute, gpu_model, at) VALUES ($1, $2, md5($3), $4, $5, $6, "
              "'adjustment', $7, $8, $9, nullif($10, ''), $11::timestamptz)",
              key, static_cast<int>(i), content, legs[i].from, legs[i].to, legs[i].amount,
              tenant, instance, minute,
              row["gpu_model"].is_null() ? std::string() : row["gpu_model"].as<std::string>(),
              SqlTime(now));
          postings++;
        }
        spdlog::info(
            "billing: adjusted {} minute {} tenant={}: owed {}, had {} (+{} shortfall, now {})",
            instance, minute, tenant, owed, net, shortfall, shortfall_after);
      }
    }
    txn.exec_params("UPDATE billing_recheck_cursor SET events_seen_through = "
                    "greatest(events_seen_through, $1)",
                    last_event[0][0].as<int64_t>());
    return absl::OkStatus();
  }));
  return postings;
}

}  // namespace sv::billing
