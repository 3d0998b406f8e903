#include "agent/telemetry_collector.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "agent/fabric_probe.h"
#include "google/protobuf/util/time_util.h"
#include "sla/latency_histogram.h"
#include "spdlog/spdlog.h"

namespace sv::agent {
namespace {

using google::protobuf::util::TimeUtil;

// A fake clock may jump ahead by days; only the last hour is filled in.
constexpr absl::Duration kBackfillMax = absl::Hours(1);
constexpr int64_t kHealthyStorageBytesPerSecond = 4'000'000'000;

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

}  // namespace

ProbeResult WriteProbe(const std::string& path, int64_t bytes) {
  const absl::Time start = absl::Now();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return {0, absl::Now() - start};
  std::string block(1 << 20, 'x');
  int64_t written = 0;
  bool failed = false;
  while (written < bytes && !failed) {
    const ssize_t n =
        write(fd, block.data(), std::min<int64_t>(bytes - written, block.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed = true;
    } else {
      written += n;
    }
  }
  if (fsync(fd) != 0) failed = true;
  close(fd);
  unlink(path.c_str());
  return {failed ? 0 : written, absl::Now() - start};
}

namespace {

void AddHistogram(v1::SlaTelemetryBatch& batch, const std::string& id, absl::Time at,
                  const sla::LatencyHistogram& h) {
  auto* out = batch.add_latency();
  out->set_instance_id(id);
  *out->mutable_sample_time() = ToProto(at);
  out->set_zero_count(h.zero_count());
  for (const auto& [bucket, n] : h.buckets()) {
    out->add_bucket_indices(bucket);
    out->add_bucket_counts(n);
  }
}

}  // namespace

TelemetryCollector::TelemetryCollector(CollectorOptions options, TelemetrySource* source,
                                       absl::Time start)
    : options_(std::move(options)), source_(source), next_sample_(start) {}

bool TelemetryCollector::empty() const {
  return batch_.gpu_samples_size() == 0 && batch_.storage_probes_size() == 0 &&
         batch_.latency_size() == 0;
}

v1::SlaTelemetryBatch TelemetryCollector::Take() { return std::exchange(batch_, {}); }

void TelemetryCollector::Sample(absl::Time now, const std::vector<std::string>& running) {
  if (next_sample_ < now - kBackfillMax) next_sample_ = now - kBackfillMax;
  while (next_sample_ <= now && !full()) {
    SampleAt(next_sample_, running);
    next_sample_ += options_.sample_interval;
  }
}

void TelemetryCollector::SampleAt(absl::Time at, const std::vector<std::string>& running) {
  FaultState faults;
  if (options_.simulated) {
    const absl::Duration since = at - options_.fault_epoch;
    faults = FaultsAt(options_.faults, options_.node_name, options_.gpu_count, faults_checked_,
                      since);
    faults_checked_ = since;
    // Silent nodes send nothing for that time, and nothing is made up later.
    if (faults.dead || faults.heartbeats_lost || faults.telemetry_lost) return;
    if (auto* sim = dynamic_cast<SimulatedTelemetry*>(source_)) {
      std::vector<SimulatedGpuFaults> gpu(options_.gpu_count);
      for (int g = 0; g < options_.gpu_count; ++g) {
        gpu[g] = {faults.throttle_reasons[g], faults.xid_errors[g], faults.gpu_idle[g]};
      }
      sim->SetFaults(gpu);
    }
  }
  if (source_ != nullptr) {
    auto readings = source_->Sample();
    if (readings.ok()) {
      for (const GpuReading& r : *readings) {
        auto* s = batch_.add_gpu_samples();
        s->set_gpu_index(r.gpu_index);
        *s->mutable_sample_time() = ToProto(at);
        s->set_utilization_pct(r.utilization_pct);
        s->set_memory_used_bytes(r.memory_used_bytes);
        s->set_memory_total_bytes(r.memory_total_bytes);
        s->set_temperature_c(r.temperature_c);
        s->set_power_mw(r.power_mw);
        s->set_throttle_reasons(r.throttle_reasons);
        s->set_xid_errors(r.xid_errors);
        s->set_ecc_uncorrected_errors(r.ecc_uncorrected_errors);
      }
    } else {
      spdlog::warn("agent: {}: GPU sample failed: {}", options_.node_name,
                   readings.status().ToString());
    }
  }
  if (options_.simulated) SimulatedProbes(at, faults, running);
}

void TelemetryCollector::SimulatedProbes(absl::Time at, const FaultState& faults,
                                         const std::vector<std::string>& running) {
  // Healthy simulated storage writes 4 GB/s and the fabric answers in 2-3
  // us; slow-storage and latency-spike faults change that.
  const int64_t rate = faults.storage_bytes_per_s > 0 ? faults.storage_bytes_per_s
                                                      : kHealthyStorageBytesPerSecond;
  sla::LatencyHistogram fabric;
  fabric.Record(2'500, 95);
  fabric.Record(3'500, 5);
  if (faults.latency_spike_us > 0) fabric.Record(faults.latency_spike_us * 1000, 20);
  for (const std::string& id : running) {
    auto* p = batch_.add_storage_probes();
    p->set_instance_id(id);
    *p->mutable_probe_time() = ToProto(at);
    p->set_bytes_written(options_.storage_probe_bytes);
    p->set_duration_us(std::max<int64_t>(1, options_.storage_probe_bytes * 1'000'000 / rate));
    AddHistogram(batch_, id, at, fabric);
  }
}

void TelemetryCollector::Probe(absl::Time now, const std::vector<std::string>& running) {
  if (options_.simulated || running.empty()) return;
  // One round of fabric probes per batch; every instance on this node
  // shares the node's fabric.
  if (!options_.probe_peers.empty()) {
    auto round = ProbePeers(options_.probe_peers, options_.probes_per_peer,
                            options_.probe_timeout);
    if (round.ok()) {
      const sla::LatencyHistogram h = FabricHistogram(*round, options_.probe_timeout);
      for (const std::string& id : running) AddHistogram(batch_, id, now, h);
    } else {
      spdlog::warn("agent: {}: fabric probes: {}", options_.node_name,
                   round.status().ToString());
    }
  }
  if (options_.probe_dir.empty() || options_.storage_probe_bytes <= 0) return;
  for (const std::string& id : running) {
    // A probe whose writes or fsync failed is sent as 0 bytes (0 B/s): the
    // full size over the time to the first error read as very fast storage,
    // so a disk that refused every write passed the promise.
    const ProbeResult probe =
        WriteProbe(options_.probe_dir + "/.sv-probe-" + id, options_.storage_probe_bytes);
    auto* p = batch_.add_storage_probes();
    p->set_instance_id(id);
    *p->mutable_probe_time() = ToProto(now);
    p->set_bytes_written(probe.bytes);
    p->set_duration_us(std::max<int64_t>(1, absl::ToInt64Microseconds(probe.took)));
  }
}

}  // namespace sv::agent
