// App fees (split 70:30 between publisher and platform) and storage
// (per GiB-hour), charged per minute in the metering transaction.
#include "billing/internal/addons.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"
#include "store/database.h"

namespace sv::billing::internal {
namespace {

using store::SqlTime;

// The fee of one minute of an hourly price: the hour's price spread over
// its 60 minutes by cumulative flooring, so any whole clock hour sums to the
// price exactly and no minute is ever rounded twice.
std::string MinuteFee(const std::string& per_hour, const std::string& minute) {
  return absl::StrCat("((", per_hour, ") * ((", minute, ") % 60 + 1)) / 60 - ((", per_hour,
                      ") * ((", minute, ") % 60)) / 60");
}

// Each live volume-minute of [lo, hi) with its per-hour price and fee.
std::string StorageMinutesSql(const std::string& lo, const std::string& hi) {
  return absl::StrCat(R"sql(
  SELECT vm.volume_id, vm.tenant_id, vm.minute, )sql",
                      MinuteFee("vm.size_gib * coalesce(pr.price, 0)", "vm.minute"),
                      R"sql( AS fee
  FROM (SELECT v.id AS volume_id, v.tenant_id, v.size_gib, v.kind, m AS minute
        FROM volumes v,
             generate_series(greatest()sql", lo,
                      R"sql(::bigint, floor(extract(epoch from v.created_at) / 60)::bigint),
                             least()sql", hi,
                      R"sql(::bigint, coalesce(ceil(extract(epoch from v.deleted_at) / 60)::bigint,
                                                  )sql", hi, R"sql(::bigint)) - 1) AS m
        WHERE v.created_at < to_timestamp()sql", hi, R"sql(::bigint * 60)
          AND (v.deleted_at IS NULL OR v.deleted_at > to_timestamp()sql", lo,
                      R"sql(::bigint * 60))) vm
  LEFT JOIN LATERAL (SELECT p.unit_price_micros AS price FROM price_book p
                     WHERE p.item_kind = 'storage_gib_hour' AND p.item IN (vm.kind, '*')
                       AND p.effective_from <= to_timestamp(vm.minute * 60)
                     ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1) pr ON true
)sql");
}

// Funds left per tenant, read after the earlier postings of this
// transaction; `ids` names the tenants. Without `trial`, the trial wallet
// counts as empty.
std::string FundsCte(const std::string& ids, bool trial) {
  return absl::StrCat(R"sql(funds AS (
  SELECT t.id AS tenant_id, tw.id AS trial_id, )sql",
                      trial ? "tw.balance_micros" : "0::bigint", R"sql( AS trial_avail,
         CASE WHEN t.billing_mode = 'postpaid' THEN r.id ELSE pw.id END AS main_id,
         CASE WHEN t.billing_mode = 'postpaid'
              THEN r.balance_micros + r.credit_limit_micros
              ELSE pw.balance_micros END AS main_avail
  FROM tenants t
  JOIN ledger_accounts tw ON tw.tenant_id = t.id AND tw.kind = 'trial_wallet'
  JOIN ledger_accounts pw ON pw.tenant_id = t.id AND pw.kind = 'paid_wallet'
  JOIN ledger_accounts r ON r.tenant_id = t.id AND r.kind = 'receivable'
  WHERE t.id IN ()sql", ids, "))");
}

// Caps each fee at the funds left, oldest minute first; from_trial is the
// part paid from the trial wallet.
constexpr char kCapSql[] = R"sql(
  SELECT c.*,
         greatest(0, least(c.fee, c.trial_avail + c.main_avail - c.before))::bigint AS charged,
         greatest(0, least(c.fee, c.trial_avail - c.before))::bigint AS from_trial
  FROM (SELECT f0.*, f.trial_id, f.main_id, f.trial_avail, f.main_avail,
               (sum(f0.fee) OVER (PARTITION BY f0.tenant_id ORDER BY f0.minute, f0.id)
                 - f0.fee)::bigint AS before
        FROM fees f0 JOIN funds f USING (tenant_id)) c
)sql";

