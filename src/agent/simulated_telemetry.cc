#include <algorithm>

#include "agent/telemetry.h"

namespace sv::agent {

absl::StatusOr<std::vector<GpuReading>> SimulatedTelemetry::Sample() {
  constexpr int64_t kGpuMemoryBytes = 24LL << 30;  // An RTX 4090.
  std::vector<GpuReading> readings;
  std::uniform_int_distribution<int> jitter(-2, 2);
  for (int i = 0; i < gpu_count_; ++i) {
    const bool busy = busy_.count(i) > 0;
    GpuReading r;
    r.gpu_index = i;
    r.utilization_pct = busy ? std::clamp(busy_utilization_pct_ + jitter(random_), 0, 100) : 0;
    r.memory_total_bytes = kGpuMemoryBytes;
    r.memory_used_bytes = busy ? kGpuMemoryBytes / 2 : 0;
    r.temperature_c = busy ? 65 + jitter(random_) : 35;
    r.power_mw = busy ? 420'000 : 25'000;
    if (i < static_cast<int>(faults_.size())) {
      r.throttle_reasons = faults_[i].throttle_reasons;
      r.xid_errors = faults_[i].xid_errors;
      faults_[i].xid_errors = 0;  // An XID is an event, reported once.
      if (faults_[i].idle) {
        r.utilization_pct = 0;
        r.throttle_reasons |= kThrottleGpuIdle;
      }
    }
    readings.push_back(r);
  }
  return readings;
}

}  // namespace sv::agent
