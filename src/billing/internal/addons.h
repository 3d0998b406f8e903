#ifndef SV_BILLING_INTERNAL_ADDONS_H_
#define SV_BILLING_INTERNAL_ADDONS_H_

// App fees and storage, charged in the same metering transaction as the GPU
// rent of the same minutes (docs/billing.md, "App fees and storage").
// Private to src/billing.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pqxx/pqxx>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sv::billing::internal {

// Publisher share of an app fee, in parts per thousand: the publisher gets
// floor(fee x 700 / 1000), the platform the remainder, so the two always
// sum to the fee.
inline constexpr int64_t kPublisherSharePerMille = 700;

// Posts the app fees of the rent minutes in billing_batch (the temp table
// of the metering transaction) and the storage of every live volume-minute
// of [from_minute, to_minute), in that order after the rent, each capped at
// what the tenant's funds still hold. Idempotent: keys app:<instance>:<minute>
// and storage:<volume>:<minute>; a replay with other content is INTERNAL /
// CHARGE_CONTENT_CLASH. Returns the legs written.
absl::StatusOr<int64_t> PostAddOnCharges(pqxx::work& txn, int64_t from_minute,
                                         int64_t to_minute, absl::Time now);

// The auditor's checks of these postings: {name, sql}; the sql may use $1/$2
// (audited range as timestamps) and $3/$4 (the same as Unix minutes).
std::vector<std::pair<std::string, std::string>> AddOnAuditChecks();

}  // namespace sv::billing::internal

#endif  // SV_BILLING_INTERNAL_ADDONS_H_
