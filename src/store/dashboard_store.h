#ifndef SV_STORE_DASHBOARD_STORE_H_
#define SV_STORE_DASHBOARD_STORE_H_

// Read-only aggregates for the operator's billing dashboard (/admin). Every
// query is a plain SELECT over the ledger, the fleet and telemetry; none of
// them writes. Amounts are int64 micro-yuan; days and months are
// Asia/Shanghai, as on invoices.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::store {

struct RevenuePointRow {
  std::string period;  // YYYY-MM-DD or YYYY-MM.
  absl::Time period_start;
  int64_t charged_micros = 0;
  int64_t trial_charged_micros = 0;
  int64_t sla_refunds_micros = 0;
  int64_t sla_refunds_trial_micros = 0;  // Of which trial credit (no money).
  int64_t topups_micros = 0;
  int64_t app_fees_micros = 0;        // The platform's part of app fees.
  int64_t app_fees_trial_micros = 0;  // Of which paid from trial credit.
  int64_t storage_micros = 0;
  int64_t storage_trial_micros = 0;
  int64_t shortfall_micros = 0;  // GPU rent run but not paid, by minute of use.
  int64_t storage_shortfall_micros = 0;  // Storage kept but not paid.
  int64_t app_fee_shortfall_micros = 0;  // App fees run but not paid.
  int64_t topup_refunds_micros = 0;
  int64_t credits_micros = 0;  // Operator credits given.
};

struct SlaRefundMetricRow {
  std::string metric;
  int64_t refund_count = 0;
  int64_t amount_micros = 0;
};

struct DashboardNodeRow {
  std::string name, pod, leaf_switch, state;
  int gpu_count = 0;
  int allocated_gpu_count = 0;
  int instance_count = 0;
};

struct TenantTrialRow {
  std::string tenant_id, tenant_name;
  int grant_count = 0;
  int64_t granted_micros = 0;
  int64_t burned_micros = 0;
  int64_t expired_micros = 0;
  int64_t remaining_micros = 0;
  absl::Time first_grant, expire;
};

struct TopUpRow {
  int64_t transfer_id = 0;
  std::string tenant_id, tenant_name, payment_id;
  int64_t amount_micros = 0;
  absl::Time at;
  int64_t refunded_micros = 0;
};

struct TopUpTotals {
  int64_t count = 0;
  int64_t amount_micros = 0;
  int64_t refunded_micros = 0;  // Of those top-ups, given back so far.
};

class DashboardStore {
 public:
  explicit DashboardStore(Database& db) : db_(db) {}

  // Charges count in the period of the minute used; refunds and top-ups in
  // the period they were posted. Periods without any are left out.
  absl::StatusOr<std::vector<RevenuePointRow>> RevenueSeries(absl::Time from, absl::Time to,
                                                             bool monthly);
  absl::StatusOr<std::vector<SlaRefundMetricRow>> SlaRefundsByMetric(absl::Time from,
                                                                     absl::Time to);
  // Every node (at most nodes_max) with the GPUs reserved on it.
  absl::StatusOr<std::vector<DashboardNodeRow>> FleetNodes(int nodes_max);
  // Tenants with a trial grant, by id after `after_tenant_id`. Burned is
  // what left the trial wallet other than by expiry: granted - expired -
  // remaining (the wallet takes only grants, so this is exact).
  absl::StatusOr<std::vector<TenantTrialRow>> TenantTrials(const std::string& after_tenant_id,
                                                           int limit);
  // The same sums over every tenant.
  absl::StatusOr<TenantTrialRow> TrialTotals();
  // Newest first, ids below `before_id` (0: no bound).
  absl::StatusOr<std::vector<TopUpRow>> TopUps(absl::Time from, absl::Time to, int64_t before_id,
                                               int limit);
  absl::StatusOr<TopUpTotals> TopUpTotalsIn(absl::Time from, absl::Time to);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_DASHBOARD_STORE_H_
