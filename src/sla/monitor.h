#ifndef SV_SLA_MONITOR_H_
#define SV_SLA_MONITOR_H_

// The SLA monitor's memory: telemetry aggregated per instance-hour in
// mergeable windows, from which checkpoints are written and hours are
// closed for judgement. Thread-safe; does no I/O.
//
// Lateness: a sample counts while its hour is open, i.e. until `grace`
// after the hour ends (by svd's clock, when it arrives) and until the hour
// was closed for judgement. Later samples are counted as ignored, per
// window, and never change a verdict.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "sla/evidence.h"
#include "sla/window.h"

namespace sv::sla {

struct MonitorOptions {
  absl::Duration grace = absl::Minutes(5);
  // Samples stamped further ahead of svd's clock are dropped.
  absl::Duration future_skew_max = absl::Minutes(2);
  // Bounds memory: windows held at once (one per instance-hour).
  int64_t windows_max = 2'000'000;
};

// Telemetry already attributed to instances (the API layer maps node GPUs
// to the instance holding them, and to the instance's own GPU numbering).
struct AttributedGpuSample {
  const std::string* instance_id;  // Points into the caller's storage.
  int gpu_count = 1;
  GpuSample sample;
};
struct AttributedStorageProbe {
  std::string instance_id;
  int gpu_count = 1;
  absl::Time at;
  int64_t bytes_per_second = 0;
};
struct AttributedLatency {
  std::string instance_id;
  int gpu_count = 1;
  absl::Time at;
  LatencyHistogram histogram;
};
struct AttributedBatch {
  std::string node_name;
  std::vector<AttributedGpuSample> gpu_samples;
  std::vector<AttributedStorageProbe> storage_probes;
  std::vector<AttributedLatency> latency;
};

// The same telemetry in the ingest hot path's form (what the API layer
// builds): times as Unix seconds and nanos, no absl::Time arithmetic, and
// every sample naming one of a few targets (an instance and its GPU count)
// that the API layer attributed once per batch, not once per sample.
struct PackedTime {
  int64_t seconds = 0;
  int32_t nanos = 0;  // 0 .. 999,999,999
};
struct IngestTarget {
  const std::string* instance_id = nullptr;  // Points into the caller's storage.
  int gpu_count = 1;
};
struct PackedGpuSample {
  PackedTime at;
  uint32_t target = 0;  // Index into PackedBatch::targets.
  int32_t gpu_index = 0;  // The instance's own numbering.
  bool unusable = false;  // XID, uncorrectable ECC or platform throttling.
};
struct PackedStorageProbe {
  PackedTime at;
  uint32_t target = 0;
  int64_t bytes_per_second = 0;
};
struct PackedLatency {
  PackedTime at;
  uint32_t target = 0;
  int64_t zero_count = 0;
  // This histogram's buckets in PackedBatch::bucket_indices/bucket_counts.
  uint32_t first_bucket = 0;
  uint32_t bucket_count = 0;
};
struct PackedBatch {
  std::string node_name;
  std::vector<IngestTarget> targets;
  std::vector<PackedGpuSample> gpu_samples;
  std::vector<PackedStorageProbe> storage_probes;
  std::vector<PackedLatency> latency;
  std::vector<int32_t> bucket_indices;  // Counts >= 0.
  std::vector<int64_t> bucket_counts;
  // Empties it and keeps the capacity, for reuse by the next batch.
  void Clear();
};

PackedTime PackTime(absl::Time t);

struct IngestCounts {
  int64_t accepted = 0;
  int64_t dropped = 0;  // Malformed, from the future, or over the memory bound.
  int64_t late = 0;     // After the hour's grace period: ignored.
};

// One window in storage form, for checkpoints and judgement.
struct WindowSnapshot {
  std::string instance_id;
  absl::Time hour_start;
  int gpu_count = 0;
  std::string evidence;  // EncodeEvidence().
};

absl::Time HourOf(absl::Time t);

class Monitor {
 public:
  explicit Monitor(MonitorOptions options);

  IngestCounts Ingest(const AttributedBatch& batch, absl::Time now);
  // The same, for the packed form: one lock, one window lookup per run of
  // samples of one instance-hour, and slots set directly.
  IngestCounts Ingest(const PackedBatch& batch, absl::Time now);

  // Windows changed since the last call (cleared), for the checkpoint.
  std::vector<WindowSnapshot> TakeDirty();
  // Marks windows dirty again after a failed checkpoint write.
  void MarkDirty(const std::vector<WindowSnapshot>& windows);

  // Closes every hour before `before`: later samples for them are late.
  // Returns the windows of those hours, to be written before judging.
  std::vector<WindowSnapshot> CloseHoursBefore(absl::Time before);
  // The same, as evidence (no encoding), for the judge.
  std::vector<std::pair<std::string, Evidence>> CloseAndCollect(absl::Time before);
  // Drops the closed hours' windows once they are judged.
  void ForgetHoursBefore(absl::Time before);
  // Late samples counted since the last call, per (instance, hour).
  std::map<std::pair<std::string, absl::Time>, int64_t> TakeLateCounts();

  // Loads this replica's checkpoint after a restart (replaces what is held).
  void Restore(const std::vector<Evidence>& windows, const std::vector<std::string>& ids);

  // The evidence held for one instance-hour, if any.
  std::optional<Evidence> Find(const std::string& instance_id, absl::Time hour_start) const;
  // Hours held for an instance, newest first.
  std::vector<absl::Time> HoursOf(const std::string& instance_id) const;

  int64_t window_count() const;
  const MonitorOptions& options() const { return options_; }

 private:
  struct Entry {
    Evidence evidence;
    bool dirty = false;
  };
  using Key = std::pair<std::string, int64_t>;  // instance, hour (Unix seconds)
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<std::string>()(k.first) * 31 + std::hash<int64_t>()(k.second);
    }
  };

  bool Late(absl::Time hour, absl::Time now) const;
  Entry* EntryFor(const std::string& instance_id, absl::Time hour, int gpu_count,
                  const std::string& node, absl::Time now);
  static WindowSnapshot Snapshot(const Key& key, const Entry& entry);

  MonitorOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> windows_;
  std::map<std::pair<std::string, absl::Time>, int64_t> late_;
  absl::Time closed_before_ = absl::InfinitePast();
};

}  // namespace sv::sla

#endif  // SV_SLA_MONITOR_H_
