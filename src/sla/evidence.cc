#include "sla/evidence.h"

#include <algorithm>
#include <set>

#include "common/status.h"
#include "sv/v1/sla.pb.h"

namespace sv::sla {
namespace {

using Slots = std::bitset<kSlotsPerHour>;
constexpr int kNodeNamesMax = 64;

void ToRuns(const Slots& bits, google::protobuf::RepeatedField<int32_t>* out) {
  int s = 0;
  while (s < kSlotsPerHour) {
    if (!bits.test(s)) {
      ++s;
      continue;
    }
    int e = s;
    while (e < kSlotsPerHour && bits.test(e)) ++e;
    out->Add(s);
    out->Add(e);
    s = e;
  }
}

bool FromRuns(const google::protobuf::RepeatedField<int32_t>& runs, Slots* bits) {
  if (runs.size() % 2 != 0) return false;
  for (int i = 0; i < runs.size(); i += 2) {
    const int s = runs[i], e = runs[i + 1];
    if (s < 0 || e > kSlotsPerHour || s >= e) return false;
    for (int k = s; k < e; ++k) bits->set(k);
  }
  return true;
}

absl::Status Invalid(const char* why) {
  return Error(absl::StatusCode::kInvalidArgument, "SLA_EVIDENCE_INVALID", why);
}

}  // namespace

std::string EncodeEvidence(const Evidence& e) {
  v1::SlaWindowEvidence p;
  const InstanceHourWindow& w = e.window;
  p.set_gpu_count(w.gpu_count());
  for (int g = 0; g < w.gpu_count(); ++g) {
    auto* gpu = p.add_gpus();
    ToRuns(w.reported(g), gpu->mutable_reported_runs());
    ToRuns(w.unusable(g), gpu->mutable_unusable_runs());
  }
  p.set_storage_probe_count(w.storage_probe_count());
  p.set_storage_sum_bytes_per_second(w.storage_sum_bytes_per_second());
  p.set_storage_min_bytes_per_second(w.storage_min_bytes_per_second());
  p.set_latency_zero_count(w.latency().zero_count());
  for (const auto& [bucket, n] : w.latency().buckets()) {
    p.add_latency_bucket_indices(bucket);
    p.add_latency_bucket_counts(n);
  }
  for (const auto& n : e.node_names) p.add_node_names(n);
  p.set_late_samples_ignored(e.late_samples_ignored);
  return p.SerializeAsString();
}

absl::StatusOr<Evidence> DecodeEvidence(absl::Time hour_start, const std::string& bytes) {
  v1::SlaWindowEvidence p;
  if (!p.ParseFromString(bytes)) return Invalid("evidence does not parse");
  if (p.gpu_count() < 1 || p.gpu_count() > kInstanceGpusMax || p.gpus_size() != p.gpu_count()) {
    return Invalid("evidence has a bad GPU count");
  }
  if (p.latency_bucket_indices_size() != p.latency_bucket_counts_size() ||
      p.latency_bucket_indices_size() > LatencyHistogram::kBucketsMax ||
      p.storage_probe_count() < 0 || p.node_names_size() > kNodeNamesMax) {
    return Invalid("evidence has malformed aggregates");
  }
  Evidence e{InstanceHourWindow(hour_start, p.gpu_count()), {}, p.late_samples_ignored()};
  for (int g = 0; g < p.gpu_count(); ++g) {
    Slots reported, unusable;
    if (!FromRuns(p.gpus(g).reported_runs(), &reported) ||
        !FromRuns(p.gpus(g).unusable_runs(), &unusable)) {
      return Invalid("evidence has malformed slot runs");
    }
    e.window.SetGpuSlots(g, reported, unusable);
  }
  e.window.SetStorage(p.storage_probe_count(), p.storage_sum_bytes_per_second(),
                      p.storage_min_bytes_per_second());
  std::map<int, int64_t> buckets;
  for (int i = 0; i < p.latency_bucket_indices_size(); ++i) {
    buckets[p.latency_bucket_indices(i)] += p.latency_bucket_counts(i);
  }
  e.window.SetLatency(LatencyHistogram::FromBuckets(buckets, p.latency_zero_count()));
  e.node_names.assign(p.node_names().begin(), p.node_names().end());
  return e;
}

InstanceHourWindow ResizeWindow(const InstanceHourWindow& w, int gpu_count, int since_slot) {
  InstanceHourWindow out(w.hour_start(), gpu_count);
  Slots all_reported, any_unusable, before;
  all_reported.set();
  for (int g = 0; g < w.gpu_count(); ++g) {
    all_reported &= w.reported(g);
    any_unusable |= w.unusable(g);
  }
  for (int s = 0; s < std::clamp(since_slot, 0, kSlotsPerHour); ++s) before.set(s);
  for (int g = 0; g < gpu_count; ++g) {
    if (g < w.gpu_count()) {
      out.SetGpuSlots(g, w.reported(g), w.unusable(g));
    } else {
      out.SetGpuSlots(g, all_reported & before, any_unusable & before);
    }
  }
  out.SetStorage(w.storage_probe_count(), w.storage_sum_bytes_per_second(),
                 w.storage_min_bytes_per_second());
  out.SetLatency(w.latency());
  return out;
}

void MergeEvidence(Evidence& into, const Evidence& from) {
  if (from.window.gpu_count() != into.window.gpu_count()) {
    const int count = std::max(from.window.gpu_count(), into.window.gpu_count());
    if (into.window.gpu_count() != count) into.window = ResizeWindow(into.window, count, 0);
    InstanceHourWindow resized = ResizeWindow(from.window, count, 0);
    into.window.Merge(resized);
  } else {
    into.window.Merge(from.window);
  }
  std::set<std::string> nodes(into.node_names.begin(), into.node_names.end());
  nodes.insert(from.node_names.begin(), from.node_names.end());
  into.node_names.assign(nodes.begin(), nodes.end());
  if (into.node_names.size() > static_cast<size_t>(kNodeNamesMax)) {
    into.node_names.resize(kNodeNamesMax);
  }
  into.late_samples_ignored += from.late_samples_ignored;
}

}  // namespace sv::sla
