#ifndef SV_CONTROL_PASS_PACER_H_
#define SV_CONTROL_PASS_PACER_H_

#include <algorithm>
#include <chrono>

namespace sv::control {

// Paces queue passes. A pass reads, decides and writes the queue's head (up
// to --queue-max rows) with the fleet; every arriving create asks for one,
// so under a flood of creates behind a long queue the loop would run them
// back to back and keep the database busy re-reading a head that did not
// change (docs/reliability.md, "Pacing the queue passes"). After a pass that
// left a long queue (at least `min_waiting` instances waiting), the next
// waits as long as that pass took, and at least `min_rest`: passes use at
// most half the loop's time, and a quick pass over a long queue (the head
// is read by an index, so its cost no longer grows with the queue) runs at
// most once per `min_rest`. The requests that arrive meanwhile are served
// by the one pass after the rest.
//
// A pass over a long queue that placed nothing (a full fleet, the usual
// reason for a long queue) only ranked the waiting instances again: the
// rest after it is `idle_factor` times as long as it took, and at least
// `idle_rest`, so such passes use at most 1/(1 + idle_factor) of the loop's
// time (docs/reliability.md, "Resting after a pass that placed nothing").
// A new instance's position and reason then show within about `idle_rest`
// plus a pass, and capacity freed meanwhile is used after the same wait.
//
// While the last pass left a long queue, a create does not run a pass of
// its own: the loop's next pass ranks it (a create at the back of a long
// queue is rarely placed at once anyway), and no create's answer waits for
// a pass. Passes that leave a short queue are never paced, however long
// they take on a busy machine: a create on a fleet with room, or behind a
// few waiting instances, is still placed or ranked in its own call. Not
// thread-safe; the caller locks.
class PassPacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit PassPacer(Clock::duration min_rest = std::chrono::milliseconds(20),
                     int min_waiting = 64,
                     Clock::duration idle_rest = std::chrono::milliseconds(100),
                     int idle_factor = 3)
      : min_rest_(min_rest),
        min_waiting_(min_waiting),
        idle_rest_(idle_rest),
        idle_factor_(idle_factor) {}

  // A pass that started at `start` has ended at `end`, placing `placed`
  // instances and leaving `waiting` in the queue.
  void Finished(Clock::time_point start, Clock::time_point end, int waiting, int placed) {
    const Clock::duration took = end - start;
    long_queue_ = waiting >= min_waiting_;
    if (!long_queue_) {
      next_ = end;
    } else if (placed > 0) {
      next_ = end + std::max(took, min_rest_);
    } else {
      next_ = end + std::max(took * idle_factor_, idle_rest_);
    }
  }

  // Whether the last pass left a long queue: then passes are the loop's
  // alone until one leaves a short queue.
  bool LastPassLeftLongQueue() const { return long_queue_; }

  // How long until the next pass may start; zero when it may start now.
  Clock::duration RestLeft(Clock::time_point now) const {
    return now >= next_ ? Clock::duration::zero() : next_ - now;
  }

 private:
  Clock::duration min_rest_;
  int min_waiting_;
  Clock::duration idle_rest_;
  int idle_factor_;
  Clock::time_point next_{};
  bool long_queue_ = false;
};

}  // namespace sv::control

#endif  // SV_CONTROL_PASS_PACER_H_
