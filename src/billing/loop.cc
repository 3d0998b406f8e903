// The billing loop: RunOnce every loop_interval, on its own thread.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "billing/billing.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"

namespace sv::billing {

struct BillingLoop::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread thread;
  const store::LeaderGate* gate = nullptr;
};

BillingLoop::BillingLoop(Billing& billing, const Clock& clock)
    : billing_(billing), clock_(clock), state_(std::make_unique<State>()) {}

BillingLoop::~BillingLoop() { Stop(); }

void BillingLoop::SetLeaderGate(const store::LeaderGate* gate) { state_->gate = gate; }

void BillingLoop::Start() {
  state_->thread = std::thread([this] {
    std::unique_lock<std::mutex> lock(state_->mutex);
    while (!state_->stopping) {
      lock.unlock();
      RunTurn();
      lock.lock();
      state_->wake.wait_for(lock, absl::ToChronoNanoseconds(billing_.options().loop_interval),
                            [this] { return state_->stopping; });
    }
  });
}

void BillingLoop::RunTurn() {
  store::LeaderTurn turn(state_->gate);
  if (!turn.ok()) return;
  auto result = billing_.RunOnce(clock_.Now());
  metrics::Registry::Default().IncrementCounter(
      "sv_billing_runs_total", "Billing loop runs, by result.",
      {{"result", result.ok() ? "ok" : "error"}});
  if (!result.ok()) {
    spdlog::warn("billing: run failed: {}", result.status().ToString());
  } else if (result->minutes_billed > 0) {
    spdlog::info("billing: billed {} minutes, {} postings, {} stops",
                 result->minutes_billed, result->postings, result->stopped_instances);
  }
}

void BillingLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace sv::billing
