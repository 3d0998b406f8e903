// Fabric-latency probes over loopback: answered probes land in the fast
// buckets, lost ones in the last, and bad input is refused.

#include "agent/fabric_probe.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(FabricHistogram(*round, absl::Seconds(2)).count(), 20);
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
  const sla::LatencyHistogram h = FabricHistogram(*round, absl::Milliseconds(20));
  EXPECT_EQ(h.count(), 3);
  // Lost probes count as the timeout, within the histogram's 1%.
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.5)), 20e6, 0.2e6);
}

TEST(FabricProbeTest, HistogramKeepsEveryProbeWithinOnePercent) {
  ProbeRound round;
  round.one_way_ns = {500, 2'500, 4'999, 7'000, 2'000'000};
  round.lost = 1;
  const sla::LatencyHistogram h = FabricHistogram(round, absl::Milliseconds(200));
  EXPECT_EQ(h.count(), 6);
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.0)), 500, 5);
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.4)), 4'999, 50);
  EXPECT_NEAR(static_cast<double>(h.Quantile(1.0)), 200e6, 2e6);  // The lost probe.
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
