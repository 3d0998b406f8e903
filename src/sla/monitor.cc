#include "sla/monitor.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace sv::sla {

absl::Time HourOf(absl::Time t) {
  return absl::UnixEpoch() + absl::Floor(t - absl::UnixEpoch(), absl::Hours(1));
}

Monitor::Monitor(MonitorOptions options) : options_(options) {}

bool Monitor::Late(absl::Time hour, absl::Time now) const {
  return hour < closed_before_ || now >= hour + absl::Hours(1) + options_.grace;
}

Monitor::Entry* Monitor::EntryFor(const std::string& instance_id, absl::Time hour,
                                  int gpu_count, const std::string& node, absl::Time now) {
  if (gpu_count < 1 || gpu_count > kInstanceGpusMax) return nullptr;
  const Key key{instance_id, absl::ToUnixSeconds(hour)};
  auto it = windows_.find(key);
  if (it == windows_.end()) {
    if (static_cast<int64_t>(windows_.size()) >= options_.windows_max) return nullptr;
    it = windows_.emplace(key, Entry{Evidence{InstanceHourWindow(hour, gpu_count), {}, 0}})
             .first;
  }
  Entry& e = it->second;
  if (e.evidence.window.gpu_count() != gpu_count) {
    // A resize during the hour: see ResizeWindow.
    const int since = static_cast<int>((std::clamp(now, hour, hour + absl::Hours(1)) - hour) /
                                       absl::Seconds(kSlotSeconds));
    e.evidence.window = ResizeWindow(e.evidence.window, gpu_count, since);
  }
  if (!node.empty() &&
      std::find(e.evidence.node_names.begin(), e.evidence.node_names.end(), node) ==
          e.evidence.node_names.end() &&
      e.evidence.node_names.size() < 64) {
    e.evidence.node_names.push_back(node);
  }
  e.dirty = true;
  return &e;
}

void PackedBatch::Clear() {
  node_name.clear();
  targets.clear();
  gpu_samples.clear();
  storage_probes.clear();
  latency.clear();
  bucket_indices.clear();
  bucket_counts.clear();
}

PackedTime PackTime(absl::Time t) {
  const int64_t seconds = absl::ToUnixSeconds(t);  // Rounds down.
  return {seconds,
          static_cast<int32_t>(absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(seconds)))};
}

namespace {

bool After(const PackedTime& a, const PackedTime& b) {
  return a.seconds > b.seconds || (a.seconds == b.seconds && a.nanos > b.nanos);
}

// The start of the hour holding `seconds`, in Unix seconds (rounds down).
int64_t HourSeconds(int64_t seconds) {
  int64_t q = seconds / 3600;
  if (seconds % 3600 < 0) --q;
  return q * 3600;
}

}  // namespace

IngestCounts Monitor::Ingest(const AttributedBatch& batch, absl::Time now) {
  // One target per run of samples naming the same instance and GPU count.
  PackedBatch packed;
  packed.node_name = batch.node_name;
  auto target = [&packed](const std::string* id, int gpu_count) {
    if (packed.targets.empty() || *packed.targets.back().instance_id != *id ||
        packed.targets.back().gpu_count != gpu_count) {
      packed.targets.push_back({id, gpu_count});
    }
    return static_cast<uint32_t>(packed.targets.size() - 1);
  };
  for (const AttributedGpuSample& s : batch.gpu_samples) {
    packed.gpu_samples.push_back(
        {PackTime(s.sample.at), target(s.instance_id, s.gpu_count), s.sample.gpu_index,
         s.sample.xid_error || s.sample.ecc_uncorrectable || s.sample.throttled_by_platform});
  }
  for (const AttributedStorageProbe& p : batch.storage_probes) {
    packed.storage_probes.push_back(
        {PackTime(p.at), target(&p.instance_id, p.gpu_count), p.bytes_per_second});
  }
  for (const AttributedLatency& l : batch.latency) {
    PackedLatency out{PackTime(l.at), target(&l.instance_id, l.gpu_count),
                      l.histogram.zero_count(),
                      static_cast<uint32_t>(packed.bucket_indices.size()),
                      static_cast<uint32_t>(l.histogram.buckets().size())};
    for (const auto& [bucket, n] : l.histogram.buckets()) {
      packed.bucket_indices.push_back(bucket);
      packed.bucket_counts.push_back(n);
    }
    packed.latency.push_back(out);
  }
  return Ingest(packed, now);
}

