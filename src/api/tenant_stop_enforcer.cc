#include "api/tenant_stop_enforcer.h"

#include "api/internal/security_util.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"

namespace sv::api {

TenantStopEnforcer::TenantStopEnforcer(store::Store& store, const Clock& clock,
                                       absl::Duration interval)
    : store_(store), clock_(clock), loop_("tenant-stops", interval, [this] {
        auto result = RunOnce(clock_.Now());
        if (!result.ok()) {
          spdlog::warn("tenant stop: pass failed: {}", result.status().ToString());
        }
      }) {}

absl::StatusOr<int> StopTenantInstances(store::Store& store, const std::string& tenant_id,
                                        const char* reason, absl::Time now) {
  store::SecurityStore security(store.database());
  int stopped = 0;
  // ActiveInstanceIds reads at most 1,000 at a time: read again while a
  // full read stopped something.
  for (bool more = true; more;) {
    SV_ASSIGN_OR_RETURN(auto ids, security.ActiveInstanceIds(tenant_id));
    more = false;
    const bool full = ids.size() >= 1000;
    for (const std::string& id : ids) {
      auto result = store.StopInstance(tenant_id, id, reason, now);
      // An instance deleted meanwhile is no longer ours to stop.
      if (!result.ok() && result.status().code() != absl::StatusCode::kFailedPrecondition &&
          result.status().code() != absl::StatusCode::kNotFound) {
        return result.status();
      }
      if (result.ok()) {
        ++stopped;
        more = full;
        spdlog::info("tenant stop: stopped {} tenant={}: {}", id, tenant_id, reason);
      }
    }
  }
  return stopped;
}

absl::StatusOr<int> TenantStopEnforcer::RunOnce(absl::Time now) {
  store::SecurityStore security(store_.database());
  int stopped = 0;
  SV_ASSIGN_OR_RETURN(auto capped,
                      security.TenantsOverSpendCap(internal::SpendCapMonthStart(now)));
  for (const std::string& tenant : capped) {
    SV_ASSIGN_OR_RETURN(int n, StopTenantInstances(store_, tenant, kSpendCapStopReason, now));
    stopped += n;
  }
  SV_ASSIGN_OR_RETURN(auto suspended, security.SuspendedTenants());
  for (const std::string& tenant : suspended) {
    SV_ASSIGN_OR_RETURN(int n, StopTenantInstances(store_, tenant, kSuspensionStopReason, now));
    stopped += n;
  }
  return stopped;
}

}  // namespace sv::api
