#ifndef SV_AGENT_TELEMETRY_COLLECTOR_H_
#define SV_AGENT_TELEMETRY_COLLECTOR_H_

// Builds the telemetry batches an agent streams to svd's
// SlaTelemetryService (docs/sla.md). GPUs are sampled every
// sample_interval of the agent's clock; storage and fabric probes run once
// per batch on a real node. A simulated node samples its scripted faults at
// each sample's own time, so a fake clock that jumps ahead still yields one
// sample per interval (bounded: at most an hour is filled in).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/fault_script.h"
#include "agent/telemetry.h"
#include "sv/v1/sla.pb.h"

namespace sv::agent {

struct CollectorOptions {
  std::string node_name;
  int gpu_count = 8;
  bool simulated = false;  // A simulated node (registered as such by the agent).
  // GPUs are sampled this often (agent clock); the SLA judges 10 s slots.
  absl::Duration sample_interval = absl::Seconds(5);
  // Real nodes: a storage write probe per running instance and telemetry
  // round, written under `probe_dir` (empty: no probes).
  std::string probe_dir;
  int64_t storage_probe_bytes = 8 << 20;
  // Fabric-latency probes: "host:port" of peer agents' --probe-listen,
  // probed each telemetry round (see fabric_probe.h).
  std::vector<std::string> probe_peers;
  int probes_per_peer = 20;
  absl::Duration probe_timeout = absl::Milliseconds(200);
  // Simulated nodes only: faults from a script, timed from `fault_epoch`.
  std::vector<Fault> faults;
  absl::Time fault_epoch;
};

class TelemetryCollector {
 public:
  // `source` may be null (no GPU telemetry); it must outlive the collector.
  TelemetryCollector(CollectorOptions options, TelemetrySource* source, absl::Time start);

  // Takes every sample due up to `now` for the instances running here.
  void Sample(absl::Time now, const std::vector<std::string>& running);
  // Real nodes: one round of storage and fabric probes, stamped `now`.
  void Probe(absl::Time now, const std::vector<std::string>& running);

  bool empty() const;
  // When the next GPU sample is due, on the agent's clock.
  absl::Time next_sample() const { return next_sample_; }
  // Enough for one message (svd takes at most 5,760 GPU samples).
  bool full() const { return batch_.gpu_samples_size() >= 2880; }
  v1::SlaTelemetryBatch Take();

 private:
  void SampleAt(absl::Time at, const std::vector<std::string>& running);
  void SimulatedProbes(absl::Time at, const FaultState& faults,
                       const std::vector<std::string>& running);

  CollectorOptions options_;
  TelemetrySource* source_;
  absl::Time next_sample_;
  absl::Duration faults_checked_ = absl::ZeroDuration();
  v1::SlaTelemetryBatch batch_;
};

// One storage write probe: `bytes` written to `path` and fsynced. `bytes`
// of the result is what reached the disk, 0 when a write or the fsync
// failed (or the file could not be made); `took`, the time it all took.
struct ProbeResult {
  int64_t bytes = 0;
  absl::Duration took;
};
ProbeResult WriteProbe(const std::string& path, int64_t bytes);

}  // namespace sv::agent

#endif  // SV_AGENT_TELEMETRY_COLLECTOR_H_
