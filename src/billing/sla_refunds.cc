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

// The destination and content of one refund, as PostSingle hashes content.
constexpr char kPostSql[] = R"sql(
WITH v AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])
    WITH ORDINALITY AS v(key, tenant_id, instance_id, usage_minute, amount, n)
), dest AS (
  SELECT v.*, a.id AS to_id,
         md5('sla_refund|' || v.tenant_id || '|' || $6::bigint || '|' || a.id || '|' ||
             v.amount) AS hash
  FROM v JOIN tenants t ON t.id = v.tenant_id
  JOIN ledger_accounts a ON a.tenant_id = v.tenant_id AND a.owner = '' AND a.kind =
       CASE WHEN t.billing_mode = 'postpaid' THEN 'receivable' ELSE 'paid_wallet' END
), ins AS (
  INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id,
                                to_account_id, amount_micros, kind, tenant_id, instance_id,
                                usage_minute, at)
  SELECT key, 0, hash, $6::bigint, to_id, amount, 'sla_refund', tenant_id, instance_id,
         usage_minute, $7::timestamptz
  FROM dest ORDER BY n
  ON CONFLICT (idempotency_key, leg) DO NOTHING
  RETURNING id, idempotency_key
)
SELECT d.key, coalesce(i.id, t.id), i.id IS NULL, coalesce(i.id IS NOT NULL OR
       t.content_hash = d.hash, false)
FROM dest d LEFT JOIN ins i ON i.idempotency_key = d.key
LEFT JOIN ledger_transfers t ON i.id IS NULL AND t.idempotency_key = d.key AND t.leg = 0
ORDER BY d.n
)sql";

}  // namespace

absl::StatusOr<std::vector<PostedRefund>> PostSlaRefunds(pqxx::work& txn,
                                                         const std::vector<SlaRefund>& refunds,
                                                         absl::Time at) {
  std::vector<PostedRefund> posted;
  if (refunds.empty()) return posted;
  std::vector<std::string> keys, tenants, instances;
  std::vector<int64_t> minutes, amounts;
  for (const SlaRefund& r : refunds) {
    assert(r.amount_micros > 0 && !r.key.empty());  // The judge never refunds nothing.
    keys.push_back(r.key);
    tenants.push_back(r.tenant_id);
    instances.push_back(r.instance_id);
    minutes.push_back(r.usage_minute);
    amounts.push_back(r.amount_micros);
  }
  const int64_t expense = internal::PlatformAccount(txn, "sla_refund_expense");
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
  auto rows = txn.exec_params(kPostSql, store::TextArrayLiteral(keys), store::TextArrayLiteral(tenants),
                              store::TextArrayLiteral(instances), store::IntArrayLiteral(minutes), store::IntArrayLiteral(amounts),
                              expense, store::SqlTime(at));
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
