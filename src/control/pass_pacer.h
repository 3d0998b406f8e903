#ifndef SV_CONTROL_PASS_PACER_H_
#define SV_CONTROL_PASS_PACER_H_

#include <chrono>

namespace sv::control {

// Paces queue passes. A pass reads, decides and writes the queue (up to
// --queue-max rows) with the fleet, so its cost grows with the queue; run
// back to back for every arriving create (each asks for a pass), a long
// queue kept the database busy re-reading it (docs/reliability.md, "Pacing
// the queue passes"). After a pass over a long queue (at least
// `min_waiting` instances left waiting) that took at least `min_paced`, the
// next one waits as long as that pass took, so passes use at most half the
// loop's time; a create arriving in the rest does not run a pass of its own.
// Passes over a short queue are never paced, however long they take on a
// busy machine: a create on a fleet with room, or behind a few waiting
// instances, is still placed or ranked in its own call. Not thread-safe; the
// caller locks.
class PassPacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit PassPacer(Clock::duration min_paced = std::chrono::milliseconds(10),
                     int min_waiting = 64)
      : min_paced_(min_paced), min_waiting_(min_waiting) {}

  // A pass that started at `start` has ended at `end`, leaving `waiting`
  // instances in the queue.
  void Finished(Clock::time_point start, Clock::time_point end, int waiting) {
    const Clock::duration took = end - start;
    next_ = took >= min_paced_ && waiting >= min_waiting_ ? end + took : end;
  }

  // How long until the next pass may start; zero when it may start now.
  Clock::duration RestLeft(Clock::time_point now) const {
    return now >= next_ ? Clock::duration::zero() : next_ - now;
  }

 private:
  Clock::duration min_paced_;
  int min_waiting_;
  Clock::time_point next_{};
};

}  // namespace sv::control

#endif  // SV_CONTROL_PASS_PACER_H_
