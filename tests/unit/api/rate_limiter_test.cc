// Token buckets: burst, refill, independence of keys, and the wait hint.

#include "api/rate_limiter.h"

#include <gtest/gtest.h>

namespace sv::api {
namespace {

TEST(RateLimiterTest, AllowsTheBurstThenRefillsAtTheRate) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  RateLimiter limiter(clock, {2, 4});  // 2 per second, burst 4.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(limiter.Take("k"), absl::ZeroDuration()) << i;
  absl::Duration wait = limiter.Take("k");
  EXPECT_EQ(wait, absl::Milliseconds(500));
  clock.Advance(absl::Milliseconds(499));
  EXPECT_GT(limiter.Take("k"), absl::ZeroDuration());
  clock.Advance(absl::Milliseconds(2));
  EXPECT_EQ(limiter.Take("k"), absl::ZeroDuration());
  // Another key has its own bucket.
  EXPECT_EQ(limiter.Take("other"), absl::ZeroDuration());
}

TEST(RateLimiterTest, NeverHoldsMoreThanTheBurst) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  RateLimiter limiter(clock, {10, 3});
  EXPECT_EQ(limiter.Take("k"), absl::ZeroDuration());
  clock.Advance(absl::Hours(1));
  int allowed = 0;
  for (int i = 0; i < 10; ++i) allowed += limiter.Take("k") == absl::ZeroDuration();
  EXPECT_EQ(allowed, 3);
}

TEST(RateLimiterTest, ZeroRateMeansNoLimit) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  RateLimiter limiter(clock, {0, 0});
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(limiter.Take("k"), absl::ZeroDuration());
}

TEST(RateLimiterTest, MemoryStaysBoundedByKeysMax) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  RateLimiter limiter(clock, {1, 1}, /*keys_max=*/10);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(limiter.Take("key-" + std::to_string(i)), absl::ZeroDuration());
  }
}

}  // namespace
}  // namespace sv::api
