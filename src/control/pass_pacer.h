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
// loop's time. While the last pass was such a pass, a create does not run a
// pass of its own, in the rest or after it: the loop's next pass ranks it
// (a create at the back of a long queue is rarely placed at once anyway),
// and no create's answer waits for a whole pass over the long queue (those
// had made the p99 of creates). Passes over a short queue are never paced,
// however long they take on a busy machine: a create on a fleet with room,
// or behind a few waiting instances, is still placed or ranked in its own
// call. Not thread-safe; the caller locks.
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
    long_ = took >= min_paced_ && waiting >= min_waiting_;
    next_ = long_ ? end + took : end;
  }

  // Whether the last pass was long and left a long queue: then passes are
  // the loop's alone until one is not.
  bool LastPassWasLong() const { return long_; }

  // How long until the next pass may start; zero when it may start now.
  Clock::duration RestLeft(Clock::time_point now) const {
    return now >= next_ ? Clock::duration::zero() : next_ - now;
  }

 private:
  Clock::duration min_paced_;
  int min_waiting_;
  Clock::time_point next_{};
  bool long_ = false;
};

}  // namespace sv::control

#endif  // SV_CONTROL_PASS_PACER_H_
