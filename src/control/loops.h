#ifndef SV_CONTROL_LOOPS_H_
#define SV_CONTROL_LOOPS_H_

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "store/store.h"

namespace sv::control {

struct LoopOptions {
  absl::Duration placement_interval = absl::Seconds(1);
  int placement_queue_max = 1000;  // Pending instances read per pass.
  // When true, svd plays the agents of simulated nodes and confirms starts.
  bool simulate_fleet = false;
  absl::Duration simulated_start_interval = absl::Milliseconds(200);
};

// The control loops of svd: placement of pending instances and, in dev mode,
// the simulated fleet's confirmations. Placement passes are serialised by a
// PostgreSQL advisory lock, so several svd replicas may run them safely.
class ControlLoops {
 public:
  ControlLoops(store::Store& store, const Clock& clock, LoopOptions options);
  ~ControlLoops();

  void Start();
  void Stop();

  // Runs one placement pass now, in the caller's thread.
  absl::Status PlaceNow();
  // Asks the loop for a pass soon, without waiting for it.
  void Kick();

 private:
  void PlacementLoop();
  void SimulatedFleetLoop();

  store::Store& store_;
  const Clock& clock_;
  LoopOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool kicked_ = false;
  std::thread placement_thread_;
  std::thread fleet_thread_;
};

}  // namespace sv::control

#endif  // SV_CONTROL_LOOPS_H_
