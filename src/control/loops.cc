#include "control/loops.h"

#include "control/placer.h"
#include "spdlog/spdlog.h"

namespace sv::control {

ControlLoops::ControlLoops(store::Store& store, const Clock& clock, LoopOptions options)
    : store_(store), clock_(clock), options_(options) {}

ControlLoops::~ControlLoops() { Stop(); }

void ControlLoops::Start() {
  placement_thread_ = std::thread([this] { PlacementLoop(); });
  if (options_.simulate_fleet) {
    fleet_thread_ = std::thread([this] { SimulatedFleetLoop(); });
  }
}

void ControlLoops::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (placement_thread_.joinable()) placement_thread_.join();
  if (fleet_thread_.joinable()) fleet_thread_.join();
}

absl::Status ControlLoops::PlaceNow() {
  auto placed = store_.RunPlacementPass(PlaceQueue, options_.placement_queue_max,
                                        clock_.Now());
  if (!placed.ok()) return placed.status();
  if (*placed > 0) spdlog::info("control: placed {} instance(s)", *placed);
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

void ControlLoops::SimulatedFleetLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.simulated_start_interval),
                   [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    auto moved = store_.AdvanceSimulatedStarts(clock_.Now());
    if (!moved.ok()) {
      spdlog::warn("control: simulated fleet step failed: {}", moved.status().ToString());
    }
    lock.lock();
  }
}

}  // namespace sv::control
