#ifndef SV_CONTROL_LOOPS_H_
#define SV_CONTROL_LOOPS_H_

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "control/pass_pacer.h"
#include "control/scheduling.h"
#include "store/store.h"

namespace sv::control {

struct LoopOptions {
  absl::Duration placement_interval = absl::Seconds(1);
  // The scheduler's policy, default quotas and pending instances per pass.
  SchedulingOptions scheduling;
};

// The control loops of svd: the scheduling loop (queue passes of
// sv_scheduler, see control/scheduling.h). Simulated nodes have simulated
// agents of their own (src/sim). Passes are serialised by a PostgreSQL
// advisory lock; with a leader gate set they run only on the leader, fenced
// with its epoch (control/leadership.h).
class ControlLoops {
 public:
  ControlLoops(store::Store& store, const Clock& clock, LoopOptions options);
  ~ControlLoops();

  void Start();
  void Stop();

  // Leader-only work (queue passes here; the node monitor and billing loop
  // ask the same gate) runs only while `gate` says this replica leads. Set
  // before Start(); null (the default) runs every pass unfenced.
  void SetLeaderGate(const store::LeaderGate* gate) { gate_ = gate; }
  const store::LeaderGate* leader_gate() const { return gate_; }

  // Runs one placement pass now, in the caller's thread; on a replica that
  // does not lead it does nothing (the leader's loop places within
  // placement_interval). When another pass holds the placement lock it does
  // not wait: it kicks the loop, whose next pass sees the caller's instance;
  // so it does while the passes are paced (control/pass_pacer.h).
  // `ran`, if set, says whether a pass ran (and so wrote its verdicts).
  absl::Status PlaceNow(bool* ran = nullptr);
  // Resize, admission and operator calls of the API share the loop's
  // scheduler settings.
  Scheduling& scheduling() { return scheduling_; }
  // Asks the loop for a pass soon, without waiting for it.
  void Kick();

 private:
  void PlacementLoop();
  absl::Status RunPass(bool wait_for_lock, bool* ran = nullptr);

  store::Store& store_;
  const Clock& clock_;
  LoopOptions options_;
  Scheduling scheduling_;
  const store::LeaderGate* gate_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool kicked_ = false;
  bool awaiting_kick_ = false;  // The loop waits for a kick or its interval.
  PassPacer pacer_;  // Guarded by mutex_.
  std::atomic<int> passes_in_flight_{0};  // Passes of this process running now.
  std::thread placement_thread_;
};

}  // namespace sv::control

#endif  // SV_CONTROL_LOOPS_H_
