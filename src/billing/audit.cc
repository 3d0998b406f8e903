// The auditor: checks every ledger invariant from the raw tables.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "billing/internal/addons.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"

namespace sv::billing {
namespace {

constexpr int kFailuresPerCheckMax = 50;

struct Check {
  const char* name;
  std::string sql;  // Each row is one failure, rendered by its text columns.
};

std::vector<Check> Checks() {
  const std::string expected = absl::StrCat(
      "WITH ", internal::PricedMinutesCtes(internal::IntervalSource::kEventsOnly),
      // Charges, plus adjustments net of refunds (billing/adjustments.cc).
      ", charged AS (SELECT instance_id, usage_minute AS minute, "
      "  sum(CASE WHEN kind = 'charge' OR to_account_id = (SELECT id FROM ledger_accounts "
      "    WHERE tenant_id IS NULL AND kind = 'platform_revenue' AND owner = '') "
      "    THEN amount_micros ELSE -amount_micros END)::bigint AS amount "
      "  FROM ledger_all_transfers WHERE kind IN ('charge', 'adjustment') "
      "  GROUP BY 1, 2), "
      "owed AS (SELECT p.instance_id, p.minute, p.gross FROM priced p WHERE p.gross > 0) ");
  std::vector<Check> checks = {
      {"ledger sums to zero",
       "SELECT 'sum of all balances is ' || sum(balance_micros) FROM ledger_accounts "
       "HAVING sum(balance_micros) <> 0"},
      {"balance equals its transfers",
       "SELECT 'account ' || a.id || ' (' || a.kind || ' ' || coalesce(a.tenant_id, 'platform') "
       "|| ') balance ' || a.balance_micros || ' but transfers sum to ' || coalesce(s.sum, 0) "
       "FROM ledger_accounts a LEFT JOIN (SELECT account_id, sum(delta) AS sum FROM ("
       "  SELECT to_account_id AS account_id, amount_micros AS delta FROM ledger_transfers "
       "  UNION ALL SELECT from_account_id, -amount_micros FROM ledger_transfers "
       // Minute charges (migration 0030): the trial and main parts, and
       // their sum to the revenue account.
       "  UNION ALL SELECT trial_account, -trial_micros FROM ledger_charges "
       "    WHERE trial_micros > 0 "
       "  UNION ALL SELECT main_account, -main_micros FROM ledger_charges WHERE main_micros > 0 "
       "  UNION ALL SELECT revenue_account, trial_micros + main_micros FROM ledger_charges) x "
       "  GROUP BY 1) s ON s.account_id = a.id "
       "WHERE a.balance_micros <> coalesce(s.sum, 0)"},
      {"no prepaid wallet negative",
       "SELECT a.kind || ' of ' || a.tenant_id || ' is ' || a.balance_micros "
       "FROM ledger_accounts a WHERE a.kind IN ('paid_wallet', 'trial_wallet') "
       "AND a.balance_micros < 0"},
      // The primary key (minute, tenant number, instance number) of
      // ledger_charges is the key charge:{instance}:{minute} only if each
      // row's tenant number is its instance's tenant's (an instance never
      // changes tenant): a charge whose instance number names no instance,
      // or that names another tenant, could be a second charge of the
      // same instance-minute.
      {"each instance-minute charged at most once",
       "SELECT 'charge of instance number ' || c.instance_no || ' minute ' || c.minute "
       "|| CASE WHEN i.id IS NULL THEN ' names no instance' ELSE ' names tenant number ' "
       "|| c.tenant_no || ', not its instance''s tenant ' || i.tenant_id END "
       "FROM ledger_charges c LEFT JOIN instances i ON i.billing_no = c.instance_no "
       "LEFT JOIN tenants t ON t.id = i.tenant_id "
       "WHERE t.billing_no IS DISTINCT FROM c.tenant_no"},
      {"charges debit the instance's tenant and credit revenue",
       "SELECT 'charge:' || i.id || ':' || c.minute || ' moves money from accounts ' || "
       "coalesce(c.trial_account::text, '-') || '/' || coalesce(c.main_account::text, '-') || "
       "' to ' || c.revenue_account || ', not from the tenant ' || i.tenant_id || "
       "' to platform revenue' "
       "FROM ledger_charges c JOIN instances i ON i.billing_no = c.instance_no "
       "LEFT JOIN ledger_accounts tw ON tw.id = c.trial_account "
       "LEFT JOIN ledger_accounts mw ON mw.id = c.main_account "
       "LEFT JOIN ledger_accounts rv ON rv.id = c.revenue_account "
       "WHERE rv.kind IS DISTINCT FROM 'platform_revenue' OR rv.tenant_id IS NOT NULL "
       "OR (c.trial_account IS NOT NULL AND (tw.kind IS DISTINCT FROM 'trial_wallet' "
       "    OR tw.tenant_id IS DISTINCT FROM i.tenant_id)) "
       "OR (c.main_account IS NOT NULL AND (mw.kind NOT IN ('paid_wallet', 'receivable') "
       "    OR mw.kind IS NULL OR mw.tenant_id IS DISTINCT FROM i.tenant_id))"},
      // The row conditions of ledger_charges (CHECK ledger_charges_well_formed,
      // migration 0075, added NOT VALID over rows the older constraints
      // had checked): checked here for every row.
      {"charge rows are well formed",
       "SELECT 'charge of instance number ' || instance_no || ' minute ' || minute || ': ' "
       "|| gpu_count || ' GPUs at ' || unit_price || ', trial part ' || trial_micros "
       "|| ' from ' || coalesce(trial_account::text, '-') || ', main part ' || main_micros "
       "|| ' from ' || coalesce(main_account::text, '-') || ' to ' || revenue_account "
       "FROM ledger_charges WHERE NOT coalesce(gpu_count > 0 "
       "AND trial_micros >= 0 AND main_micros >= 0 AND trial_micros + main_micros > 0 "
       "AND trial_micros + main_micros <= gpu_count * unit_price "
       "AND (trial_micros > 0) = (trial_account IS NOT NULL) "
       "AND (main_micros > 0) = (main_account IS NOT NULL) "
       "AND revenue_account <> coalesce(trial_account, 0) "
       "AND revenue_account <> coalesce(main_account, 0), false)"},
      {"charges match RUNNING intervals",
       expected +
           "SELECT 'instance ' || coalesce(o.instance_id, c.instance_id) || ' minute ' || "
           "coalesce(o.minute, c.minute) || ': owed ' || coalesce(o.gross, 0) || ', charged ' "
           "|| coalesce(c.amount, 0) || ', shortfall ' || coalesce(s.shortfall_micros, 0) "
           "FROM owed o FULL JOIN charged c ON c.instance_id = o.instance_id "
           "AND c.minute = o.minute "
           "LEFT JOIN billing_shortfalls s ON s.instance_id = coalesce(o.instance_id, "
           "c.instance_id) AND s.usage_minute = coalesce(o.minute, c.minute) "
           "WHERE coalesce(o.gross, 0) <> coalesce(c.amount, 0) + "
           "coalesce(s.shortfall_micros, 0) "
           "AND NOT (o.instance_id IS NULL AND c.instance_id IS NULL)"},
      // Operator credits and refunds of top-ups (billing/credits.cc).
      {"credits come from credit_expense to their tenant, with a reason",
       "SELECT t.idempotency_key || ' moves ' || t.amount_micros || ' from ' || fa.kind || "
       "' to ' || ta.kind || ' of ' || coalesce(ta.tenant_id, 'the platform') || "
       "CASE WHEN r.reason IS NULL THEN ' and has no reason' ELSE '' END "
       "FROM ledger_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id "
       "JOIN ledger_accounts ta ON ta.id = t.to_account_id "
       "LEFT JOIN ledger_transfer_reasons r ON r.idempotency_key = t.idempotency_key "
       "WHERE t.kind = 'credit' AND (fa.kind <> 'credit_expense' OR fa.tenant_id IS NOT NULL "
       "OR ta.kind NOT IN ('paid_wallet', 'receivable') "
       "OR ta.tenant_id IS DISTINCT FROM t.tenant_id OR r.reason IS NULL)"},
      {"top-up refunds give back at most their top-up, to payment_clearing",
       "SELECT t.idempotency_key || ' moves ' || t.amount_micros || ' from ' || fa.kind || "
       "' of ' || coalesce(fa.tenant_id, 'the platform') || ' to ' || ta.kind || "
       "CASE WHEN p.amount_micros IS NULL THEN '; the tenant has no such top-up' "
       "ELSE '; the top-up was ' || p.amount_micros END "
       "FROM ledger_transfers t JOIN ledger_accounts fa ON fa.id = t.from_account_id "
       "JOIN ledger_accounts ta ON ta.id = t.to_account_id "
       "LEFT JOIN ledger_transfers p ON p.kind = 'topup' AND p.leg = 0 "
       "AND p.tenant_id = t.tenant_id "
       "AND p.idempotency_key = 'topup:' || substr(t.idempotency_key, 14) "
       "LEFT JOIN ledger_transfer_reasons r ON r.idempotency_key = t.idempotency_key "
       "WHERE t.kind = 'topup_refund' AND (ta.kind <> 'payment_clearing' "
       "OR fa.kind NOT IN ('paid_wallet', 'receivable') "
       "OR fa.tenant_id IS DISTINCT FROM t.tenant_id OR p.amount_micros IS NULL "
       "OR t.amount_micros > p.amount_micros OR r.reason IS NULL)"},
  };
  // App fees, storage and payouts (billing/addons.cc).
  static const auto* const kAddOns =
      new std::vector<std::pair<std::string, std::string>>(internal::AddOnAuditChecks());
  for (const auto& [name, sql] : *kAddOns) checks.push_back({name.c_str(), sql});
  return checks;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> Billing::Audit() {
  std::vector<std::string> failures;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    failures.clear();
    // One snapshot for every check, so a concurrent metering run cannot make
    // the checks disagree with each other.
    txn.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");
    auto cursor = txn.exec(
        "SELECT coalesce(first_minute, 0), coalesce(billed_before_minute, 0) "
        "FROM billing_cursor");
    const int64_t first = cursor[0][0].as<int64_t>();
    const int64_t before = cursor[0][1].as<int64_t>();
    for (const Check& check : Checks()) {
      std::string sql = check.sql + " LIMIT " + std::to_string(kFailuresPerCheckMax);
      pqxx::result rows = check.sql.find("$1") == std::string::npos
                              ? txn.exec(sql)
                              : txn.exec_params(sql, store::SqlTime(MinuteStart(first)),
                                                store::SqlTime(MinuteStart(before)), first,
                                                before);
      for (const auto& row : rows) {
        failures.push_back(absl::StrCat(check.name, ": ", row[0].as<std::string>()));
      }
    }
    return absl::OkStatus();
  }));
  return failures;
}

int RunAuditCommand(const std::string& database_url) {
  store::DatabaseOptions options;
  options.url = database_url;
  options.connections_max = 2;
  options.statement_timeout = absl::Minutes(10);
  store::Database db(options);
  store::Store store(db);
  RealClock clock;
  Billing billing(db, store, clock, {});
  auto failures = billing.Audit();
  if (!failures.ok()) {
    std::cerr << "svd audit: cannot audit: " << failures.status().ToString() << "\n";
    return 2;
  }
  for (const auto& line : *failures) std::cout << "FAIL " << line << "\n";
  if (failures->empty()) {
    std::cout << "ok: ledger sums to zero, balances match transfers, no wallet negative, "
                 "no minute charged twice, charge rows well formed, "
                 "charges match RUNNING intervals\n";
    return 0;
  }
  return 1;
}

}  // namespace sv::billing
