#ifndef SV_API_SPEND_CAP_ENFORCER_H_
#define SV_API_SPEND_CAP_ENFORCER_H_

// Stops the instances of tenants whose charges this month reached their
// optional monthly spend cap (tenant_budgets). Creates are refused at the
// API (SPEND_CAP_REACHED); this loop ends what already runs. It reads the
// ledger the billing loop writes, so a cap takes effect within one billing
// run plus one interval. Leader-only, idempotent: stopping a stopped
// instance is a no-op. See docs/security.md.

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "store/database.h"
#include "store/store.h"

namespace sv::api {

class SpendCapEnforcer {
 public:
  SpendCapEnforcer(store::Store& store, const Clock& clock, absl::Duration interval);
  ~SpendCapEnforcer();
  void SetLeaderGate(const store::LeaderGate* gate);
  void Start();
  void Stop();
  // One pass: the number of instances stopped.
  absl::StatusOr<int> RunOnce(absl::Time now);

 private:
  struct State;
  store::Store& store_;
  const Clock& clock_;
  absl::Duration interval_;
  std::unique_ptr<State> state_;
};

}  // namespace sv::api

#endif  // SV_API_SPEND_CAP_ENFORCER_H_
