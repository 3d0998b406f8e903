// The pacing of queue passes: short passes and passes over a short queue are
// never delayed, a long pass over a long queue is followed by a rest as long
// as itself, the rest counts down, and passes stay the loop's until one is
// short.
#include "control/pass_pacer.h"

#include <gtest/gtest.h>

namespace sv::control {
namespace {

using std::chrono::milliseconds;
using Clock = PassPacer::Clock;

TEST(PassPacerTest, FirstPassMayStartAtOnce) {
  PassPacer pacer;
  EXPECT_EQ(pacer.RestLeft(Clock::now()), Clock::duration::zero());
}

TEST(PassPacerTest, ShortPassesAreNotPaced) {
  PassPacer pacer(milliseconds(10));
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(9), 1000);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(9)), Clock::duration::zero());
}

TEST(PassPacerTest, LongPassIsFollowedByARestAsLongAsItself) {
  PassPacer pacer(milliseconds(10));
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(pacer.LastPassWasLong());
  pacer.Finished(t0, t0 + milliseconds(40), 64);
  EXPECT_TRUE(pacer.LastPassWasLong());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(40)), milliseconds(40));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(70)), milliseconds(10));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(80)), Clock::duration::zero());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(500)), Clock::duration::zero());
  // The rest is over, but passes stay the loop's until one is short.
  EXPECT_TRUE(pacer.LastPassWasLong());
}

TEST(PassPacerTest, TheLatestPassDecides) {
  PassPacer pacer(milliseconds(10));
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(50), 500);
  // The next pass was quick and lifts the rest.
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(102), 500);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(102)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassWasLong());
  pacer.Finished(t0 + milliseconds(200), t0 + milliseconds(230), 500);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(230)), milliseconds(30));
}

TEST(PassPacerTest, LongPassOverAShortQueueIsNotPaced) {
  // A busy machine makes even a pass over three waiting instances slow; a
  // create behind them must still be ranked in its own call.
  PassPacer pacer(milliseconds(10), 64);
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(80), 3);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(80)), Clock::duration::zero());
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(180), 63);
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(180)), Clock::duration::zero());
  EXPECT_FALSE(pacer.LastPassWasLong());
}

}  // namespace
}  // namespace sv::control
