// Telemetry sources: NVML's absence is reported clearly; simulated GPUs
// report busy and idle GPUs and the faults they are given.

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "agent/telemetry.h"
#include "agent/telemetry_collector.h"
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

// Goal: a GPU NVML cannot read (fallen off the bus) is not reported as a
// healthy idle one: an all-zero reading used to be sent for it, and a dead
// GPU never breached. Its readings are left out (its slots unreported, so
// unusable), except one carrying an XID. "Not supported" is not a fault.
TEST(NvmlTest, AGpuNvmlCannotReadIsLeftOut) {
  void* fake = dlopen(SV_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  auto set_status =
      reinterpret_cast<void (*)(int, int)>(dlsym(fake, "fake_nvml_set_health_status"));
  auto xid = reinterpret_cast<void (*)(int, unsigned long long)>(dlsym(fake, "fake_nvml_xid"));
  ASSERT_NE(set_status, nullptr);
  ASSERT_NE(xid, nullptr);
  auto nvml = OpenNvml(SV_FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  xid(1, 79);
  set_status(1, 15);  // NVML_ERROR_GPU_IS_LOST
  auto lost = (*nvml)->Sample();
  ASSERT_TRUE(lost.ok()) << lost.status();
  ASSERT_EQ(lost->size(), 2u) << "the XID is still sent";
  EXPECT_EQ((*lost)[1].xid_errors, 1);
  auto after = (*nvml)->Sample();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), 1u) << "a lost GPU was reported as a healthy idle one";
  EXPECT_EQ((*after)[0].gpu_index, 0);
  set_status(1, 3);  // NVML_ERROR_NOT_SUPPORTED: a card without the call.
  auto unsupported = (*nvml)->Sample();
  ASSERT_TRUE(unsupported.ok());
  EXPECT_EQ(unsupported->size(), 2u);
  set_status(1, 0);
  nvml->reset();
  dlclose(fake);
}

// Goal: a storage probe whose writes fail is 0 bytes, not the whole probe
// over the time to the first error (a disk refusing every write read as
// ~168 GB/s and passed the 2.5 GB/s promise). The failure here: a file
// size limit of 1 MiB on an 8 MiB probe (EFBIG), in a child process.
TEST(StorageProbeTest, AProbeWhoseWritesFailIsZeroBytes) {
  const std::string path =
      ::testing::TempDir() + "/sv-probe-test-" + std::to_string(::getpid());
  const ProbeResult whole = WriteProbe(path, 8 << 20);
  EXPECT_EQ(whole.bytes, 8 << 20);
  EXPECT_GT(whole.took, absl::ZeroDuration());
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    const int64_t bytes = WriteProbe(path, 8 << 20).bytes;
    (void)!write(out[1], &bytes, sizeof(bytes));
    _exit(0);
  }
  close(out[1]);
  int64_t failed = -1;
  EXPECT_EQ(read(out[0], &failed, sizeof(failed)), static_cast<ssize_t>(sizeof(failed)));
  close(out[0]);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(failed, 0) << "a probe cut short by write errors was reported as written";
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