absl::Status CheckClash(pqxx::work& txn, const char* table, const std::string& key_sql,
                        const std::string& hash_sql) {
  auto clashes = txn.exec(absl::StrCat("SELECT count(*) FROM ", table, " b JOIN ledger_transfers t "
                                       "ON t.idempotency_key = ", key_sql,
                                       " WHERE t.content_hash <> ", hash_sql));
  if (clashes[0][0].as<int64_t>() > 0) {
    return Error(absl::StatusCode::kInternal, "CHARGE_CONTENT_CLASH",
                 absl::StrCat("a ", table, " posting already written differs from its "
                              "recomputation"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PostAppFees(pqxx::work& txn, int64_t platform, absl::Time now) {
  // Only minutes whose rent was paid in full carry an app fee.
  txn.exec(absl::StrCat(
      "CREATE TEMP TABLE addon_app ON COMMIT DROP AS WITH fees AS ("
      "SELECT b.instance_id AS id, b.tenant_id, b.minute, a.publisher_tenant_id, ",
      MinuteFee("a.price_per_hour_micros", "b.minute"),
      " AS fee FROM billing_batch b JOIN instance_apps a ON a.instance_id = b.instance_id "
      "WHERE b.first_cap IS NULL OR b.minute < b.first_cap), ",
      // Trial credit pays rent and storage, never app fees: the publisher's
      // 70% is money it can be paid out, and trial credit is the platform's
      // promotion, not the buyer's money (docs/marketplace.md).
      FundsCte("SELECT DISTINCT tenant_id FROM fees", false), ", capped AS (", kCapSql,
      " WHERE c.fee > 0) "
      "SELECT c.*, (c.charged * ", kPublisherSharePerMille, "::bigint) / 1000 AS publisher_part, "
      "f.first_cap, (SELECT max(minute) FROM billing_batch bb WHERE bb.instance_id = c.id) "
      "AS last_rent_minute "
      "FROM capped c LEFT JOIN (SELECT id, min(minute) AS first_cap FROM capped "
      "WHERE charged < fee GROUP BY id) f ON f.id = c.id"));
  txn.exec("INSERT INTO ledger_accounts (tenant_id, kind, owner) SELECT DISTINCT NULL::text, "
           "'publisher_payable', publisher_tenant_id FROM addon_app ON CONFLICT DO NOTHING");
  const std::string key = "'app:' || b.id || ':' || b.minute";
  const std::string hash =
      "md5(b.id || '|' || b.minute || '|' || b.fee || '|' || b.charged || '|' || "
      "b.from_trial || '|' || b.publisher_tenant_id)";
  auto written = txn.exec_params(absl::StrCat(R"sql(
    INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id,
      to_account_id, amount_micros, kind, tenant_id, instance_id, usage_minute, at)
    SELECT )sql", key, ", l.leg, ", hash, R"sql(, l.from_id, l.to_id, l.amount, 'app_fee',
           b.tenant_id, b.id, b.minute, $2::timestamptz
    FROM addon_app b
    JOIN ledger_accounts pa ON pa.tenant_id IS NULL AND pa.kind = 'publisher_payable'
                           AND pa.owner = b.publisher_tenant_id
    CROSS JOIN LATERAL (
      SELECT least(b.from_trial, b.publisher_part) AS tp) s
    CROSS JOIN LATERAL (VALUES
      (0, b.trial_id, pa.id, s.tp),
      (1, b.main_id, pa.id, b.publisher_part - s.tp),
      (2, b.trial_id, $1::bigint, b.from_trial - s.tp),
      (3, b.main_id, $1::bigint, b.charged - b.publisher_part - (b.from_trial - s.tp)))
      AS l (leg, from_id, to_id, amount)
    WHERE l.amount > 0 AND (b.first_cap IS NULL OR b.minute <= b.first_cap)
    ON CONFLICT (idempotency_key, leg) DO NOTHING)sql"),
                                 platform, SqlTime(now));
  SV_RETURN_IF_ERROR(CheckClash(txn, "addon_app", key, hash));
  // From the first minute the buyer could not pay: record what was not
  // collected and stop the instance (now; stop_at records the end of the
  // rent already charged).
  txn.exec_params(
      "INSERT INTO app_fee_shortfalls (instance_id, usage_minute, tenant_id, fee_micros, "
      "charged_micros, at) SELECT id, minute, tenant_id, fee, "
      "CASE WHEN minute = first_cap THEN charged ELSE 0 END, $1::timestamptz "
      "FROM addon_app WHERE minute >= first_cap ON CONFLICT DO NOTHING",
      SqlTime(now));
  const std::string not_stopped = " AND " + InstanceStoppableSql("addon_app.id");
  txn.exec("INSERT INTO billing_stops (instance_id, tenant_id, stop_at) "
           "SELECT id, tenant_id, to_timestamp((last_rent_minute + 1) * 60) FROM addon_app "
           "WHERE minute = first_cap" + not_stopped + " ON CONFLICT DO NOTHING");
  txn.exec_params(
      "INSERT INTO billing_notices (tenant_id, kind, instance_id, message, at) "
      "SELECT tenant_id, 'credit_exhausted', id, 'credit ran out for the app fee in minute ' "
      "|| to_char(to_timestamp(minute * 60) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') "
      "|| ' UTC; instance ' || id || ' is stopped', $1::timestamptz FROM addon_app "
      "WHERE minute = first_cap" + not_stopped,
      SqlTime(now));
  return static_cast<int64_t>(written.affected_rows());
}

absl::StatusOr<int64_t> PostStorage(pqxx::work& txn, int64_t platform, int64_t from_minute,
                                    int64_t to_minute, absl::Time now,
                                    int64_t grace_minutes) {
  txn.exec_params(absl::StrCat(
                      "CREATE TEMP TABLE addon_storage ON COMMIT DROP AS WITH fees AS ("
                      "SELECT s.volume_id AS id, s.tenant_id, s.minute, s.fee FROM (",
                      StorageMinutesSql("$1", "$2"), ") s WHERE s.fee > 0), ",
                      FundsCte("SELECT DISTINCT tenant_id FROM fees", true), " ", kCapSql),
                  from_minute, to_minute);
  const std::string key = "'storage:' || b.id || ':' || b.minute";
  const std::string hash =
      "md5(b.id || '|' || b.minute || '|' || b.fee || '|' || b.charged || '|' || b.from_trial)";
  auto written = txn.exec_params(absl::StrCat(R"sql(
    INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id,
      to_account_id, amount_micros, kind, tenant_id, usage_minute, at)
    SELECT )sql", key, ", l.leg, ", hash, R"sql(, l.from_id, $1::bigint, l.amount, 'storage',
           b.tenant_id, b.minute, $2::timestamptz
    FROM addon_storage b
    CROSS JOIN LATERAL (VALUES (0, b.trial_id, b.from_trial),
                               (1, b.main_id, b.charged - b.from_trial)) AS l (leg, from_id, amount)
    WHERE l.amount > 0
    ON CONFLICT (idempotency_key, leg) DO NOTHING)sql"),
                                 platform, SqlTime(now));
  SV_RETURN_IF_ERROR(CheckClash(txn, "addon_storage", key, hash));
  // One notice when a tenant's storage goes unpaid: in the first minute of
  // this batch with a shortfall after a minute without any (of any of its
  // volumes). Unpaid storage stops nothing at once, so this is how the
  // tenant learns of it. It names the volumes unpaid in this batch, and
  // when they are deleted if they stay unpaid (Billing::DeleteUnpaidVolumes).
  const std::string deadline =
      grace_minutes <= 0
          ? "'; top up'"
          : absl::StrCat("'; top up, or they are deleted at ' || to_char(to_timestamp("
                         "(min(u.minute) + ", grace_minutes, "::bigint) * 60) AT TIME ZONE "
                         "'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC, when they have been unpaid "
                         "for ", GraceText(grace_minutes), "'");
  txn.exec_params(
      "INSERT INTO billing_notices (tenant_id, kind, message, at) "
      "SELECT u.tenant_id, 'credit_exhausted', 'credit ran out for storage in minute ' "
      "|| to_char(to_timestamp(min(u.minute) * 60) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') "
      "|| ' UTC; volumes ' || (SELECT string_agg(DISTINCT a.id, ', ') FROM addon_storage a "
      "  WHERE a.tenant_id = u.tenant_id AND a.charged < a.fee) "
      "|| ' are kept but not paid for' || " + deadline + ", $1::timestamptz "
      "FROM (SELECT DISTINCT b.tenant_id, b.minute FROM addon_storage b "
      "      WHERE b.charged < b.fee) u "
      "WHERE NOT EXISTS (SELECT 1 FROM addon_storage p WHERE p.tenant_id = u.tenant_id "
      "  AND p.minute = u.minute - 1 AND p.charged < p.fee) "
      "AND NOT EXISTS (SELECT 1 FROM volumes v JOIN storage_shortfalls s ON s.volume_id = v.id "
      "  WHERE v.tenant_id = u.tenant_id AND s.usage_minute = u.minute - 1) "
      "GROUP BY u.tenant_id",
      SqlTime(now));
  txn.exec_params(
      "INSERT INTO storage_shortfalls (volume_id, usage_minute, tenant_id, fee_micros, "
      "charged_micros, at) SELECT id, minute, tenant_id, fee, charged, $1::timestamptz "
      "FROM addon_storage WHERE charged < fee ON CONFLICT DO NOTHING",
      SqlTime(now));
  // Each volume's current run of unpaid minutes (migration 0102): from the
  // first unpaid minute after the batch's last paid one; none when the
  // batch ends paid; still the earlier start when no minute was paid.
  txn.exec(R"sql(
    UPDATE volumes v SET unpaid_since_minute = x.since
    FROM (SELECT p.id, CASE
                 WHEN min(b.minute) FILTER (WHERE b.charged < b.fee
                   AND b.minute > coalesce(p.last_paid, -1)) IS NULL THEN NULL
                 WHEN p.last_paid IS NULL THEN coalesce(w.unpaid_since_minute, min(b.minute))
                 ELSE min(b.minute) FILTER (WHERE b.charged < b.fee AND b.minute > p.last_paid)
                 END AS since
          FROM (SELECT id, max(minute) FILTER (WHERE charged >= fee) AS last_paid
                FROM addon_storage GROUP BY id) p
          JOIN addon_storage b ON b.id = p.id
          JOIN volumes w ON w.id = p.id
          GROUP BY p.id, p.last_paid, w.unpaid_since_minute) x
    WHERE v.id = x.id AND v.unpaid_since_minute IS DISTINCT FROM x.since)sql");
  return static_cast<int64_t>(written.affected_rows());
}

}  // namespace

// "7 days", "90 minutes": the grace period in a notice.
std::string GraceText(int64_t minutes) {
  if (minutes % 1440 == 0) return absl::StrCat(minutes / 1440, minutes == 1440 ? " day" : " days");
  if (minutes % 60 == 0) return absl::StrCat(minutes / 60, minutes == 60 ? " hour" : " hours");
  return absl::StrCat(minutes, minutes == 1 ? " minute" : " minutes");
}

std::string VolumesLiveSql(const std::string& lo, const std::string& hi) {
  return absl::StrCat("EXISTS (SELECT 1 FROM volumes v WHERE v.created_at < to_timestamp(", hi,
                      " * 60) AND (v.deleted_at IS NULL OR v.deleted_at > to_timestamp(", lo,
                      " * 60)))");
}

absl::StatusOr<AddOnsPosted> PostAddOnCharges(pqxx::work& txn, int64_t from_minute,
                                              int64_t to_minute, absl::Time now,
                                              const AddOnBatch& batch) {
  // Most batches have neither app instances nor volumes; the statements
  // that would find nothing are skipped.
  int64_t app_legs = 0, storage_legs = 0;
  if (batch.app_rent_rows) {
    SV_ASSIGN_OR_RETURN(app_legs, PostAppFees(txn, batch.platform_account, now));
  }
  if (batch.volumes_live) {
    SV_ASSIGN_OR_RETURN(storage_legs,
                        PostStorage(txn, batch.platform_account, from_minute, to_minute, now,
                                    batch.unpaid_storage_grace_minutes));
  }
  AddOnsPosted posted;
  posted.legs = app_legs + storage_legs;
  if (to_minute - from_minute <= 1 || (!batch.app_rent_rows && !batch.volumes_live)) {
    return posted;
  }
  // Several minutes at once (catching up) charge all their rent, then all
  // app fees, then all storage. Where a tenant's funds ran out inside the
  // batch that order differs from the minute-by-minute one: storage of
  // minute m unpaid while rent of minute m+5 took the money. Found from
  // the tenant's first unpaid add-on minute and any rent (or app fee) of
  // it charged for a later minute of the batch.
  std::vector<std::string> firsts;
  if (batch.app_rent_rows) {
    firsts.push_back("SELECT tenant_id, min(minute) AS m FROM addon_app "
                     "WHERE first_cap IS NOT NULL AND minute >= first_cap GROUP BY tenant_id");
  }
  if (batch.volumes_live) {
    firsts.push_back("SELECT tenant_id, min(minute) AS m FROM addon_storage "
                     "WHERE charged < fee GROUP BY tenant_id");
  }
  const std::string later_app_fee =
      batch.app_rent_rows
          ? " OR EXISTS (SELECT 1 FROM addon_app a WHERE a.tenant_id = s.tenant_id "
            "AND a.minute > s.m AND a.charged > 0)"
          : "";
  auto found = txn.exec_params(
      absl::StrCat("SELECT EXISTS (SELECT 1 FROM (", absl::StrJoin(firsts, " UNION ALL "),
                   ") s JOIN tenants t ON t.id = s.tenant_id "
                   "WHERE EXISTS (SELECT 1 FROM ledger_charges c WHERE c.tenant_no = "
                   "t.billing_no AND c.minute > s.m AND c.minute < $1::bigint)",
                   later_app_fee, ")"),
      to_minute);
  posted.out_of_order = found[0][0].as<bool>();
  return posted;
}

std::vector<std::pair<std::string, std::string>> AddOnAuditChecks() {
  // The auditor binds all four parameters; name them once.
  const std::string bounds =
      "bounds AS (SELECT $1::timestamptz AS from_time, $2::timestamptz AS to_time, "
      "$3::bigint AS lo, $4::bigint AS hi)";
  return {
      {"app fees split 70:30",
       absl::StrCat(
           "SELECT t.idempotency_key || ': publisher got ' || coalesce(sum(t.amount_micros) "
           "FILTER (WHERE a.kind = 'publisher_payable'), 0) || ' of ' || sum(t.amount_micros) "
           "FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.to_account_id "
           "WHERE t.kind = 'app_fee' GROUP BY t.idempotency_key "
           "HAVING coalesce(sum(t.amount_micros) FILTER (WHERE a.kind = 'publisher_payable'), 0) "
           "<> (sum(t.amount_micros)::bigint * ",
           kPublisherSharePerMille, ") / 1000 "
           "OR count(*) FILTER (WHERE a.kind NOT IN ('publisher_payable', "
           "'platform_revenue')) > 0")},
      // A minute carries a fee when metering charged its rent in full: read
      // from the charge row, which never changes. Whether a shortfall row
      // exists is not that: a late-event correction adds one (a late
      // resize up nobody could pay) or removes one (a capped minute found
      // owed no more than was paid), and the check then reported a fee
      // for ever.
      {"app fees match paid rent minutes",
       absl::StrCat(
           "WITH ", bounds, ", owed AS (SELECT i.id AS instance_id, c.minute, ",
           MinuteFee("a.price_per_hour_micros", "c.minute"),
           " AS fee FROM ledger_charges c JOIN instances i ON i.billing_no = c.instance_no "
           "JOIN instance_apps a ON a.instance_id = i.id "
           "WHERE c.minute >= (SELECT lo FROM bounds) AND c.minute < (SELECT hi FROM bounds) "
           "AND c.trial_micros + c.main_micros = c.gpu_count * c.unit_price), "
           "paid AS (SELECT instance_id, usage_minute AS minute, sum(amount_micros)::bigint "
           "AS amount FROM ledger_transfers WHERE kind = 'app_fee' GROUP BY 1, 2) "
           "SELECT 'instance ' || coalesce(o.instance_id, p.instance_id) || ' minute ' || "
           "coalesce(o.minute, p.minute) || ': app fee owed ' || coalesce(o.fee, 0) || "
           "', charged ' || coalesce(p.amount, 0) || ', shortfall ' || "
           "coalesce(s.fee_micros - s.charged_micros, 0) "
           "FROM (SELECT * FROM owed WHERE fee > 0) o FULL JOIN paid p "
           "ON p.instance_id = o.instance_id AND p.minute = o.minute "
           "LEFT JOIN app_fee_shortfalls s ON s.instance_id = coalesce(o.instance_id, "
           "p.instance_id) AND s.usage_minute = coalesce(o.minute, p.minute) "
           "WHERE coalesce(o.fee, 0) <> coalesce(p.amount, 0) + "
           "coalesce(s.fee_micros - s.charged_micros, 0)")},
      {"storage matches volume lifetimes",
       absl::StrCat(
           "WITH ", bounds, ", owed AS (SELECT volume_id, minute, fee FROM (",
           StorageMinutesSql("(SELECT lo FROM bounds)", "(SELECT hi FROM bounds)"),
           ") s WHERE fee > 0), paid AS (SELECT split_part(idempotency_key, ':', 2) AS "
           "volume_id, usage_minute AS minute, sum(amount_micros)::bigint AS amount "
           "FROM ledger_transfers WHERE kind = 'storage' GROUP BY 1, 2) "
           "SELECT 'volume ' || coalesce(o.volume_id, p.volume_id) || ' minute ' || "
           "coalesce(o.minute, p.minute) || ': owed ' || coalesce(o.fee, 0) || ', charged ' || "
           "coalesce(p.amount, 0) FROM owed o FULL JOIN paid p ON p.volume_id = o.volume_id "
           "AND p.minute = o.minute LEFT JOIN storage_shortfalls s ON s.volume_id = "
           "coalesce(o.volume_id, p.volume_id) AND s.usage_minute = coalesce(o.minute, p.minute) "
           "WHERE coalesce(o.fee, 0) <> coalesce(p.amount, 0) + "
           "coalesce(s.fee_micros - s.charged_micros, 0)")},
      {"no publisher payable negative",
       "SELECT 'payable of ' || owner || ' is ' || balance_micros FROM ledger_accounts "
       "WHERE kind = 'publisher_payable' AND balance_micros < 0"},
      {"payouts match their records",
       "SELECT 'payout ' || p.reference || ' of ' || p.amount_micros || ' has ' || "
       "coalesce(t.amount_micros, 0) || ' in the ledger' FROM publisher_payouts p "
       "LEFT JOIN ledger_transfers t ON t.idempotency_key = 'payout:' || p.reference "
       "WHERE t.amount_micros IS DISTINCT FROM p.amount_micros"},
  };
}

}  // namespace sv::billing::internal
