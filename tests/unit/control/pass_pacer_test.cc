// The pacing of queue passes: short passes are never delayed, a long one is
// followed by a rest as long as itself, and the rest counts down.
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
  pacer.Finished(t0, t0 + milliseconds(9));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(9)), Clock::duration::zero());
}

TEST(PassPacerTest, LongPassIsFollowedByARestAsLongAsItself) {
  PassPacer pacer(milliseconds(10));
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(40));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(40)), milliseconds(40));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(70)), milliseconds(10));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(80)), Clock::duration::zero());
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(500)), Clock::duration::zero());
}

TEST(PassPacerTest, TheLatestPassDecides) {
  PassPacer pacer(milliseconds(10));
  const Clock::time_point t0 = Clock::now();
  pacer.Finished(t0, t0 + milliseconds(50));
  // The queue emptied: the next pass was quick and lifts the rest.
  pacer.Finished(t0 + milliseconds(100), t0 + milliseconds(102));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(102)), Clock::duration::zero());
  pacer.Finished(t0 + milliseconds(200), t0 + milliseconds(230));
  EXPECT_EQ(pacer.RestLeft(t0 + milliseconds(230)), milliseconds(30));
}

}  // namespace
}  // namespace sv::control
