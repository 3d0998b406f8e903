#ifndef SV_API_TENANT_STOP_ENFORCER_H_
#define SV_API_TENANT_STOP_ENFORCER_H_

// Stops the instances of tenants that may not run any: those whose charges
// this month reached their optional monthly spend cap (tenant_budgets), and
// those an operator suspended (tenant_suspensions). Creates are refused in
// the create's transaction (SPEND_CAP_REACHED, TENANT_SUSPENDED); this loop
// ends what already runs. It reads the ledger the billing loop writes, so a
// cap takes effect within one billing run plus one interval; SuspendTenant
// stops the tenant's instances itself, and the loop catches any that a
// crash left running. Leader-only, idempotent: stopping a stopped instance
// is a no-op. See docs/security.md.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "store/database.h"
#include "store/leader_loop.h"
#include "store/store.h"

namespace sv::api {

inline constexpr char kSpendCapStopReason[] = "monthly spend cap reached";
inline constexpr char kSuspensionStopReason[] = "tenant suspended by the operator";

// Stops every instance of the tenant that holds or waits for GPUs, with
// `reason`: the number stopped. An instance deleted or stopped meanwhile is
// skipped.
absl::StatusOr<int> StopTenantInstances(store::Store& store, const std::string& tenant_id,
                                        const char* reason, absl::Time now);

class TenantStopEnforcer {
 public:
  TenantStopEnforcer(store::Store& store, const Clock& clock, absl::Duration interval);

  void SetLeaderGate(const store::LeaderGate* gate) { loop_.SetLeaderGate(gate); }
  void Start() { loop_.Start(); }
  void Stop() { loop_.Stop(); }
  // One pass: the number of instances stopped.
  absl::StatusOr<int> RunOnce(absl::Time now);

 private:
  store::Store& store_;
  const Clock& clock_;
  store::LeaderLoop loop_;
};

}  // namespace sv::api

#endif  // SV_API_TENANT_STOP_ENFORCER_H_
