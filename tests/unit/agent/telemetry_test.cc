// Telemetry sources: NVML's absence is reported clearly; simulated GPUs
// report busy and idle GPUs and the faults they are given.

#include <gtest/gtest.h>

#include "agent/telemetry.h"
#include "common/status.h"

namespace sv::agent {
namespace {

TEST(NvmlTest, AbsentLibraryIsAClearError) {
  auto nvml = OpenNvml("libnvidia-ml-missing.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(nvml.status()), "NVML_UNAVAILABLE");
  const std::string message(nvml.status().message());
  EXPECT_NE(message.find("libnvidia-ml-missing.so.1"), std::string::npos) << message;
  EXPECT_NE(message.find("--telemetry=simulated"), std::string::npos) << message;
}

TEST(NvmlTest, LibraryWithoutNvmlIsAClearError) {
  auto nvml = OpenNvml("libc.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(ReasonOf(nvml.status()), "NVML_UNAVAILABLE");
}

TEST(SimulatedTelemetryTest, BusyGpusWorkAndFaultsShow) {
  SimulatedTelemetry gpus(4, 7);
  gpus.SetBusyGpus({1, 2});
  gpus.SetBusyUtilizationPct(50);
  gpus.SetFaults({{0, 0}, {kThrottleHwThermal, 0}, {0, 2}, {0, 0}});
  auto first = gpus.Sample();
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 4u);
  EXPECT_EQ((*first)[0].utilization_pct, 0);
  EXPECT_NEAR((*first)[1].utilization_pct, 50, 2);
  EXPECT_EQ((*first)[1].throttle_reasons, kThrottleHwThermal);
  EXPECT_EQ((*first)[2].xid_errors, 2);
  auto second = gpus.Sample();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[2].xid_errors, 0) << "an XID is reported once";
  EXPECT_EQ((*second)[1].throttle_reasons, kThrottleHwThermal) << "throttling persists";
}

}  // namespace
}  // namespace sv::agent
