#ifndef SV_COMMON_PERIODIC_LOOP_H_
#define SV_COMMON_PERIODIC_LOOP_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace sv {

// Runs `turn` every `interval` on a thread of its own; `on_stop` once after.
// store::LeaderLoop is the same for leader-only work.
class PeriodicLoop {
 public:
  PeriodicLoop(std::string name, absl::Duration interval, std::function<void()> turn,
               std::function<void()> on_stop = nullptr);
  ~PeriodicLoop();
  PeriodicLoop(const PeriodicLoop&) = delete;
  PeriodicLoop& operator=(const PeriodicLoop&) = delete;
  void Start();
  // Waits for a turn in progress; a no-op when not running.
  void Stop();

 private:
  std::string name_;
  absl::Duration interval_;
  std::function<void()> turn_;
  std::function<void()> on_stop_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sv

#endif  // SV_COMMON_PERIODIC_LOOP_H_