IngestCounts Monitor::Ingest(const PackedBatch& batch, absl::Time now) {
  IngestCounts counts;
  const PackedTime newest = PackTime(now + options_.future_skew_max);
  std::lock_guard<std::mutex> lock(mutex_);
  // Lateness depends only on the hour: decide it once per hour seen.
  bool late_known = false;
  int64_t late_hour = 0;
  bool late_value = false;
  auto late = [&](int64_t hour) {
    if (!late_known || hour != late_hour) {
      late_known = true;
      late_hour = hour;
      late_value = Late(absl::FromUnixSeconds(hour), now);
    }
    return late_value;
  };
  // Batches come grouped by instance and hour: look the window up once per
  // run (a run ends where the instance or the hour changes).
  bool cached = false;
  uint32_t cached_target = 0;
  int64_t cached_hour = 0;
  Entry* entry = nullptr;
  auto find = [&](uint32_t target, int64_t hour) -> Entry* {
    const IngestTarget& t = batch.targets[target];
    if (cached && cached_hour == hour &&
        (cached_target == target ||
         *batch.targets[cached_target].instance_id == *t.instance_id)) {
      return entry;
    }
    cached = true;
    cached_target = target;
    cached_hour = hour;
    entry = EntryFor(*t.instance_id, absl::FromUnixSeconds(hour), t.gpu_count, batch.node_name,
                     now);
    return entry;
  };
  // `weight`: samples the item stands for (a histogram holds many). Sets
  // `hour` to the sample's hour (Unix seconds).
  auto admit = [&](uint32_t target, const PackedTime& at, int64_t weight,
                   int64_t& hour) -> Entry* {
    if (target >= batch.targets.size() || After(at, newest)) {
      counts.dropped += weight;
      return nullptr;
    }
    hour = HourSeconds(at.seconds);
    if (late(hour)) {
      counts.late += weight;
      // Held windows (not judged yet) count them in their evidence; judged
      // ones get them added to their record at the next checkpoint.
      const std::string& id = *batch.targets[target].instance_id;
      auto held = windows_.find({id, hour});
      if (held != windows_.end()) {
        held->second.evidence.late_samples_ignored += weight;
        held->second.dirty = true;
      } else {
        late_[{id, absl::FromUnixSeconds(hour)}] += weight;
      }
      return nullptr;
    }
    Entry* e = find(target, hour);
    if (e == nullptr) counts.dropped += weight;
    return e;
  };
  int64_t hour = 0;
  for (const PackedGpuSample& s : batch.gpu_samples) {
    Entry* e = admit(s.target, s.at, 1, hour);
    if (e == nullptr) continue;
    const int slot = static_cast<int>((s.at.seconds - hour) / kSlotSeconds);
    if (e->evidence.window.AddGpuSlot(s.gpu_index, slot, s.unusable)) {
      ++counts.accepted;
    } else {
      ++counts.dropped;
    }
  }
  cached = false;
  for (const PackedStorageProbe& p : batch.storage_probes) {
    Entry* e = admit(p.target, p.at, 1, hour);
    if (e == nullptr) continue;
    if (e->evidence.window.AddStorageRate(p.bytes_per_second)) {
      ++counts.accepted;
    } else {
      ++counts.dropped;
    }
  }
  cached = false;
  for (const PackedLatency& l : batch.latency) {
    if (static_cast<size_t>(l.first_bucket) + l.bucket_count > batch.bucket_indices.size() ||
        batch.bucket_counts.size() != batch.bucket_indices.size()) {
      continue;  // A malformed packed batch: the caller's bug, never the wire's.
    }
    const int32_t* indices = batch.bucket_indices.data() + l.first_bucket;
    const int64_t* bucket_counts = batch.bucket_counts.data() + l.first_bucket;
    int64_t weight = std::max<int64_t>(0, l.zero_count);
    for (uint32_t i = 0; i < l.bucket_count; ++i) weight += std::max<int64_t>(0, bucket_counts[i]);
    Entry* e = admit(l.target, l.at, weight, hour);
    if (e == nullptr) continue;
    e->evidence.window.AddLatencyBuckets(indices, bucket_counts, l.bucket_count, l.zero_count);
    counts.accepted += weight;
  }
  return counts;
}

