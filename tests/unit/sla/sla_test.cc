// SLA judgement of instance-hours, against hand-computed outcomes.

#include "sla/sla.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "sla/latency_histogram.h"
#include "sla/window.h"

namespace sv::sla {
namespace {

const absl::Time kHour = absl::FromUnixSeconds(1'800'000'000 / 3600 * 3600);
constexpr int64_t kGpuMinuteMicros = 33'000;

// Fills [from, to) with healthy samples for every GPU, good storage and
// good latency, then lets the test spoil parts of it.
struct Telemetry {
  explicit Telemetry(int gpus) : window(kHour, gpus), gpus(gpus) {}

  void Healthy(absl::Time from, absl::Time to) { Gpus(from, to, false); }
  void Throttled(absl::Time from, absl::Time to) { Gpus(from, to, true); }
  void Gpus(absl::Time from, absl::Time to, bool throttled) {
    for (absl::Time t = from; t < to; t += absl::Seconds(kSlotSeconds)) {
      for (int g = 0; g < gpus; ++g) {
        GpuSample s{t, g, false, false, throttled};
        EXPECT_TRUE(window.AddGpuSample(s).ok());
      }
    }
  }
  void Storage(absl::Time from, absl::Time to, int64_t bytes_per_second) {
    for (absl::Time t = from; t < to; t += absl::Minutes(1)) {
      EXPECT_TRUE(window.AddStorageProbe(t, bytes_per_second).ok());
    }
  }
  void Latency(absl::Time from, absl::Time to, int64_t ns) {
    for (absl::Time t = from; t < to; t += absl::Minutes(1)) {
      LatencyHistogram h;
      h.Record(ns, 100);
      EXPECT_TRUE(window.AddLatency(t, h).ok());
    }
  }
  void AllGood(absl::Time from, absl::Time to) {
    Healthy(from, to);
    Storage(from, to, 3'000'000'000);
    Latency(from, to, 3'000);
  }

  InstanceHourWindow window;
  int gpus;
};

int64_t Rent(int gpus, int minutes) { return gpus * minutes * kGpuMinuteMicros; }

constexpr uint64_t kBefore = uint64_t{1} << kMinuteBeforeBit;
constexpr uint64_t kAfter = uint64_t{1} << kMinuteAfterBit;
// Charged through the whole hour, and before and after it.
const uint64_t kWholeHour = MinuteBits(kHour, kHour, kHour + absl::Hours(1)) | kBefore | kAfter;

absl::Time At(int minute, int second = 0) {
  return kHour + absl::Minutes(minute) + absl::Seconds(second);
}

int Breaches(const HourJudgement& j) {
  return static_cast<int>(std::count_if(j.verdicts.begin(), j.verdicts.end(),
                                        [](const MetricVerdict& v) { return v.breached; }));
}

TEST(JudgeTest, TenMinutesOfThrottlingIsOneTenPercentRefund) {
  Telemetry t(8);
  t.AllGood(kHour, kHour + absl::Hours(1));
  t.Throttled(kHour + absl::Minutes(20), kHour + absl::Minutes(30));
  const int64_t rent = Rent(8, 60);
  HourJudgement j = Judge(t.window, kWholeHour, rent, DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 1);
  EXPECT_TRUE(j.verdicts[0].breached);
  EXPECT_EQ(j.verdicts[0].observed, 8333);  // 50 of 60 minutes.
  EXPECT_EQ(j.refund_micros_total, rent / 10);
  EXPECT_NE(j.verdicts[0].explanation.find("83.3%"), std::string::npos)
      << j.verdicts[0].explanation;
}

TEST(JudgeTest, AllThreeBreachedIsThirtyPercent) {
  Telemetry t(8);
  t.Throttled(kHour, kHour + absl::Hours(1));
  t.Storage(kHour, kHour + absl::Hours(1), 1'000'000'000);
  t.Latency(kHour, kHour + absl::Hours(1), 9'000);
  const int64_t rent = Rent(8, 60);
  HourJudgement j = Judge(t.window, kWholeHour, rent, DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 3);
  EXPECT_EQ(j.refund_micros_total, 3 * (rent / 10));
}

TEST(JudgeTest, IdleGpusAreNotABreach) {
  // Idle GPUs report as healthy and unthrottled; utilization is not judged.
  Telemetry t(4);
  t.AllGood(kHour, kHour + absl::Hours(1));
  HourJudgement j = Judge(t.window, kWholeHour, Rent(4, 60), DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 0);
  EXPECT_EQ(j.refund_micros_total, 0);
}

TEST(JudgeTest, SilentAgentBreachesEveryMetric) {
  Telemetry t(8);
  const int64_t rent = Rent(8, 60);
  HourJudgement j = Judge(t.window, kWholeHour, rent, DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 3);
  for (const auto& v : j.verdicts) EXPECT_TRUE(v.missing_telemetry) << v.explanation;
  EXPECT_EQ(j.refund_micros_total, 3 * (rent / 10));
}

TEST(JudgeTest, PartialHourRefundsTenPercentOfWhatWasCharged) {
  // Started at :40; telemetry before the start must not matter.
  Telemetry t(2);
  t.AllGood(kHour + absl::Minutes(40), kHour + absl::Hours(1));
  t.Throttled(kHour + absl::Minutes(40), kHour + absl::Minutes(45));
  const int64_t rent = Rent(2, 20);
  HourJudgement j = Judge(t.window, MinuteBits(kHour, At(40), At(60)) | kAfter, rent,
                          DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 1);
  EXPECT_EQ(j.verdicts[0].observed, 7500);  // 15 of 20 minutes.
  EXPECT_EQ(j.refund_micros_total, 132'000);  // 10% of 2 x 20 x 33,000.
}

TEST(JudgeTest, OneUnreportedGpuMakesTheSlotUnusable) {
  Telemetry t(2);
  t.AllGood(kHour, kHour + absl::Hours(1));
  InstanceHourWindow half(kHour, 3);  // Three GPUs, one never reports.
  for (absl::Time at = kHour; at < kHour + absl::Hours(1); at += absl::Seconds(kSlotSeconds)) {
    ASSERT_TRUE(half.AddGpuSample({at, 0}).ok());
    ASSERT_TRUE(half.AddGpuSample({at, 1}).ok());
  }
  EXPECT_EQ(half.UsableSlots(kHour, kHour + absl::Hours(1)), 0);
}

TEST(JudgeTest, NothingPaidNothingJudged) {
  Telemetry t(8);
  EXPECT_TRUE(Judge(t.window, kWholeHour, 0, DefaultDefinitions()).verdicts.empty());
  EXPECT_TRUE(Judge(t.window, kBefore | kAfter, Rent(8, 1), DefaultDefinitions())
                  .verdicts.empty());
}

// A run from :10:35 to :20:25: minutes :10 to :20 are charged whole, but
// nothing could report before the start or after the stop. Those slots are
// not judged; every other slot of a charged minute is.
TEST(JudgeTest, UnreportedSlotsAtARunsEdgesAreNotJudged) {
  Telemetry t(4);
  t.AllGood(At(10, 35), At(20, 25));
  const uint64_t charged = MinuteBits(kHour, At(10), At(21));
  const SlotMask judged = JudgedSlots(t.window, charged);
  EXPECT_EQ(judged.count(), 3u + 9 * 6 + 2);  // :10:30-:11, :11-:20, :20:00-:20:20.
  EXPECT_FALSE(judged[60]);                    // :10:00, before the start.
  EXPECT_TRUE(judged[63]);
  EXPECT_FALSE(judged[122]);                   // :20:20, the stop's slot: no sample.
  HourJudgement j = Judge(t.window, charged, Rent(4, 11), DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 0) << j.verdicts[0].explanation;
  EXPECT_EQ(j.verdicts[0].observed, 10000);
}

// Inside a run, a minute without reports is still missing telemetry.
TEST(JudgeTest, AGapInsideARunStillCounts) {
  Telemetry t(4);
  t.AllGood(At(10, 35), At(15));
  t.AllGood(At(16), At(20, 25));
  HourJudgement j =
      Judge(t.window, MinuteBits(kHour, At(10), At(21)), Rent(4, 11), DefaultDefinitions());
  EXPECT_TRUE(j.verdicts[0].breached);
  EXPECT_EQ(j.verdicts[0].observed, 9000);  // 54 of 3 + 9 x 6 + 3 slots.
}

// Stopped at :10 and started at :40: the half hour between was neither
// charged nor judged.
TEST(JudgeTest, MinutesNotChargedAreNotJudged) {
  Telemetry t(8);
  t.AllGood(At(0), At(11));
  t.AllGood(At(40), At(60));
  const uint64_t charged =
      MinuteBits(kHour, At(0), At(11)) | MinuteBits(kHour, At(40), At(60)) | kBefore | kAfter;
  EXPECT_EQ(JudgedSlots(t.window, charged).count(), 31u * 6);
  HourJudgement j = Judge(t.window, charged, Rent(8, 31), DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 0);
  // Counted from :00 to :60, the half hour between was 48% of the hour.
  EXPECT_LT(t.window.UsableSlots(At(0), At(60)) * 100 / 360, 95);
}

// A silent instance whose run starts with the hour: only the first
// minute's slots are left out (nothing could report before the start).
TEST(JudgeTest, SilentRunStillBreachesAfterItsFirstMinute) {
  Telemetry t(8);
  const uint64_t charged = MinuteBits(kHour, kHour, At(60)) | kAfter;
  EXPECT_EQ(JudgedSlots(t.window, charged).count(), 354u);
  HourJudgement j = Judge(t.window, charged, Rent(8, 60), DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 3);
  EXPECT_TRUE(j.verdicts[0].missing_telemetry);
}

// Created at :10:55 and deleted at :11:03: two minutes charged, no report
// possible. Storage and latency had no probe, as the GPUs had no sample;
// neither is a breach.
TEST(JudgeTest, RunShorterThanOneReportIsNotJudged) {
  Telemetry t(8);
  const uint64_t charged = MinuteBits(kHour, At(10, 55), At(11, 3));
  ASSERT_EQ(JudgedSlots(t.window, charged).count(), 0u);
  HourJudgement j = Judge(t.window, charged, Rent(8, 2), DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 0);
  EXPECT_EQ(j.refund_micros_total, 0);
  for (const auto& v : j.verdicts) {
    EXPECT_FALSE(v.missing_telemetry) << v.explanation;
    EXPECT_FALSE(v.explanation.empty());
  }
  // One GPU report in the run: the probes of that report are due too.
  t.Healthy(At(11), At(11, 1));
  j = Judge(t.window, charged, Rent(8, 2), DefaultDefinitions());
  EXPECT_EQ(Breaches(j), 2);
  EXPECT_TRUE(j.verdicts[1].missing_telemetry);
}

TEST(WindowTest, MinuteBitsAreTheMinutesTouched) {
  EXPECT_EQ(MinuteBits(kHour, At(0), At(1)), 1u);
  EXPECT_EQ(MinuteBits(kHour, At(0, 30), At(2, 1)), 7u);
  EXPECT_EQ(MinuteBits(kHour, kHour - absl::Hours(1), kHour + absl::Hours(2)),
            (uint64_t{1} << 60) - 1);
  EXPECT_EQ(MinuteBits(kHour, At(5), At(5)), 0u);
}

TEST(WindowTest, RejectsSamplesOutsideTheHourOrForUnknownGpus) {
  InstanceHourWindow w(kHour, 8);
  EXPECT_FALSE(w.AddGpuSample({kHour - absl::Seconds(1), 0}).ok());
  EXPECT_FALSE(w.AddGpuSample({kHour + absl::Hours(1), 0}).ok());
  EXPECT_FALSE(w.AddGpuSample({kHour, 8}).ok());
  EXPECT_FALSE(w.AddStorageProbe(kHour, -1).ok());
}

TEST(WindowTest, MergingPiecesInAnyOrderEqualsOneWindow) {
  std::mt19937 rng(7);
  Telemetry whole(4);
  std::vector<GpuSample> samples;
  for (absl::Time at = kHour; at < kHour + absl::Hours(1); at += absl::Seconds(kSlotSeconds)) {
    for (int g = 0; g < 4; ++g) samples.push_back({at, g, false, false, rng() % 7 == 0});
  }
  for (const auto& s : samples) ASSERT_TRUE(whole.window.AddGpuSample(s).ok());
  std::shuffle(samples.begin(), samples.end(), rng);
  InstanceHourWindow a(kHour, 4), b(kHour, 4);
  for (size_t i = 0; i < samples.size(); ++i) {
    ASSERT_TRUE((i % 2 ? a : b).AddGpuSample(samples[i]).ok());
  }
  a.Merge(b);
  EXPECT_EQ(a.UsableSlots(kHour, kHour + absl::Hours(1)),
            whole.window.UsableSlots(kHour, kHour + absl::Hours(1)));
}

TEST(RefundTest, RoundsDownExactlyForAnyRent) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100000; ++i) {
    int64_t rent = static_cast<int64_t>(rng() % 4'000'000'000'000'000LL);
    int32_t bp = static_cast<int32_t>(rng() % 10001);
    __int128 exact = static_cast<__int128>(rent) * bp / 10000;
    ASSERT_EQ(RefundMicros(rent, bp), static_cast<int64_t>(exact)) << rent << " " << bp;
  }
  EXPECT_EQ(RefundMicros(15'840'000, 1000), 1'584'000);  // 8 GPUs x 1 h.
  EXPECT_EQ(RefundMicros(9, 1000), 0);
}

TEST(OverrideTest, ReplacesOneMetricAndRejectsNonsense) {
  auto custom = ApplyOverrides(DefaultDefinitions(),
                               {{Metric::kNetworkLatency, Aggregation::kP99,
                                 Comparison::kAtMost, 10'000, 2000}});
  ASSERT_TRUE(custom.ok());
  ASSERT_EQ(custom->size(), 3u);
  EXPECT_EQ((*custom)[2].threshold, 10'000);
  EXPECT_EQ((*custom)[2].refund_basis_points, 2000);
  EXPECT_FALSE(ApplyOverrides(DefaultDefinitions(), {{Metric::kGpuUsable, Aggregation::kP99,
                                                       Comparison::kAtLeast, 9000, 1000}})
                   .ok());
  EXPECT_FALSE(ApplyOverrides(DefaultDefinitions(), {{Metric::kStorageWrite, Aggregation::kMean,
                                                       Comparison::kAtLeast, 1, 10001}})
                   .ok());
}

TEST(LatencyHistogramTest, QuantilesAreWithinOnePercent) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> dist(8.0, 1.5);  // Around 3 us, long tail.
  std::vector<int64_t> values;
  LatencyHistogram h, left, right;
  for (int i = 0; i < 200000; ++i) {
    int64_t v = std::max<int64_t>(1, static_cast<int64_t>(dist(rng)));
    values.push_back(v);
    h.Record(v);
    (i % 3 ? left : right).Record(v);
  }
  left.Merge(right);
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    int64_t exact = values[static_cast<size_t>(q * (values.size() - 1))];
    for (const LatencyHistogram* hist : {&h, &left}) {
      int64_t got = hist->Quantile(q);
      EXPECT_LE(std::abs(got - exact), exact / 100 + 1) << "q=" << q;
    }
  }
  LatencyHistogram copy = LatencyHistogram::FromBuckets(h.buckets(), h.zero_count());
  EXPECT_EQ(copy.Quantile(0.99), h.Quantile(0.99));
  EXPECT_EQ(copy.count(), h.count());
}

TEST(LatencyHistogramTest, EmptyAndZeroValues) {
  LatencyHistogram h;
  EXPECT_EQ(h.Quantile(0.99), 0);
  h.Record(0, 10);
  h.Record(-5);
  EXPECT_EQ(h.count(), 11);
  EXPECT_EQ(h.Quantile(0.99), 0);
}

}  // namespace
}  // namespace sv::sla
