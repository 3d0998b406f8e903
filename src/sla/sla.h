#ifndef SV_SLA_SLA_H_
#define SV_SLA_SLA_H_

// The SLA rules: what each metric promises, how an instance-hour is judged
// against them, and how large each refund is. Pure logic: the monitor that
// feeds windows from telemetry and posts refunds to the ledger sits on top.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sla/window.h"

namespace sv::sla {

enum class Metric { kGpuUsable, kStorageWrite, kNetworkLatency };
enum class Comparison { kAtLeast, kAtMost };
enum class Aggregation { kShareOfTime, kMean, kMinimum, kP99 };

std::string MetricName(Metric metric);  // "gpu_usable", "storage_write", "network_latency"

// One promise. Units: kGpuUsable in basis points of billed time (9500 =
// 95%), kStorageWrite in bytes per second, kNetworkLatency in nanoseconds.
struct SlaDefinition {
  Metric metric;
  Aggregation aggregation;
  Comparison comparison;
  int64_t threshold;
  int32_t refund_basis_points;  // 1000 = 10% of the hour's rent.
};

// The defaults of design.md: GPUs usable at least 95% of the hour, storage
// writes at least 2.5 GB/s on average, fabric latency p99 at most 5 us; each
// breach refunds 10%.
std::vector<SlaDefinition> DefaultDefinitions();

// Replaces the defaults' entries for the same metric (enterprise contracts).
// Rejects negative thresholds, refunds outside 0..10000 bp, and a metric
// with an aggregation it cannot have.
absl::StatusOr<std::vector<SlaDefinition>> ApplyOverrides(
    std::vector<SlaDefinition> base, const std::vector<SlaDefinition>& overrides);

struct MetricVerdict {
  SlaDefinition definition;
  int64_t observed = 0;        // In the definition's unit.
  bool missing_telemetry = false;
  bool breached = false;
  int64_t refund_micros = 0;
  std::string explanation;     // For the tenant, e.g. "GPUs usable 83.3% < 95.0%".
};

struct HourJudgement {
  std::vector<MetricVerdict> verdicts;
  int64_t refund_micros_total = 0;
};

// Judges the minutes of `window`'s hour that the ledger charged
// (`charged_minutes`, as MinuteBits in window.h; GPU usability over
// JudgedSlots). The rent is what the ledger actually charged for that
// instance-hour; each breached metric refunds its share of it. Refunds
// stack, with no cap.
HourJudgement Judge(const InstanceHourWindow& window, uint64_t charged_minutes,
                    int64_t rent_micros, const std::vector<SlaDefinition>& definitions);

// refund = floor(rent * basis_points / 10000): rounding down to the
// micro-yuan, so refunds never exceed the stated share.
int64_t RefundMicros(int64_t rent_micros, int32_t basis_points);

}  // namespace sv::sla

#endif  // SV_SLA_SLA_H_
