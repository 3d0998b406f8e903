#include "common/periodic_loop.h"

#include <utility>

namespace sv {

PeriodicLoop::PeriodicLoop(std::string name, absl::Duration interval, std::function<void()> turn,
                           std::function<void()> on_stop)
    : name_(std::move(name)),
      interval_(interval),
      turn_(std::move(turn)),
      on_stop_(std::move(on_stop)) {}

PeriodicLoop::~PeriodicLoop() { Stop(); }

void PeriodicLoop::Start() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      turn_();
      lock.lock();
      wake_.wait_for(lock, absl::ToChronoNanoseconds(interval_), [this] { return stopping_; });
    }
  });
}

void PeriodicLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    if (on_stop_) on_stop_();
  }
}

}  // namespace sv
