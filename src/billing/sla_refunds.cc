#include "billing/sla_refunds.h"

#include <cassert>
#include <map>

#include "absl/strings/str_cat.h"
#include "billing/internal/ledger_sql.h"
#include "common/status.h"
#include "store/database.h"
#include "store/sql_arrays.h"

namespace sv::billing {
namespace {

// The destinations and content of one refund (PostSingle hashes content
// the same way; the trial part, added later, is hashed only when there is
// one, so refunds posted before it keep their hash). $6 is each refund's
// trial part, $7 the SLA refund expense, $8 the promotion expense.
constexpr char kPostSql[] = R"sql(
WITH v AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
                       $6::bigint[])
    WITH ORDINALITY AS v(key, tenant_id, instance_id, usage_minute, amount, trial, n)
), dest AS (
  SELECT v.*, a.id AS to_id,
         CASE WHEN EXISTS (SELECT 1 FROM trial_grants g WHERE g.tenant_id = v.tenant_id
                           AND NOT g.expired AND g.amount_micros > 0)
              THEN tw.id ELSE $8::bigint END AS trial_to,
         md5('sla_refund|' || v.tenant_id || '|' || $7::bigint || '|' || a.id || '|' ||
             v.amount || CASE WHEN v.trial > 0 THEN '|trial|' || v.trial ELSE '' END) AS hash
  FROM v JOIN tenants t ON t.id = v.tenant_id
  JOIN ledger_accounts a ON a.tenant_id = v.tenant_id AND a.owner = '' AND a.kind =
       CASE WHEN t.billing_mode = 'postpaid' THEN 'receivable' ELSE 'paid_wallet' END
  JOIN ledger_accounts tw ON tw.tenant_id = v.tenant_id AND tw.owner = ''
       AND tw.kind = 'trial_wallet'
), legs AS (
  SELECT d.*, l.leg, l.leg_to, l.leg_amount
  FROM dest d CROSS JOIN LATERAL (VALUES
    (0, d.to_id, d.amount - d.trial),
    (CASE WHEN d.amount > d.trial THEN 1 ELSE 0 END, d.trial_to, d.trial))
    AS l (leg, leg_to, leg_amount)
  WHERE l.leg_amount > 0
), ins AS (
  INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id,
                                to_account_id, amount_micros, kind, tenant_id, instance_id,
                                usage_minute, at)
  SELECT key, leg, hash, $7::bigint, leg_to, leg_amount, 'sla_refund', tenant_id,
         instance_id, usage_minute, $9::timestamptz
  FROM legs ORDER BY n, leg
  ON CONFLICT (idempotency_key, leg) DO NOTHING
  RETURNING id, idempotency_key, leg
)
SELECT d.key, coalesce(i.id, t.id), i.id IS NULL, coalesce(i.id IS NOT NULL OR
       t.content_hash = d.hash, false)
FROM dest d LEFT JOIN ins i ON i.idempotency_key = d.key AND i.leg = 0
LEFT JOIN ledger_transfers t ON i.id IS NULL AND t.idempotency_key = d.key AND t.leg = 0
ORDER BY d.n
)sql";

}  // namespace

int64_t TrialPartOfRefund(int64_t refund_micros, int64_t rent_micros,
                          int64_t trial_rent_micros) {
  if (refund_micros <= 0 || rent_micros <= 0 || trial_rent_micros <= 0) return 0;
  if (trial_rent_micros >= rent_micros) return refund_micros;
  // Exact: refund and rent are far below 2^63, their product is not.
  return static_cast<int64_t>(static_cast<__int128>(refund_micros) * trial_rent_micros /
                              rent_micros);
}

absl::StatusOr<std::vector<PostedRefund>> PostSlaRefunds(pqxx::work& txn,
                                                         const std::vector<SlaRefund>& refunds,
                                                         absl::Time at) {
  std::vector<PostedRefund> posted;
  if (refunds.empty()) return posted;
  std::vector<std::string> keys, tenants, instances;
  std::vector<int64_t> minutes, amounts, trials;
  for (const SlaRefund& r : refunds) {
    assert(r.amount_micros > 0 && !r.key.empty());  // The judge never refunds nothing.
    keys.push_back(r.key);
    tenants.push_back(r.tenant_id);
    instances.push_back(r.instance_id);
    minutes.push_back(r.usage_minute);
    amounts.push_back(r.amount_micros);
    trials.push_back(TrialPartOfRefund(r.amount_micros, r.rent_micros, r.trial_rent_micros));
  }
  const int64_t expense = internal::PlatformAccount(txn, "sla_refund_expense");
  const int64_t promotion = internal::PlatformAccount(txn, "promotion_expense");
  // Each refund goes to the account its tenant's mode charges. A key-share
  // lock on the tenants, taken before the statement that reads the mode,
  // waits for a mode switch in progress, so the refund follows the balance
  // the switch moves (locking inside that statement would not: a row
  // re-checked after the wait keeps the account it first joined). The
  // order is the create batches' (sv_create_instances), so the two never
  // wait on each other in a cycle.
  txn.exec_params(
      "SELECT 1 FROM tenants WHERE id = ANY ($1::text[]) ORDER BY id COLLATE \"C\" "
      "FOR KEY SHARE",
      store::TextArrayLiteral(tenants));
  // The trial part goes to the trial wallet while the tenant's grant is
  // unexpired. A share lock on the grants waits for an expiry in progress
  // (ExpireTrials holds them FOR UPDATE while it empties the wallet), so
  // the statement below sees it: read unlocked, the grant looked valid and
  // the part landed in a wallet just emptied, where it never expired.
  txn.exec_params(
      "SELECT 1 FROM trial_grants WHERE tenant_id = ANY ($1::text[]) AND NOT expired "
      "ORDER BY user_id FOR SHARE",
      store::TextArrayLiteral(tenants));
  auto rows = txn.exec_params(kPostSql, store::TextArrayLiteral(keys), store::TextArrayLiteral(tenants),
                              store::TextArrayLiteral(instances), store::IntArrayLiteral(minutes),
                              store::IntArrayLiteral(amounts), store::IntArrayLiteral(trials),
                              expense, promotion, store::SqlTime(at));
  if (rows.size() != refunds.size()) {
    return Error(absl::StatusCode::kNotFound, "UNKNOWN_TENANT",
                 "an SLA refund names a tenant that does not exist");
  }
  for (const auto& row : rows) {
    if (!row[3].as<bool>()) {
      return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED",
                   absl::StrCat("'", row[0].as<std::string>(),
                                "' was already used for a different transfer"));
    }
    posted.push_back({row[0].as<std::string>(), row[1].as<int64_t>(), row[2].as<bool>()});
  }
  return posted;
}

}  // namespace sv::billing
