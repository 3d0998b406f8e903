#ifndef SV_AGENT_FABRIC_PROBE_H_
#define SV_AGENT_FABRIC_PROBE_H_

// Fabric-latency probes between node agents: every agent answers UDP echo
// probes on --probe-listen, and measures one-way latency (half the round
// trip) to its --probe-peers each telemetry round. The SLA judges the p99.

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sla/latency_histogram.h"

namespace sv::agent {

class ProbeResponder {
 public:
  ProbeResponder() = default;
  ~ProbeResponder();
  // Binds host:port (port 0 picks one) and answers on a thread of its own.
  absl::Status Start(const std::string& listen_address);
  void Stop();
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

struct ProbeRound {
  std::vector<int64_t> one_way_ns;  // Answered probes.
  int lost = 0;                     // Unanswered within the timeout.
};

// Sends `probes_per_peer` probes to each "host:port" peer, one at a time.
// A malformed peer address is an error; an unreachable peer only loses
// probes. Bounded: at most 64 peers and 100 probes each.
absl::StatusOr<ProbeRound> ProbePeers(const std::vector<std::string>& peers,
                                      int probes_per_peer, absl::Duration timeout);

// The round as a mergeable histogram (sla::LatencyHistogram, 1% relative
// error). Lost probes count as `lost_as` (the probe timeout): a dropped
// probe is as bad as a very slow one for the tenant.
sla::LatencyHistogram FabricHistogram(const ProbeRound& round, absl::Duration lost_as);

}  // namespace sv::agent

#endif  // SV_AGENT_FABRIC_PROBE_H_
