#ifndef SV_SLA_WINDOW_H_
#define SV_SLA_WINDOW_H_

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sla/latency_histogram.h"

namespace sv::sla {

// The hour is judged in slots of the agents' sampling period.
inline constexpr int kSlotSeconds = 10;
inline constexpr int kSlotsPerHour = 3600 / kSlotSeconds;
inline constexpr int kInstanceGpusMax = 128;

// A set of slots of one hour.
using SlotMask = std::bitset<kSlotsPerHour>;

// The minutes of an hour the ledger charged an instance for: bit m (0-59)
// for minute m of the hour, bit 60 when the minute before the hour was
// charged and bit 61 when the minute after it was.
inline constexpr int kMinuteBeforeBit = 60;
inline constexpr int kMinuteAfterBit = 61;
// The bits of the minutes [from, to) of the hour (clamped to it); no
// neighbours.
uint64_t MinuteBits(absl::Time hour_start, absl::Time from, absl::Time to);

// One GPU's sample as the agent reports it. "Usable" means healthy and
// allowed to run at full clocks: no XID error, no uncorrectable ECC error,
// and no throttling other than the kinds a tenant causes itself (idle, or
// application clock settings). Kernel activity does not matter: a tenant
// leaving its own GPUs idle is not a breach.
struct GpuSample {
  absl::Time at;
  int gpu_index = 0;  // 0 .. gpu_count-1, in the instance's own numbering.
  bool xid_error = false;
  bool ecc_uncorrectable = false;
  bool throttled_by_platform = false;  // Thermal, power brake, HW slowdown.
};

// The evidence kept for one instance-hour. All of it merges, so agents may
// send in any order and svd can rebuild it after a restart.
class InstanceHourWindow {
 public:
  InstanceHourWindow(absl::Time hour_start, int gpu_count);

  // Samples outside the hour or for unknown GPUs are rejected.
  absl::Status AddGpuSample(const GpuSample& sample);
  // One storage write probe: bytes per second measured over the probe.
  absl::Status AddStorageProbe(absl::Time at, int64_t write_bytes_per_second);
  absl::Status AddLatency(absl::Time at, const LatencyHistogram& histogram);
  void Merge(const InstanceHourWindow& other);

  // The ingest hot path's forms of the three above, for callers that
  // already placed the sample in this hour (0 <= slot < kSlotsPerHour).
  // False, and nothing changes, for a GPU the instance does not have or a
  // negative throughput.
  bool AddGpuSlot(int gpu, int slot, bool unusable) {
    if (gpu < 0 || gpu >= gpu_count_ || slot < 0 || slot >= kSlotsPerHour) return false;
    reported_[gpu][slot] = true;
    if (unusable) unusable_[gpu][slot] = true;
    return true;
  }
  bool AddStorageRate(int64_t bytes_per_second);
  void AddLatencyBuckets(const int32_t* indices, const int64_t* counts, size_t size,
                         int64_t zero_count) {
    latency_.MergeBuckets(indices, counts, size, zero_count);
  }

  // Slots in [from, to) (clamped to the hour), or in `span`, where every
  // GPU reported and was usable.
  int UsableSlots(absl::Time from, absl::Time to) const;
  int UsableSlots(const SlotMask& span) const;

  absl::Time hour_start() const { return hour_start_; }
  int gpu_count() const { return gpu_count_; }
  int64_t storage_probe_count() const { return storage_probe_count_; }
  int64_t storage_mean_bytes_per_second() const;
  int64_t storage_min_bytes_per_second() const { return storage_min_; }
  const LatencyHistogram& latency() const { return latency_; }
  // Slots in [from, to) where every GPU reported, usable or not.
  int ReportedSlots(absl::Time from, absl::Time to) const;
  int ReportedSlots(const SlotMask& span) const;
  // Slots in which at least one GPU reported.
  SlotMask AnyReported() const;

  // Raw parts, for the storage form (sla/evidence.h) and nothing else.
  const std::bitset<kSlotsPerHour>& reported(int gpu) const { return reported_[gpu]; }
  const std::bitset<kSlotsPerHour>& unusable(int gpu) const { return unusable_[gpu]; }
  int64_t storage_sum_bytes_per_second() const { return storage_sum_; }
  void SetGpuSlots(int gpu, const std::bitset<kSlotsPerHour>& reported,
                   const std::bitset<kSlotsPerHour>& unusable);
  void SetStorage(int64_t count, int64_t sum, int64_t min);
  void SetLatency(LatencyHistogram histogram) { latency_ = std::move(histogram); }

 private:
  int SlotOf(absl::Time at) const;

  absl::Time hour_start_;
  int gpu_count_;
  // Per GPU: slots with a sample, and slots with a sample that was not usable.
  std::vector<std::bitset<kSlotsPerHour>> reported_;
  std::vector<std::bitset<kSlotsPerHour>> unusable_;
  int64_t storage_probe_count_ = 0;
  // Sums of integer bytes/s; 2^63 holds 10^6 probes of 9 EB/s.
  int64_t storage_sum_ = 0;
  int64_t storage_min_ = 0;
  LatencyHistogram latency_;
};

// The slots an hour is judged on: those of the charged minutes
// (`charged`, as MinuteBits), less the slots no GPU reported in a minute
// that starts or ends a run of charged minutes. Each started minute is
// charged whole, but no GPU can report before its instance starts or
// after it stops; missing reports anywhere else in paid time still count.
SlotMask JudgedSlots(const InstanceHourWindow& window, uint64_t charged);

}  // namespace sv::sla

#endif  // SV_SLA_WINDOW_H_
