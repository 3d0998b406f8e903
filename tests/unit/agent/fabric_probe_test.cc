// Fabric-latency probes over loopback: answered probes land in the fast
// buckets, lost ones in the last, and bad input is refused.

#include "agent/fabric_probe.h"

#include <gtest/gtest.h>

#include <numeric>

#include "agent/telemetry.h"

namespace sv::agent {
namespace {

TEST(FabricProbeTest, PeerAnswersEveryProbe) {
  ProbeResponder responder;
  ASSERT_TRUE(responder.Start("127.0.0.1:0").ok());
  ASSERT_GT(responder.port(), 0);
  auto round = ProbePeers({"127.0.0.1:" + std::to_string(responder.port())}, 20,
                          absl::Seconds(2));
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(round->one_way_ns.size(), 20u);
  EXPECT_EQ(round->lost, 0);
  for (int64_t ns : round->one_way_ns) EXPECT_GT(ns, 0);
  std::vector<int64_t> counts = BucketCounts(*round);
  ASSERT_EQ(counts.size(), static_cast<size_t>(kLatencyBucketCount));
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 20);
}

TEST(FabricProbeTest, SilentPeerLosesProbesIntoTheSlowestBucket) {
  ProbeResponder responder;  // Bound, then stopped: nobody answers there.
  ASSERT_TRUE(responder.Start("127.0.0.1:0").ok());
  const int port = responder.port();
  responder.Stop();
  auto round = ProbePeers({"127.0.0.1:" + std::to_string(port)}, 3, absl::Milliseconds(20));
  ASSERT_TRUE(round.ok());
  EXPECT_TRUE(round->one_way_ns.empty());
  EXPECT_EQ(round->lost, 3);
  EXPECT_EQ(BucketCounts(*round).back(), 3);
}

TEST(FabricProbeTest, BucketsFollowTheFixedBounds) {
  ProbeRound round;
  round.one_way_ns = {500, 2'500, 4'999, 7'000, 2'000'000};
  std::vector<int64_t> counts = BucketCounts(round);
  EXPECT_EQ(counts[0], 1);   // < 1 us
  EXPECT_EQ(counts[2], 1);   // 2..3 us
  EXPECT_EQ(counts[4], 1);   // 4..5 us
  EXPECT_EQ(counts[6], 1);   // 6..8 us
  EXPECT_EQ(counts[kLatencyBucketCount - 1], 1);  // Slower than 1 ms.
}

TEST(FabricProbeTest, RefusesBadInput) {
  EXPECT_FALSE(ProbePeers({"no-port"}, 1, absl::Milliseconds(10)).ok());
  EXPECT_FALSE(ProbePeers({"127.0.0.1:1"}, 0, absl::Milliseconds(10)).ok());
  EXPECT_FALSE(ProbePeers({"127.0.0.1:1"}, 101, absl::Milliseconds(10)).ok());
  EXPECT_FALSE(ProbePeers(std::vector<std::string>(65, "127.0.0.1:1"), 1,
                          absl::Milliseconds(10)).ok());
  ProbeResponder responder;
  EXPECT_FALSE(responder.Start("127.0.0.1:notaport").ok());
}

}  // namespace
}  // namespace sv::agent
