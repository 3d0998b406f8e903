// The SLA monitor's memory: windows per instance-hour, the grace period,
// checkpoints in storage form, resizes, and policy files.

#include "sla/monitor.h"

#include <gtest/gtest.h>

#include "sla/evidence.h"
#include "sla/policy.h"

namespace sv::sla {
namespace {

const absl::Time kHour = absl::FromUnixSeconds(1'793'613'600);  // 2026-11-02T10:00Z
const std::string kId = "ins-aaaaaaaaaaaaaaaa";

AttributedBatch Healthy(absl::Time from, int slots, int gpus) {
  AttributedBatch b;
  b.node_name = "node-a";
  for (int s = 0; s < slots; ++s) {
    for (int g = 0; g < gpus; ++g) {
      GpuSample sample;
      sample.at = from + absl::Seconds(10 * s + 5);
      sample.gpu_index = g;
      b.gpu_samples.push_back({&kId, gpus, sample});
    }
    b.storage_probes.push_back({kId, gpus, from + absl::Seconds(10 * s), 4'000'000'000});
    LatencyHistogram h;
    h.Record(2'500, 10);
    b.latency.push_back({kId, gpus, from + absl::Seconds(10 * s), h});
  }
  return b;
}

// Goal: samples of an open hour count; the same samples after the grace
// period (or after the hour was closed for judgement) are late and ignored.
TEST(MonitorTest, GracePeriodDecidesLateness) {
  Monitor m({absl::Minutes(5), absl::Minutes(2), 100});
  IngestCounts in = m.Ingest(Healthy(kHour, 6, 2), kHour + absl::Minutes(59));
  EXPECT_EQ(in.accepted, 6 * 2 + 6 + 60);
  EXPECT_EQ(in.late, 0);
  in = m.Ingest(Healthy(kHour + absl::Minutes(1), 6, 2), kHour + absl::Minutes(64));
  EXPECT_EQ(in.late, 0) << "inside the grace period";
  in = m.Ingest(Healthy(kHour + absl::Minutes(2), 6, 2), kHour + absl::Minutes(65));
  EXPECT_EQ(in.accepted, 0);
  EXPECT_EQ(in.late, 6 * 2 + 6 + 60);
  // The window is still held (not judged): its evidence counts them.
  EXPECT_EQ(m.Find(kId, kHour)->late_samples_ignored, 6 * 2 + 6 + 60);
  m.ForgetHoursBefore(kHour + absl::Hours(1));
  m.Ingest(Healthy(kHour, 1, 1), kHour + absl::Minutes(66));
  auto late = m.TakeLateCounts();
  EXPECT_EQ((late[{kId, kHour}]), 12);

  Monitor closed({absl::Minutes(5), absl::Minutes(2), 100});
  closed.Ingest(Healthy(kHour, 1, 1), kHour + absl::Minutes(1));
  EXPECT_EQ(closed.CloseHoursBefore(kHour + absl::Hours(1)).size(), 1u);
  EXPECT_EQ(closed.Ingest(Healthy(kHour, 1, 1), kHour + absl::Minutes(61)).late, 12);
}

// Goal: samples far in the future are dropped, and the window count is
// bounded.
TEST(MonitorTest, FutureSamplesAndTheMemoryBoundDrop) {
  Monitor m({absl::Minutes(5), absl::Minutes(2), 1});
  EXPECT_EQ(m.Ingest(Healthy(kHour + absl::Minutes(10), 1, 1), kHour).dropped, 12);
  EXPECT_EQ(m.Ingest(Healthy(kHour, 1, 1), kHour).accepted, 12);
  EXPECT_GT(m.Ingest(Healthy(kHour + absl::Hours(1), 1, 1), kHour + absl::Hours(1)).dropped,
            0) << "a second window is over the bound";
  EXPECT_EQ(m.window_count(), 1);
}

// Goal: a checkpoint round-trips exactly (the restart story), and windows
// of two replicas merge.
TEST(MonitorTest, CheckpointRoundTripsAndMerges) {
  Monitor m({});
  AttributedBatch b = Healthy(kHour, 30, 2);
  b.gpu_samples[3].sample.throttled_by_platform = true;
  m.Ingest(b, kHour + absl::Minutes(5));
  auto dirty = m.TakeDirty();
  ASSERT_EQ(dirty.size(), 1u);
  EXPECT_TRUE(m.TakeDirty().empty()) << "dirty flags clear";
  auto e = DecodeEvidence(kHour, dirty[0].evidence);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->window.UsableSlots(kHour, kHour + absl::Minutes(5)), 29);
  EXPECT_EQ(e->window.storage_probe_count(), 30);
  EXPECT_EQ(e->window.latency().count(), 300);
  EXPECT_EQ(e->node_names, std::vector<std::string>{"node-a"});

  Monitor restored({});
  restored.Restore({*e}, {kId});
  auto again = restored.Find(kId, kHour);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(EncodeEvidence(*again), dirty[0].evidence);

  Evidence other = *e;
  other.node_names = {"node-b"};
  MergeEvidence(*again, other);
  EXPECT_EQ(again->window.storage_probe_count(), 60);
  EXPECT_EQ(again->node_names.size(), 2u);
  EXPECT_FALSE(DecodeEvidence(kHour, "not a protobuf \xff").ok());
}

// Goal: growing an instance mid-hour does not make the time before it a
// breach; the new GPU counts from when it arrived.
TEST(MonitorTest, GrowingMidHourKeepsEarlierSlots) {
  Monitor m({});
  m.Ingest(Healthy(kHour, 180, 1), kHour + absl::Minutes(30));
  m.Ingest(Healthy(kHour + absl::Minutes(30), 180, 2), kHour + absl::Minutes(59));
  auto e = m.Find(kId, kHour);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->window.gpu_count(), 2);
  EXPECT_EQ(e->window.UsableSlots(kHour, kHour + absl::Hours(1)), 360);
}

// Goal: a definitions file replaces defaults per metric and refuses nonsense.
TEST(PolicyTest, DefinitionsFile) {
  auto d = ParseDefinitions(
      R"([{"metric": "gpu_usable", "threshold": 9900, "refund_basis_points": 1500}])");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[0].threshold, 9900);
  EXPECT_EQ((*d)[0].refund_basis_points, 1500);
  EXPECT_EQ((*d)[1].threshold, 2'500'000'000);
  EXPECT_FALSE(ParseDefinitions("{}").ok());
  EXPECT_FALSE(ParseDefinitions(R"([{"metric": "uptime", "threshold": 1}])").ok());
  EXPECT_FALSE(ParseDefinitions(R"([{"metric": "gpu_usable", "threshold": 20000}])").ok());
  EXPECT_FALSE(
      ParseDefinitions(R"([{"metric": "network_latency", "threshold": 1, "aggregation": "mean"}])")
          .ok());
  EXPECT_FALSE(LoadDefinitionsFile("/nonexistent/sla.json").ok());
}

}  // namespace
}  // namespace sv::sla
