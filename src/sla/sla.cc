#include "sla/sla.h"

#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sv::sla {
namespace {

constexpr int64_t kBasisPoints = 10000;

std::string Percent(int64_t basis_points) {
  return absl::StrFormat("%d.%d%%", basis_points / 100, (basis_points % 100) / 10);
}

std::string GigabytesPerSecond(int64_t bytes_per_second) {
  // Integer formatting: x.yz GB/s, truncated.
  return absl::StrFormat("%d.%02d GB/s", bytes_per_second / 1000000000,
                         (bytes_per_second % 1000000000) / 10000000);
}

std::string Microseconds(int64_t ns) {
  return absl::StrFormat("%d.%02d us", ns / 1000, (ns % 1000) / 10);
}

bool Breaches(const SlaDefinition& d, int64_t observed) {
  return d.comparison == Comparison::kAtLeast ? observed < d.threshold
                                              : observed > d.threshold;
}

std::string Format(Metric m, int64_t v) {
  switch (m) {
    case Metric::kGpuUsable: return Percent(v);
    case Metric::kStorageWrite: return GigabytesPerSecond(v);
    case Metric::kNetworkLatency: return Microseconds(v);
  }
  return "";
}

MetricVerdict JudgeOne(const InstanceHourWindow& w, const SlotMask& judged,
                       const SlaDefinition& d) {
  MetricVerdict v{d};
  switch (d.metric) {
    case Metric::kGpuUsable: {
      const int slots = static_cast<int>(judged.count());
      const int usable = w.UsableSlots(judged);
      v.observed = slots == 0 ? kBasisPoints : usable * kBasisPoints / slots;
      v.missing_telemetry = slots > 0 && usable == 0;
      break;
    }
    case Metric::kStorageWrite:
      v.missing_telemetry = w.storage_probe_count() == 0;
      v.observed = d.aggregation == Aggregation::kMinimum ? w.storage_min_bytes_per_second()
                                                          : w.storage_mean_bytes_per_second();
      break;
    case Metric::kNetworkLatency:
      v.missing_telemetry = w.latency().empty();
      v.observed = w.latency().Quantile(0.99);
      break;
  }
  const std::string name = MetricName(d.metric);
  const char* op = d.comparison == Comparison::kAtLeast ? "at least" : "at most";
  if (v.missing_telemetry && d.metric != Metric::kGpuUsable && judged.none()) {
    // Every charged minute starts or ends a run and nothing reported in
    // them: a run shorter than one report. As with the GPUs, no time was
    // judged, so a missing probe is no breach.
    v.missing_telemetry = false;
    v.explanation = absl::StrCat(name, ": not judged, no report came in the paid time (runs "
                                 "shorter than one telemetry report)");
    return v;
  }
  if (v.missing_telemetry && d.metric != Metric::kGpuUsable) {
    v.breached = true;
    v.explanation = absl::StrCat(name, ": no telemetry during paid time (promised ", op, " ",
                                 Format(d.metric, d.threshold), ")");
    return v;
  }
  v.breached = Breaches(d, v.observed);
  v.explanation = absl::StrCat(name, ": ", Format(d.metric, v.observed),
                               v.breached ? " breaches " : " meets ", "the promise of ", op,
                               " ", Format(d.metric, d.threshold));
  return v;
}

}  // namespace

std::string MetricName(Metric metric) {
  switch (metric) {
    case Metric::kGpuUsable: return "gpu_usable";
    case Metric::kStorageWrite: return "storage_write";
    case Metric::kNetworkLatency: return "network_latency";
  }
  return "unknown";
}

std::vector<SlaDefinition> DefaultDefinitions() {
  return {
      {Metric::kGpuUsable, Aggregation::kShareOfTime, Comparison::kAtLeast, 9500, 1000},
      {Metric::kStorageWrite, Aggregation::kMean, Comparison::kAtLeast, 2'500'000'000, 1000},
      {Metric::kNetworkLatency, Aggregation::kP99, Comparison::kAtMost, 5'000, 1000},
  };
}

absl::StatusOr<std::vector<SlaDefinition>> ApplyOverrides(
    std::vector<SlaDefinition> base, const std::vector<SlaDefinition>& overrides) {
  for (const SlaDefinition& o : overrides) {
    if (o.threshold < 0 || o.refund_basis_points < 0 || o.refund_basis_points > kBasisPoints) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLA override for ", MetricName(o.metric),
                       ": threshold must be >= 0 and refund within 0..10000 bp"));
    }
    const bool fits =
        (o.metric == Metric::kGpuUsable && o.aggregation == Aggregation::kShareOfTime &&
         o.threshold <= kBasisPoints) ||
        (o.metric == Metric::kStorageWrite &&
         (o.aggregation == Aggregation::kMean || o.aggregation == Aggregation::kMinimum)) ||
        (o.metric == Metric::kNetworkLatency && o.aggregation == Aggregation::kP99);
    if (!fits) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLA override for ", MetricName(o.metric), " has an aggregation or "
                       "threshold that metric cannot have"));
    }
    bool replaced = false;
    for (SlaDefinition& b : base) {
      if (b.metric == o.metric) {
        b = o;
        replaced = true;
      }
    }
    if (!replaced) base.push_back(o);
  }
  return base;
}

int64_t RefundMicros(int64_t rent_micros, int32_t basis_points) {
  assert(basis_points >= 0 && basis_points <= kBasisPoints);
  if (rent_micros <= 0) return 0;
  // rent * bp may overflow only above ~9.2e14 micro-yuan (922 million CNY)
  // for one instance-hour; split to stay exact regardless.
  return (rent_micros / kBasisPoints) * basis_points +
         (rent_micros % kBasisPoints) * basis_points / kBasisPoints;
}

HourJudgement Judge(const InstanceHourWindow& window, uint64_t charged_minutes,
                    int64_t rent_micros, const std::vector<SlaDefinition>& definitions) {
  HourJudgement j;
  constexpr uint64_t kHourMinutes = (uint64_t{1} << 60) - 1;
  if (rent_micros <= 0 || (charged_minutes & kHourMinutes) == 0) return j;  // Nothing paid.
  const SlotMask judged = JudgedSlots(window, charged_minutes);
  for (const SlaDefinition& d : definitions) {
    MetricVerdict v = JudgeOne(window, judged, d);
    if (v.breached) v.refund_micros = RefundMicros(rent_micros, d.refund_basis_points);
    j.refund_micros_total += v.refund_micros;
    j.verdicts.push_back(std::move(v));
  }
  return j;
}

}  // namespace sv::sla
