#include "control/loops.h"

#include <cstdlib>
#include <cstring>

#include "metrics/metrics.h"
#include "spdlog/spdlog.h"

namespace sv::control {
namespace {

// The crash-between-decide-and-commit fault is armed only through the
// environment, so no production flag can turn it on by mistake.
SchedulingOptions WithFaults(SchedulingOptions options) {
  const char* fault = std::getenv("SV_FAULT_CRASH_AFTER_DECIDE");
  if (fault != nullptr && std::strcmp(fault, "1") == 0) {
    spdlog::warn("control: fault SV_FAULT_CRASH_AFTER_DECIDE is armed");
    options.crash_after_decide = true;
  }
  return options;
}

}  // namespace

ControlLoops::ControlLoops(store::Store& store, const Clock& clock, LoopOptions options)
    : store_(store),
      clock_(clock),
      options_(options),
      scheduling_(store.database(), WithFaults(options.scheduling)) {}

ControlLoops::~ControlLoops() { Stop(); }

void ControlLoops::Start() {
  placement_thread_ = std::thread([this] { PlacementLoop(); });
}

void ControlLoops::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (placement_thread_.joinable()) placement_thread_.join();
}

absl::Status ControlLoops::PlaceNow(bool* ran) {
  bool paced = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    paced = pacer_.LastPassLeftLongQueue();
  }
  if (paced) {
    // The last pass left a long queue: the loop runs the next one (after
    // its rest, if that has not ended), and this caller's answer is the row
    // as committed.
    if (ran != nullptr) *ran = false;
    metrics::Registry::Default().IncrementCounter(
        "sv_scheduler_paced_requests_total",
        "Requests for an immediate queue pass left to the loop because passes are paced.",
        {});
    Kick();
    return absl::OkStatus();
  }
  return RunPass(/*wait_for_lock=*/false, ran);
}

absl::Status ControlLoops::RunPass(bool wait_for_lock, bool* ran) {
  if (ran != nullptr) *ran = false;
  // A pass of this process is running: it holds the placement lock, so a
  // try would fail after a transaction; kick the loop instead, whose next
  // pass sees the caller's instance (as when the lock is busy below).
  if (!wait_for_lock && passes_in_flight_.load() > 0) {
    Kick();
    return absl::OkStatus();
  }
  passes_in_flight_.fetch_add(1);
  struct Done {
    std::atomic<int>& count;
    ~Done() { count.fetch_sub(1); }
  } done{passes_in_flight_};
  store::LeaderTurn turn(gate_);
  if (!turn.ok()) return absl::OkStatus();
  const absl::Time start = clock_.Now();
  const PassPacer::Clock::time_point steady_start = PassPacer::Clock::now();
  auto outcome = scheduling_.RunPass(start, wait_for_lock);
  if (outcome.ok() && outcome->lock_busy) {
    Kick();
    return absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pacer_.Finished(steady_start, PassPacer::Clock::now(),
                    outcome.ok() ? outcome->waiting : 0, outcome.ok() ? outcome->placed : 0);
  }
  auto& registry = metrics::Registry::Default();
  const double seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  registry.IncrementCounter("sv_scheduler_passes_total", "Queue passes run, by result.",
                            {{"result", outcome.ok() ? "ok" : "error"}});
  registry.ObserveHistogram("sv_scheduler_pass_seconds",
                            "Wall time of a queue pass (read, decide, write, commit).", {},
                            seconds, metrics::LatencyBoundsSeconds());
  if (!outcome.ok()) return outcome.status();
  if (ran != nullptr) *ran = true;
  registry.IncrementCounter("sv_scheduler_decisions_total",
                            "Queue verdicts written, by decision.", {{"decision", "placed"}},
                            outcome->placed);
  registry.IncrementCounter("sv_scheduler_decisions_total",
                            "Queue verdicts written, by decision.", {{"decision", "waiting"}},
                            outcome->waiting);
  registry.IncrementCounter("sv_scheduler_moves_total",
                            "Movable RUNNING instances moved to another node to free whole "
                            "nodes for a waiting instance.",
                            {}, outcome->moved);
  registry.SetGauge("sv_scheduler_last_pass_waiting",
                    "Instances left waiting by the last queue pass of this replica.", {},
                    outcome->waiting);
  if (outcome->placed > 0) {
    // The pass's wall time (read, decide, write, commit) is the figure an
    // operator needs when the queue or the fleet grows.
    spdlog::info("control: placed {} instance(s), moved {}; pass took {} ms", outcome->placed,
                 outcome->moved, absl::ToInt64Milliseconds(clock_.Now() - start));
  }
  return absl::OkStatus();
}

void ControlLoops::Kick() {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Only the kick that ends the loop's wait wakes it. Under load every
    // create kicks; while the loop rests or runs a pass, waking it would
    // only put it back to sleep, two context switches per create.
    wake = awaiting_kick_ && !kicked_;
    kicked_ = true;
  }
  if (wake) wake_.notify_all();
}

void ControlLoops::PlacementLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    awaiting_kick_ = true;
    wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.placement_interval),
                   [this] { return stopping_ || kicked_; });
    awaiting_kick_ = false;
    if (stopping_) break;
    // Paced: rest after a pass that left a long queue (control/pass_pacer.h).
    for (PassPacer::Clock::duration rest = pacer_.RestLeft(PassPacer::Clock::now());
         rest > PassPacer::Clock::duration::zero() && !stopping_;
         rest = pacer_.RestLeft(PassPacer::Clock::now())) {
      wake_.wait_for(lock, rest, [this] { return stopping_; });
    }
    if (stopping_) break;
    kicked_ = false;
    lock.unlock();
    absl::Status status = RunPass(/*wait_for_lock=*/true);
    if (!status.ok()) spdlog::warn("control: placement pass failed: {}", status.ToString());
    lock.lock();
  }
}

}  // namespace sv::control
