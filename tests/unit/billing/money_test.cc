// Fen rounding and minute arithmetic of the billing library (pure).
#include "billing/billing.h"
#include "gtest/gtest.h"

namespace sv::billing {
namespace {

// Rounding to fen is half away from zero, symmetric around zero.
TEST(RoundToFenTest, HalfAwayFromZero) {
  EXPECT_EQ(RoundToFen(0), 0);
  EXPECT_EQ(RoundToFen(4'999), 0);
  EXPECT_EQ(RoundToFen(5'000), 1);
  EXPECT_EQ(RoundToFen(14'999), 1);
  EXPECT_EQ(RoundToFen(15'000), 2);
  EXPECT_EQ(RoundToFen(-4'999), 0);
  EXPECT_EQ(RoundToFen(-5'000), -1);
  EXPECT_EQ(RoundToFen(33'000 * 60), 198);  // One GPU-hour: 1.98 CNY.
  EXPECT_EQ(RoundToFen(INT64_MAX / 2), (INT64_MAX / 2 + 5'000) / 10'000);
}

// Amounts in messages are exact, with at least two decimals.
TEST(YuanTest, ExactWithAtLeastTwoDecimals) {
  EXPECT_EQ(Yuan(10'560'000), "10.56 CNY");
  EXPECT_EQ(Yuan(10'000'000), "10.00 CNY");
  EXPECT_EQ(Yuan(264'000), "0.264 CNY");
  EXPECT_EQ(Yuan(123), "0.000123 CNY");
  EXPECT_EQ(Yuan(0), "0.00 CNY");
  EXPECT_EQ(Yuan(-5'000), "-0.005 CNY");
  EXPECT_EQ(Yuan(INT64_MIN), "-9223372036854.775808 CNY");
}

// A minute is [60m, 60m + 60) s of Unix time; instants inside map to it.
TEST(MinuteTest, MinuteOfAndStart) {
  const absl::Time t = absl::FromUnixSeconds(1'790'000'000);  // 60 * 29833333 + 20.
  EXPECT_EQ(MinuteOf(t), 29'833'333);
  EXPECT_EQ(MinuteStart(29'833'333), absl::FromUnixSeconds(29'833'333LL * 60));
  EXPECT_EQ(MinuteOf(MinuteStart(29'833'333)), 29'833'333);
  EXPECT_EQ(MinuteOf(MinuteStart(29'833'334) - absl::Nanoseconds(1)), 29'833'333);
}

}  // namespace
}  // namespace sv::billing
