#include "api/spend_cap_enforcer.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "api/internal/security_util.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"

namespace sv::api {

constexpr char kStopReason[] = "monthly spend cap reached";

struct SpendCapEnforcer::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread thread;
  const store::LeaderGate* gate = nullptr;
};

SpendCapEnforcer::SpendCapEnforcer(store::Store& store, const Clock& clock,
                                   absl::Duration interval)
    : store_(store), clock_(clock), interval_(interval), state_(std::make_unique<State>()) {}

SpendCapEnforcer::~SpendCapEnforcer() { Stop(); }

void SpendCapEnforcer::SetLeaderGate(const store::LeaderGate* gate) { state_->gate = gate; }

absl::StatusOr<int> SpendCapEnforcer::RunOnce(absl::Time now) {
  store::SecurityStore security(store_.database());
  SV_ASSIGN_OR_RETURN(auto tenants,
                      security.TenantsOverSpendCap(internal::SpendCapMonthStart(now)));
  int stopped = 0;
  for (const std::string& tenant : tenants) {
    SV_ASSIGN_OR_RETURN(auto ids, security.ActiveInstanceIds(tenant));
    for (const std::string& id : ids) {
      auto result = store_.StopInstance(tenant, id, kStopReason, now);
      // An instance deleted meanwhile is no longer ours to stop.
      if (!result.ok() && result.status().code() != absl::StatusCode::kFailedPrecondition &&
          result.status().code() != absl::StatusCode::kNotFound) {
        return result.status();
      }
      if (result.ok()) {
        ++stopped;
        spdlog::info("budget: stopped {} tenant={}: {}", id, tenant, kStopReason);
      }
    }
  }
  return stopped;
}

void SpendCapEnforcer::Start() {
  state_->thread = std::thread([this] {
    std::unique_lock<std::mutex> lock(state_->mutex);
    while (!state_->stopping) {
      lock.unlock();
      {
        store::LeaderTurn turn(state_->gate);
        if (turn.ok()) {
          auto result = RunOnce(clock_.Now());
          if (!result.ok()) spdlog::warn("budget: pass failed: {}", result.status().ToString());
        }
      }
      lock.lock();
      state_->wake.wait_for(lock, absl::ToChronoNanoseconds(interval_),
                            [this] { return state_->stopping; });
    }
  });
}

void SpendCapEnforcer::Stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace sv::api
