#ifndef SV_COMMON_CLOCK_H_
#define SV_COMMON_CLOCK_H_

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sv {

// All logic reads time through a Clock so that tests can move it by hand.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that only moves when told to; thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start) : now_(start) {}
  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_;
  }
  void Advance(absl::Duration by) {
    std::lock_guard<std::mutex> lock(mutex_);
    now_ += by;
  }
  void Set(absl::Time to) {
    std::lock_guard<std::mutex> lock(mutex_);
    now_ = to;
  }

 private:
  mutable std::mutex mutex_;
  absl::Time now_;
};

}  // namespace sv

#endif  // SV_COMMON_CLOCK_H_
