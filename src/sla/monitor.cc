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

IngestCounts Monitor::Ingest(const AttributedBatch& batch, absl::Time now) {
  IngestCounts counts;
  std::lock_guard<std::mutex> lock(mutex_);
  const absl::Time newest = now + options_.future_skew_max;
  // Batches come grouped by instance and hour: look the window up once per run.
  const std::string* last_instance = nullptr;
  absl::Time last_hour;
  Entry* entry = nullptr;
  auto find = [&](const std::string& id, absl::Time at, int gpu_count) -> Entry* {
    const absl::Time hour = HourOf(at);
    if (last_instance != nullptr && *last_instance == id && hour == last_hour) return entry;
    last_instance = &id;
    last_hour = hour;
    entry = EntryFor(id, hour, gpu_count, batch.node_name, now);
    return entry;
  };
  // `weight`: samples the item stands for (a histogram holds many).
  auto admit = [&](const std::string& id, absl::Time at, int gpu_count,
                   int64_t weight) -> Entry* {
    if (at > newest) {
      counts.dropped += weight;
      return nullptr;
    }
    if (Late(HourOf(at), now)) {
      counts.late += weight;
      // Held windows (not judged yet) count them in their evidence; judged
      // ones get them added to their record at the next checkpoint.
      auto held = windows_.find({id, absl::ToUnixSeconds(HourOf(at))});
      if (held != windows_.end()) {
        held->second.evidence.late_samples_ignored += weight;
        held->second.dirty = true;
      } else {
        late_[{id, HourOf(at)}] += weight;
      }
      return nullptr;
    }
    Entry* e = find(id, at, gpu_count);
    if (e == nullptr) counts.dropped += weight;
    return e;
  };
  for (const AttributedGpuSample& s : batch.gpu_samples) {
    Entry* e = admit(*s.instance_id, s.sample.at, s.gpu_count, 1);
    if (e == nullptr) continue;
    if (e->evidence.window.AddGpuSample(s.sample).ok()) {
      ++counts.accepted;
    } else {
      ++counts.dropped;
    }
  }
  last_instance = nullptr;
  for (const AttributedStorageProbe& p : batch.storage_probes) {
    Entry* e = admit(p.instance_id, p.at, p.gpu_count, 1);
    if (e == nullptr) continue;
    if (e->evidence.window.AddStorageProbe(p.at, p.bytes_per_second).ok()) {
      ++counts.accepted;
    } else {
      ++counts.dropped;
    }
  }
  last_instance = nullptr;
  for (const AttributedLatency& l : batch.latency) {
    Entry* e = admit(l.instance_id, l.at, l.gpu_count, l.histogram.count());
    if (e == nullptr) continue;
    if (e->evidence.window.AddLatency(l.at, l.histogram).ok()) {
      counts.accepted += l.histogram.count();
    } else {
      counts.dropped += l.histogram.count();
    }
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
