#ifndef SV_BILLING_INTERNAL_LEDGER_SQL_H_
#define SV_BILLING_INTERNAL_LEDGER_SQL_H_

// SQL helpers shared by the billing sources; private to src/billing.

#include <cstdint>
#include <string>

#include <pqxx/pqxx>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "billing/billing.h"
#include "store/database.h"

namespace sv::billing::internal {

// Cluster-wide advisory lock key of metering runs ("svbill").
inline constexpr int64_t kMeteringLockKey = 0x7376'6269'6c6c;

// One single-leg posting written from C++ (trial, expiry, top-up).
struct Posting {
  std::string key;
  std::string kind;
  std::string tenant_id;
  int64_t from_account_id = 0;
  int64_t to_account_id = 0;
  int64_t amount_micros = 0;
  absl::Time at;
};

// Writes the posting unless its key exists: the same content is a no-op,
// different content is ALREADY_EXISTS / IDEMPOTENCY_KEY_REUSED.
absl::Status PostSingle(pqxx::work& txn, const Posting& posting);

int64_t PlatformAccount(pqxx::work& txn, const std::string& kind);
int64_t TenantAccount(pqxx::work& txn, const std::string& tenant_id, const std::string& kind);
// What one unit of `item` (of `item_kind` in price_book) costs at `at`: its
// own price, or the fallback item '*''s; 0 if neither has one.
int64_t PriceAt(pqxx::work& txn, const std::string& item_kind, const std::string& item,
                absl::Time at);
int64_t GpuPriceAt(pqxx::work& txn, const std::string& gpu_model, absl::Time at);

// The columns ReadTransfer expects, for "SELECT <kTransferColumns> FROM
// ledger_all_transfers t JOIN ledger_accounts fa ... ta ...".
extern const char kTransferColumns[];
extern const char kTransferJoins[];
TransferRecord ReadTransfer(const pqxx::row& row, const std::string& tenant_id);
// Fills `reason` of the credits and top-up refunds among `transfers`
// (ledger_transfer_reasons): one statement, none when there are none.
void FillReasons(pqxx::work& txn, std::vector<TransferRecord>* transfers);
// The posting of ledger_transfers (not a minute charge) with key `key`.
absl::StatusOr<TransferRecord> FindTransfer(store::Database& db, const std::string& tenant_id,
                                            const std::string& key);

enum class IntervalSource {
  kEventsOnly,        // Every interval from instance_events (the auditor).
  kEventsOfRecent,    // From the events, only instances in the CTE `recent` (metering).
  kEventsOfRecheck,   // From the events, only instances in billing_recheck.
};

// CTEs ms (each Unix minute of [$3, $4)) and prices (the GPU-minute price
// book as item, price, from_us, until_us), without a leading comma.
std::string MinutePriceCtes();

// CTEs iv, ms, prices, mins, mprice, priced: every instance-minute of [$3, $4) (Unix
// minutes; $1/$2 the same range as timestamptz) in a RUNNING interval, with
// unit_price (effective at the minute's start) and gross = gpu_count x price.
std::string PricedMinutesCtes(IntervalSource source);

// Whether the instance whose id is `id_column` can still be stopped for want
// of credit (not STOPPED, DELETED or FAILED): metering and app fees stop and
// announce only those, so an instance stopped after an earlier cap is not
// stopped or announced again.
std::string InstanceStoppableSql(const std::string& id_column);

// Text of the amount of micro-yuan `micros_expr` for people, as Yuan() of
// billing.h writes it ("10.56 CNY"), in exact numeric arithmetic.
std::string YuanSql(const std::string& micros_expr);

}  // namespace sv::billing::internal

#endif  // SV_BILLING_INTERNAL_LEDGER_SQL_H_
