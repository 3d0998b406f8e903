#include "sla/window.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"

namespace sv::sla {

InstanceHourWindow::InstanceHourWindow(absl::Time hour_start, int gpu_count)
    : hour_start_(hour_start), gpu_count_(gpu_count) {
  assert(gpu_count >= 1 && gpu_count <= kInstanceGpusMax);
  reported_.resize(gpu_count);
  unusable_.resize(gpu_count);
}

int InstanceHourWindow::SlotOf(absl::Time at) const {
  if (at < hour_start_ || at >= hour_start_ + absl::Hours(1)) return -1;
  return static_cast<int>((at - hour_start_) / absl::Seconds(kSlotSeconds));
}

absl::Status InstanceHourWindow::AddGpuSample(const GpuSample& s) {
  int slot = SlotOf(s.at);
  if (slot < 0) return absl::InvalidArgumentError("GPU sample outside the window's hour");
  if (s.gpu_index < 0 || s.gpu_index >= gpu_count_) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU index ", s.gpu_index, " is not one of the instance's ", gpu_count_));
  }
  reported_[s.gpu_index].set(slot);
  if (s.xid_error || s.ecc_uncorrectable || s.throttled_by_platform) {
    unusable_[s.gpu_index].set(slot);
  }
  return absl::OkStatus();
}

absl::Status InstanceHourWindow::AddStorageProbe(absl::Time at, int64_t bytes_per_second) {
  if (SlotOf(at) < 0) return absl::InvalidArgumentError("storage probe outside the hour");
  if (!AddStorageRate(bytes_per_second)) {
    return absl::InvalidArgumentError("negative throughput");
  }
  return absl::OkStatus();
}

bool InstanceHourWindow::AddStorageRate(int64_t bytes_per_second) {
  if (bytes_per_second < 0) return false;
  storage_min_ = storage_probe_count_ == 0 ? bytes_per_second
                                           : std::min(storage_min_, bytes_per_second);
  ++storage_probe_count_;
  storage_sum_ += bytes_per_second;
  return true;
}

absl::Status InstanceHourWindow::AddLatency(absl::Time at, const LatencyHistogram& h) {
  if (SlotOf(at) < 0) return absl::InvalidArgumentError("latency probe outside the hour");
  latency_.Merge(h);
  return absl::OkStatus();
}

void InstanceHourWindow::Merge(const InstanceHourWindow& other) {
  assert(other.hour_start_ == hour_start_ && other.gpu_count_ == gpu_count_);
  for (int g = 0; g < gpu_count_; ++g) {
    reported_[g] |= other.reported_[g];
    unusable_[g] |= other.unusable_[g];
  }
  if (other.storage_probe_count_ > 0) {
    storage_min_ = storage_probe_count_ == 0 ? other.storage_min_
                                             : std::min(storage_min_, other.storage_min_);
    storage_probe_count_ += other.storage_probe_count_;
    storage_sum_ += other.storage_sum_;
  }
  latency_.Merge(other.latency_);
}

namespace {

// The slots of [from, to) within the hour, as a mask.
std::bitset<kSlotsPerHour> SpanMask(absl::Time hour_start, absl::Time from, absl::Time to) {
  std::bitset<kSlotsPerHour> mask;
  from = std::max(from, hour_start);
  to = std::min(to, hour_start + absl::Hours(1));
  if (to <= from) return mask;
  const absl::Duration slot = absl::Seconds(kSlotSeconds);
  const int first = static_cast<int>((from - hour_start) / slot);
  const int last = static_cast<int>(absl::Ceil(to - hour_start, slot) / slot);
  mask.set();
  mask >>= kSlotsPerHour - (last - first);
  mask <<= first;
  return mask;
}

}  // namespace

int InstanceHourWindow::UsableSlots(absl::Time from, absl::Time to) const {
  return UsableSlots(SpanMask(hour_start_, from, to));
}

int InstanceHourWindow::UsableSlots(const SlotMask& span) const {
  SlotMask all = span;
  // A GPU that did not report counts as unusable: missing telemetry during
  // paid time is a breach.
  for (int g = 0; g < gpu_count_; ++g) all &= reported_[g] & ~unusable_[g];
  return static_cast<int>(all.count());
}

int InstanceHourWindow::ReportedSlots(absl::Time from, absl::Time to) const {
  return ReportedSlots(SpanMask(hour_start_, from, to));
}

int InstanceHourWindow::ReportedSlots(const SlotMask& span) const {
  SlotMask all = span;
  for (int g = 0; g < gpu_count_; ++g) all &= reported_[g];
  return static_cast<int>(all.count());
}

SlotMask InstanceHourWindow::AnyReported() const {
  SlotMask any;
  for (const auto& r : reported_) any |= r;
  return any;
}

uint64_t MinuteBits(absl::Time hour_start, absl::Time from, absl::Time to) {
  from = std::max(from, hour_start);
  to = std::min(to, hour_start + absl::Hours(1));
  uint64_t bits = 0;
  for (int m = 0; m < 60; ++m) {
    const absl::Time start = hour_start + absl::Minutes(m);
    if (start + absl::Minutes(1) > from && start < to) bits |= uint64_t{1} << m;
  }
  return bits;
}

SlotMask JudgedSlots(const InstanceHourWindow& window, uint64_t charged) {
  constexpr int kSlotsPerMinute = 60 / kSlotSeconds;
  const SlotMask reported = window.AnyReported();
  auto bit = [&](int b) { return ((charged >> b) & 1) != 0; };
  SlotMask out;
  for (int m = 0; m < 60; ++m) {
    if (!bit(m)) continue;
    const bool boundary = !bit(m == 0 ? kMinuteBeforeBit : m - 1) ||
                          !bit(m == 59 ? kMinuteAfterBit : m + 1);
    for (int s = m * kSlotsPerMinute; s < (m + 1) * kSlotsPerMinute; ++s) {
      if (!boundary || reported[s]) out.set(s);
    }
  }
  return out;
}

void InstanceHourWindow::SetGpuSlots(int gpu, const std::bitset<kSlotsPerHour>& reported,
                                     const std::bitset<kSlotsPerHour>& unusable) {
  assert(gpu >= 0 && gpu < gpu_count_);
  reported_[gpu] = reported;
  unusable_[gpu] = unusable;
}

void InstanceHourWindow::SetStorage(int64_t count, int64_t sum, int64_t min) {
  storage_probe_count_ = std::max<int64_t>(0, count);
  storage_sum_ = storage_probe_count_ == 0 ? 0 : sum;
  storage_min_ = storage_probe_count_ == 0 ? 0 : min;
}

int64_t InstanceHourWindow::storage_mean_bytes_per_second() const {
  return storage_probe_count_ == 0 ? 0 : storage_sum_ / storage_probe_count_;
}

}  // namespace sv::sla