WindowSnapshot Monitor::Snapshot(const Key& key, const Entry& entry) {
  return {key.first, absl::FromUnixSeconds(key.second), entry.evidence.window.gpu_count(),
          EncodeEvidence(entry.evidence)};
}

std::vector<WindowSnapshot> Monitor::TakeDirty() {
  std::vector<WindowSnapshot> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, entry] : windows_) {
    if (!entry.dirty) continue;
    entry.dirty = false;
    out.push_back(Snapshot(key, entry));
  }
  return out;
}

void Monitor::MarkDirty(const std::vector<WindowSnapshot>& windows) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& w : windows) {
    auto it = windows_.find({w.instance_id, absl::ToUnixSeconds(w.hour_start)});
    if (it != windows_.end()) it->second.dirty = true;
  }
}

std::vector<WindowSnapshot> Monitor::CloseHoursBefore(absl::Time before) {
  std::vector<WindowSnapshot> out;
  std::lock_guard<std::mutex> lock(mutex_);
  closed_before_ = std::max(closed_before_, before);
  for (auto& [key, entry] : windows_) {
    if (absl::FromUnixSeconds(key.second) < before) out.push_back(Snapshot(key, entry));
  }
  return out;
}

std::vector<std::pair<std::string, Evidence>> Monitor::CloseAndCollect(absl::Time before) {
  std::vector<std::pair<std::string, Evidence>> out;
  std::lock_guard<std::mutex> lock(mutex_);
  closed_before_ = std::max(closed_before_, before);
  for (const auto& [key, entry] : windows_) {
    if (absl::FromUnixSeconds(key.second) < before) out.emplace_back(key.first, entry.evidence);
  }
  return out;
}

void Monitor::ForgetHoursBefore(absl::Time before) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = windows_.begin(); it != windows_.end();) {
    it = absl::FromUnixSeconds(it->first.second) < before ? windows_.erase(it) : std::next(it);
  }
}

std::map<std::pair<std::string, absl::Time>, int64_t> Monitor::TakeLateCounts() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(late_, {});
}

void Monitor::Restore(const std::vector<Evidence>& windows, const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < windows.size() && i < ids.size(); ++i) {
    const Key key{ids[i], absl::ToUnixSeconds(windows[i].window.hour_start())};
    windows_.insert_or_assign(key, Entry{windows[i], false});
  }
}

std::optional<Evidence> Monitor::Find(const std::string& instance_id,
                                      absl::Time hour_start) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = windows_.find({instance_id, absl::ToUnixSeconds(hour_start)});
  if (it == windows_.end()) return std::nullopt;
  return it->second.evidence;
}

std::vector<absl::Time> Monitor::HoursOf(const std::string& instance_id) const {
  std::vector<absl::Time> hours;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, entry] : windows_) {
    if (key.first == instance_id) hours.push_back(absl::FromUnixSeconds(key.second));
  }
  std::sort(hours.rbegin(), hours.rend());
  return hours;
}

int64_t Monitor::window_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(windows_.size());
}

}  // namespace sv::sla
