#include "control/loops.h"

#include <cstdlib>
#include <cstring>

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

absl::Status ControlLoops::PlaceNow() {
  const absl::Time start = clock_.Now();
  auto placed = scheduling_.RunPass(start);
  if (!placed.ok()) return placed.status();
  if (*placed > 0) {
    // The pass's wall time (read, decide, write, commit) is the figure an
    // operator needs when the queue or the fleet grows.
    spdlog::info("control: placed {} instance(s); pass took {} ms", *placed,
                 absl::ToInt64Milliseconds(clock_.Now() - start));
  }
  return absl::OkStatus();
}

void ControlLoops::Kick() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kicked_ = true;
  }
  wake_.notify_all();
}

void ControlLoops::PlacementLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.placement_interval),
                   [this] { return stopping_ || kicked_; });
    if (stopping_) break;
    kicked_ = false;
    lock.unlock();
    absl::Status status = PlaceNow();
    if (!status.ok()) spdlog::warn("control: placement pass failed: {}", status.ToString());
    lock.lock();
  }
}

}  // namespace sv::control
