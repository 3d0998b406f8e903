#ifndef SV_BILLING_SLA_REFUNDS_H_
#define SV_BILLING_SLA_REFUNDS_H_

// SLA refunds in the ledger (docs/sla.md): double-entry transfers from the
// platform's sla_refund_expense account to the tenant, idempotent by key.

#include <cstdint>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sv::billing {

struct SlaRefund {
  std::string key;          // sla:{instance}:{hour}:{metric}
  std::string tenant_id;
  std::string instance_id;
  int64_t usage_minute = 0;  // The hour's first Unix minute (invoices place refunds by it).
  int64_t amount_micros = 0;  // > 0.
};

struct PostedRefund {
  std::string key;
  int64_t transfer_id = 0;
  bool replay = false;  // The key was already posted with the same content.
};

// Posts `refunds` in the caller's transaction, set-wise, to the tenant's
// paid wallet (prepaid) or receivable (postpaid), in the order given. A key
// already posted with the same content is a replay and returns the first
// transfer; the same key with other content is ALREADY_EXISTS /
// IDEMPOTENCY_KEY_REUSED, and an unknown tenant NOT_FOUND / UNKNOWN_TENANT:
// the caller must then abort its transaction (nothing is half-written).
absl::StatusOr<std::vector<PostedRefund>> PostSlaRefunds(pqxx::work& txn,
                                                         const std::vector<SlaRefund>& refunds,
                                                         absl::Time at);

}  // namespace sv::billing

#endif  // SV_BILLING_SLA_REFUNDS_H_
