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

// The temporary table of a metering transaction that holds the rent
// minutes of app instances (instance_id, tenant_id, minute, first_cap), for
// their app fees. Created only when an app instance can be in the batch.
inline constexpr char kCreateAppRentTableSql[] =
    "CREATE TEMP TABLE billing_batch (instance_id text, tenant_id text, minute bigint, "
    "first_cap bigint) ON COMMIT DROP";

// A boolean SQL expression: some volume is live in [lo, hi) (Unix minutes,
// SQL expressions of type bigint), so the minutes may owe storage.
std::string VolumesLiveSql(const std::string& lo, const std::string& hi);

// "7 days", "90 minutes": a grace period in a notice.
std::string GraceText(int64_t minutes);

// What PostAddOnCharges needs to know about the batch, found by the
// metering statements themselves so that a batch without app instances or
// volumes costs no round trip here.
struct AddOnBatch {
  int64_t platform_account = 0;  // platform_revenue
  bool app_rent_rows = false;    // billing_batch has rows
  bool volumes_live = false;     // VolumesLiveSql over the batch's minutes
  // BillingOptions::unpaid_storage_grace in minutes, for the notice of
  // storage going unpaid (0: volumes are kept).
  int64_t unpaid_storage_grace_minutes = 0;
};

struct AddOnsPosted {
  int64_t legs = 0;  // ledger legs written
  // A batch of several minutes left an app fee or storage minute unpaid
  // while the same tenant's rent (or app fees) of a later minute of the
  // batch was paid: the batch charged the tenant's last funds in another
  // order than minute by minute would have. The caller rolls the batch back
  // and bills those minutes one at a time.
  bool out_of_order = false;
};

// Posts the app fees of the rent minutes in billing_batch (the temp table
// of the metering transaction) and the storage of every live volume-minute
// of [from_minute, to_minute), in that order after the rent, each capped at
// what the tenant's funds still hold. Idempotent: keys app:<instance>:<minute>
// and storage:<volume>:<minute>; a replay with other content is INTERNAL /
// CHARGE_CONTENT_CLASH.
absl::StatusOr<AddOnsPosted> PostAddOnCharges(pqxx::work& txn, int64_t from_minute,
                                              int64_t to_minute, absl::Time now,
                                              const AddOnBatch& batch);

// The auditor's checks of these postings: {name, sql}; the sql may use $1/$2
// (audited range as timestamps) and $3/$4 (the same as Unix minutes).
std::vector<std::pair<std::string, std::string>> AddOnAuditChecks();

}  // namespace sv::billing::internal

#endif  // SV_BILLING_INTERNAL_ADDONS_H_
