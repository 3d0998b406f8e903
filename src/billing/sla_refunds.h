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
  // The hour's rent and the part of it paid from trial credit: the refund
  // goes back in the same shares (TrialPartOfRefund).
  int64_t rent_micros = 0;
  int64_t trial_rent_micros = 0;
};

struct PostedRefund {
  std::string key;
  int64_t transfer_id = 0;
  bool replay = false;  // The key was already posted with the same content.
};

// The part of `refund_micros` that goes back to trial credit: the trial
// share of the rent it refunds, rounded down (the paid part takes the
// rest). A refund of rent the tenant paid with free credit is free credit,
// not money in the paid wallet.
int64_t TrialPartOfRefund(int64_t refund_micros, int64_t rent_micros,
                          int64_t trial_rent_micros);

// Posts `refunds` in the caller's transaction, set-wise, in the order
// given: the paid part to the tenant's paid wallet (prepaid) or receivable
// (postpaid), leg 0, and the trial part (TrialPartOfRefund) to the trial
// wallet while one of the tenant's grants is valid, else to the promotion
// expense, where its expiry took the rest of that credit (leg 1, or leg 0
// when the whole refund is trial). A key already posted with the same
// content is a replay and returns the first transfer (leg 0), as a new
// post does; the same key with other content is ALREADY_EXISTS /
// IDEMPOTENCY_KEY_REUSED, and an unknown tenant NOT_FOUND / UNKNOWN_TENANT:
// the caller must then abort its transaction (nothing is half-written).
absl::StatusOr<std::vector<PostedRefund>> PostSlaRefunds(pqxx::work& txn,
                                                         const std::vector<SlaRefund>& refunds,
                                                         absl::Time at);

}  // namespace sv::billing

#endif  // SV_BILLING_SLA_REFUNDS_H_
