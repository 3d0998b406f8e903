// Fault scripts for simulated agents: parsing, errors that name the line,
// and what the faults amount to over time.

#include <gtest/gtest.h>

#include "agent/fault_script.h"
#include "agent/telemetry.h"
#include "common/status.h"

namespace sv::agent {
namespace {

constexpr char kScript[] = R"(# a comment
30s  node-1 die
10s  node-2 heartbeat-loss for=45s
5s   node-3 xid gpu=2 count=3
5s   *      thermal-throttle gpu=0 for=60s
5s   node-4 power-throttle for=1m
0s   node-5 slow-storage bytes_per_s=500000000 for=120s
0s   node-6 latency-spike us=40 for=30s   # trailing comment
)";

TEST(FaultScriptTest, ParsesEveryKind) {
  auto faults = ParseFaultScript(kScript);
  ASSERT_TRUE(faults.ok()) << faults.status();
  ASSERT_EQ(faults->size(), 7u);
  EXPECT_EQ((*faults)[0].kind, FaultKind::kDie);
  EXPECT_EQ((*faults)[0].at, absl::Seconds(30));
  EXPECT_EQ((*faults)[1].duration, absl::Seconds(45));
  EXPECT_EQ((*faults)[2].gpu, 2);
  EXPECT_EQ((*faults)[2].value, 3);
  EXPECT_EQ((*faults)[3].node, "*");
  EXPECT_EQ((*faults)[4].duration, absl::Minutes(1));
  EXPECT_EQ((*faults)[5].value, 500000000);
  EXPECT_EQ((*faults)[6].kind, FaultKind::kLatencySpike);
}

TEST(FaultScriptTest, ErrorsNameTheLine) {
  struct Case {
    const char* script;
    const char* line;
  };
  for (const Case& c : {Case{"5s node-1 explode", "line 1"},
                        Case{"\n\nsoon node-1 die", "line 3"},
                        Case{"5s node-1 xid gpu=9", "line 1"},
                        Case{"5s node-1 slow-storage for=10s", "line 1"},
                        Case{"5s node-1 latency-spike", "line 1"},
                        Case{"5s node-1 heartbeat-loss for=-3s", "line 1"},
                        Case{"5s node-1 die colour=red", "line 1"},
                        Case{"5s node-1", "line 1"}}) {
    auto faults = ParseFaultScript(c.script);
    ASSERT_FALSE(faults.ok()) << c.script;
    EXPECT_EQ(faults.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ReasonOf(faults.status()), "FAULT_SCRIPT_INVALID");
    EXPECT_NE(faults.status().message().find(c.line), std::string::npos)
        << faults.status().message();
  }
}

TEST(FaultScriptTest, FaultsTakeEffectInTheirWindows) {
  auto faults = ParseFaultScript(kScript);
  ASSERT_TRUE(faults.ok());
  auto at = [&](const std::string& node, int previous_s, int now_s) {
    return FaultsAt(*faults, node, 8, absl::Seconds(previous_s), absl::Seconds(now_s));
  };
  EXPECT_FALSE(at("node-1", 0, 29).dead);
  EXPECT_TRUE(at("node-1", 29, 30).dead);
  EXPECT_TRUE(at("node-1", 100, 200).dead) << "death is for good";

  EXPECT_FALSE(at("node-2", 0, 9).heartbeats_lost);
  EXPECT_TRUE(at("node-2", 9, 10).heartbeats_lost);
  EXPECT_TRUE(at("node-2", 50, 54).heartbeats_lost);
  EXPECT_FALSE(at("node-2", 54, 55).heartbeats_lost);

  // An XID fires once, in the interval that contains its time.
  EXPECT_EQ(at("node-3", 4, 5).xid_errors[2], 3);
  EXPECT_EQ(at("node-3", 5, 6).xid_errors[2], 0);
  EXPECT_EQ(at("node-3", 4, 5).xid_errors[1], 0);

  // "*" reaches every node; gpu= limits the fault to one GPU.
  EXPECT_EQ(at("node-9", 9, 10).throttle_reasons[0], kThrottleHwThermal);
  EXPECT_EQ(at("node-9", 9, 10).throttle_reasons[1], 0);
  EXPECT_EQ(at("node-9", 65, 66).throttle_reasons[0], 0);
  EXPECT_EQ(at("node-4", 9, 10).throttle_reasons[7],
            kThrottleSwPowerCap);
  EXPECT_EQ(at("node-4", 9, 10).throttle_reasons[0], kThrottleSwPowerCap | kThrottleHwThermal);

  EXPECT_EQ(at("node-5", 0, 60).storage_bytes_per_s, 500000000);
  EXPECT_EQ(at("node-5", 0, 120).storage_bytes_per_s, 0);
  EXPECT_EQ(at("node-6", 0, 10).latency_spike_us, 40);
  EXPECT_EQ(at("node-7", 0, 10).latency_spike_us, 0);
}

}  // namespace
}  // namespace sv::agent
