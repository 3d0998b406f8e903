// Telemetry sources: NVML's absence is reported clearly; simulated GPUs
// report busy and idle GPUs and the faults they are given.

#include <dlfcn.h>
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

// Goal: through the real NVML path (a fake libnvidia-ml with the same C
// ABI), XIDs the tenant's own code causes are not reported, platform ones
// are, each once; uncorrected ECC errors are reported as they happen, not
// as the driver's running total.
TEST(NvmlTest, OnlyPlatformXidsAndNewEccErrorsAreReported) {
  void* fake = dlopen(SV_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  auto xid = reinterpret_cast<void (*)(int, unsigned long long)>(dlsym(fake, "fake_nvml_xid"));
  auto set_ecc =
      reinterpret_cast<void (*)(int, unsigned long long)>(dlsym(fake, "fake_nvml_set_ecc"));
  ASSERT_NE(xid, nullptr);
  ASSERT_NE(set_ecc, nullptr);
  set_ecc(1, 3);  // Errors from before svagent started: the baseline.
  auto nvml = OpenNvml(SV_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_EQ((*nvml)->Name(), "nvml");

  auto first = (*nvml)->Sample();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].utilization_pct, 97);
  EXPECT_EQ((*first)[0].memory_used_bytes, int64_t{4} << 30);
  EXPECT_EQ((*first)[1].ecc_uncorrected_errors, 0);

  xid(0, 13);  // Illegal memory access in the tenant's kernel.
  xid(0, 31);
  xid(0, 43);
  xid(1, 79);  // Fell off the bus: the platform's.
  xid(1, 48);
  set_ecc(1, 4);
  auto second = (*nvml)->Sample();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0].xid_errors, 0);
  EXPECT_EQ((*second)[1].xid_errors, 2);
  EXPECT_EQ((*second)[1].ecc_uncorrected_errors, 1);

  auto third = (*nvml)->Sample();
  ASSERT_TRUE(third.ok());
  EXPECT_EQ((*third)[1].xid_errors, 0) << "drained";
  EXPECT_EQ((*third)[1].ecc_uncorrected_errors, 0) << "the old error counts once";
  nvml->reset();
  dlclose(fake);
}

// Goal: the SW power cap bit counts against the platform only when the
// platform set the power limit below the card's default; at the default it
// is the tenant's load reaching the card's own limit. Other bits pass.
TEST(NvmlTest, SwPowerCapAtTheDefaultLimitIsTheTenantsLoad) {
  void* fake = dlopen(SV_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  auto set_throttle = reinterpret_cast<void (*)(int, unsigned long long)>(
      dlsym(fake, "fake_nvml_set_throttle"));
  auto set_limit =
      reinterpret_cast<void (*)(int, unsigned int)>(dlsym(fake, "fake_nvml_set_power_limit"));
  ASSERT_NE(set_throttle, nullptr);
  ASSERT_NE(set_limit, nullptr);
  auto nvml = OpenNvml(SV_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  set_throttle(0, kThrottleSwPowerCap);
  set_throttle(1, kThrottleSwPowerCap | kThrottleHwThermal);
  set_limit(0, 450000);  // The default.
  set_limit(1, 300000);  // Derated by the platform.
  auto readings = (*nvml)->Sample();
  ASSERT_TRUE(readings.ok()) << readings.status();
  EXPECT_EQ((*readings)[0].throttle_reasons, 0);
  EXPECT_EQ((*readings)[1].throttle_reasons, kThrottleSwPowerCap | kThrottleHwThermal);
  set_limit(1, 450000);
  readings = (*nvml)->Sample();
  ASSERT_TRUE(readings.ok());
  EXPECT_EQ((*readings)[1].throttle_reasons, kThrottleHwThermal) << "thermal stays";
  set_throttle(0, 0);
  set_throttle(1, 0);
  nvml->reset();
  dlclose(fake);
}

TEST(NvmlTest, ApplicationXids) {
  for (unsigned long long x : {13, 31, 43, 45, 68, 69}) EXPECT_TRUE(IsApplicationXid(x)) << x;
  for (unsigned long long x : {48, 63, 64, 74, 79, 92, 94, 95, 119}) {
    EXPECT_FALSE(IsApplicationXid(x)) << x;
  }
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
