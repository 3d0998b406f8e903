#ifndef SV_AGENT_TELEMETRY_H_
#define SV_AGENT_TELEMETRY_H_

// Where svagent reads GPU health from: NVML on a real node, a simulator
// otherwise.

#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sv::agent {

// NVML clocks-throttle-reason bits that mean the GPU ran below full clocks
// for reasons other than being idle or an application clock setting:
// SW power cap, HW slowdown, SW thermal, HW thermal, HW power brake.
inline constexpr int64_t kThrottleGpuIdle = 0x1;            // The tenant's own doing.
inline constexpr int64_t kThrottleApplicationClocks = 0x2;  // Likewise.
inline constexpr int64_t kThrottleSwPowerCap = 0x4;
inline constexpr int64_t kThrottleHwSlowdown = 0x8;
inline constexpr int64_t kThrottleSwThermal = 0x20;
inline constexpr int64_t kThrottleHwThermal = 0x40;
inline constexpr int64_t kThrottleHwPowerBrake = 0x80;
inline constexpr int64_t kThrottleUnhealthyMask = kThrottleSwPowerCap | kThrottleHwSlowdown |
                                                  kThrottleSwThermal | kThrottleHwThermal |
                                                  kThrottleHwPowerBrake;

// Whether an NVIDIA XID is one the application on the GPU causes (13
// graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup after those, 68 video decoder
// exception, 69 graphics engine class error). Those say nothing about the
// platform, so svagent does not report them: a tenant could otherwise earn
// SLA refunds by faulting its own kernels (docs/sla.md).
bool IsApplicationXid(unsigned long long xid);

struct GpuReading {
  int gpu_index = 0;
  int utilization_pct = 0;
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  int temperature_c = 0;
  int power_mw = 0;
  int64_t throttle_reasons = 0;
  int xid_errors = 0;  // Since the previous reading; platform XIDs only.
  // Since the previous reading (NVML's count is a running total since the
  // driver loaded; the first reading of a device is its baseline).
  int64_t ecc_uncorrected_errors = 0;
};

class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;
  virtual std::string Name() const = 0;
  // One reading per GPU.
  virtual absl::StatusOr<std::vector<GpuReading>> Sample() = 0;
};

// Loads `library` (normally "libnvidia-ml.so.1") with dlopen. When it is
// absent the status is FAILED_PRECONDITION / NVML_UNAVAILABLE with a message
// that says what is missing.
absl::StatusOr<std::unique_ptr<TelemetrySource>> OpenNvml(
    const std::string& library = "libnvidia-ml.so.1");

// Faults a simulated GPU can be given (see fault_script.h).
struct SimulatedGpuFaults {
  int64_t throttle_reasons = 0;
  int xid_errors = 0;
  bool idle = false;  // The tenant leaves the GPU idle: 0% and the idle throttle bit.
};

// Simulated GPUs: busy GPUs report high utilization, idle ones zero; seeded.
class SimulatedTelemetry final : public TelemetrySource {
 public:
  SimulatedTelemetry(int gpu_count, uint32_t seed) : gpu_count_(gpu_count), random_(seed) {}
  std::string Name() const override { return "simulated"; }
  absl::StatusOr<std::vector<GpuReading>> Sample() override;

  // GPUs an instance uses, and the utilization they report.
  void SetBusyGpus(std::set<int> gpus) { busy_ = std::move(gpus); }
  void SetBusyUtilizationPct(int pct) { busy_utilization_pct_ = pct; }
  // Applied to the next reading only (XIDs) or until changed (throttling).
  void SetFaults(std::vector<SimulatedGpuFaults> faults) { faults_ = std::move(faults); }

 private:
  int gpu_count_;
  std::mt19937 random_;
  std::set<int> busy_;
  int busy_utilization_pct_ = 97;
  std::vector<SimulatedGpuFaults> faults_;
};

}  // namespace sv::agent

#endif  // SV_AGENT_TELEMETRY_H_
