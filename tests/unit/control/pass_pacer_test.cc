// The pacing of queue passes: passes that leave a short queue are never
// delayed; one that leaves a long queue is followed by a rest as long as
// itself and never shorter than the minimum; the rest counts down, and
// passes stay the loop's until one leaves a short queue.
#include "control/pass_pacer.h"

#include <gtest/gtest.h>

namespace sv::control {
namespace {

using std::chrono::milliseconds;
using Clock = PassPacer::Clock;

TEST(PassPacerTest, FirstPassMayStartAtOnce) {
  PassPacer pacer;
  EXPECT_EQ(pacer.RestLeft(Clock::now()), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassLeftLongQueue());
}

TEST(PassPacerTest, QuickPassOverALongQueueRestsTheMinimum) {
  // The head is read by an index, so a pass over a long queue can be quick;
  // run back to back for every create it would still cost the database a
  // re-read of an unchanged head each time.
  PassPacer pacer(milliseconds(20), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(3), 1000);
  EXPECT_TRUE(pacer.LastPassLeftLongQueue());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(3)), milliseconds(20));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(13)), milliseconds(10));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(23)), Clock::duration::zero());
}

TEST(PassPacerTest, LongPassIsFollowedByARestAsLongAsItself) {
  PassPacer pacer(milliseconds(20), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(40), 64);
  EXPECT_TRUE(pacer.LastPassLeftLongQueue());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(40)), milliseconds(40));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(70)), milliseconds(10));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(80)), Clock::duration::zero());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(500)), Clock::duration::zero());
  // The rest is over, but passes stay the loop's until one leaves a short
  // queue.
  EXPECT_TRUE(pacer.LastPassLeftLongQueue());
}

TEST(PassPacerTest, TheLatestPassDecides) {
  PassPacer pacer(milliseconds(20), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(50), 500);
  // The next pass placed most of the queue: no rest, creates rank
  // themselves again.
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(102), 10);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(102)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassLeftLongQueue());
  pacer.Finished(t0 + milliseconds(200), t0 + milliseconds(230), 500);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(230)), milliseconds(30));
}

TEST(PassPacerTest, PassOverAShortQueueIsNotPaced) {
  // A busy machine makes even a pass over three waiting instances slow; a
  // create behind them must still be ranked in its own call.
  PassPacer pacer(milliseconds(20), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(80), 3);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(80)), Clock::duration::zero());
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(180), 63);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(180)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassLeftLongQueue());
}

}  // namespace
}  // namespace sv::control
