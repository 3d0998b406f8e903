// The pacing of queue passes: passes that leave a short queue are never
// delayed; one that leaves a long queue is followed by a rest as long as
// itself and never shorter than the minimum, or, when it placed nothing,
// by a rest a multiple of itself and never shorter than the idle minimum;
// the rest counts down, and passes stay the loop's until one leaves a short
// queue.
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
  pacer.Finished(t0, t0 + milliseconds(3), 1000, 1);
  EXPECT_TRUE(pacer.LastPassLeftLongQueue());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(3)), milliseconds(20));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(13)), milliseconds(10));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(23)), Clock::duration::zero());
}

TEST(PassPacerTest, LongPassIsFollowedByARestAsLongAsItself) {
  PassPacer pacer(milliseconds(20), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(40), 64, 1);
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
  pacer.Finished(t0, t0 + milliseconds(50), 500, 1);
  // The next pass placed most of the queue: no rest, creates rank
  // themselves again.
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(102), 10, 1);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(102)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassLeftLongQueue());
  pacer.Finished(t0 + milliseconds(200), t0 + milliseconds(230), 500, 1);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(230)), milliseconds(30));
}

TEST(PassPacerTest, PassOverAShortQueueIsNotPaced) {
  // A busy machine makes even a pass over three waiting instances slow; a
  // create behind them must still be ranked in its own call.
  PassPacer pacer(milliseconds(20), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(80), 3, 1);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(80)), Clock::duration::zero());
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(180), 63, 1);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(180)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassLeftLongQueue());
}

TEST(PassPacerTest, PassThatPlacedNothingOverALongQueueRestsLonger) {
  // A full fleet: the pass only ranked the queue again. The rest is three
  // times the pass, and at least the idle minimum.
  PassPacer pacer(milliseconds(20), 64, milliseconds(100), 3);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(10), 1000, 0);
  EXPECT_TRUE(pacer.LastPassLeftLongQueue());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(10)), milliseconds(100));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(109)), milliseconds(1));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(110)), Clock::duration::zero());
  pacer.Finished(t0 + milliseconds(200), t0 + milliseconds(250), 1000, 0);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(250)), milliseconds(150));
  // One that placed something rests only as long as itself: capacity was
  // there, and the next pass may find more.
  pacer.Finished(t0 + milliseconds(400), t0 + milliseconds(450), 1000, 2);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(450)), milliseconds(50));
}

TEST(PassPacerTest, PassThatPlacedNothingOverAShortQueueIsNotPaced) {
  PassPacer pacer(milliseconds(20), 64, milliseconds(100), 3);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(30), 63, 0);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(30)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassLeftLongQueue());
}

}  // namespace
}  // namespace sv::control
