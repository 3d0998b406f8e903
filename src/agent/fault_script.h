#ifndef SV_AGENT_FAULT_SCRIPT_H_
#define SV_AGENT_FAULT_SCRIPT_H_

// Fault injection for simulated agents, scripted from a text file. One fault
// per line; '#' starts a comment:
//
//   <at> <node|*> <kind> [key=value ...]
//
//   30s  sim-node-001 die                      # the agent stops for good
//   10s  sim-node-002 heartbeat-loss for=45s   # sends nothing for 45 s
//   5s   sim-node-003 xid gpu=2 count=1        # an XID error on GPU 2
//   5s   *            thermal-throttle gpu=0 for=60s
//   5s   sim-node-004 power-throttle gpu=1 for=60s
//   0s   sim-node-005 slow-storage bytes_per_s=500000000 for=120s
//   0s   sim-node-006 latency-spike us=40 for=30s
//   60s  sim-node-007 telemetry-loss for=3600s # heartbeats, but no telemetry
//   0s   sim-node-008 gpu-idle for=3600s   # the tenant idles its GPUs (not a fault of ours)
//
// Times count from the start of the simulated fleet.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sv::agent {

enum class FaultKind {
  kDie, kHeartbeatLoss, kXid, kThermalThrottle, kPowerThrottle, kSlowStorage, kLatencySpike,
  kTelemetryLoss, kGpuIdle
};

struct Fault {
  absl::Duration at;
  std::string node;  // "*" for every node.
  FaultKind kind = FaultKind::kDie;
  int gpu = -1;      // -1: every GPU.
  absl::Duration duration = absl::InfiniteDuration();
  int64_t value = 0;  // count, bytes_per_s or us, by kind.
};

// What the faults of one node amount to at one moment.
struct FaultState {
  bool dead = false;
  bool heartbeats_lost = false;
  bool telemetry_lost = false;            // Heartbeats go on; samples do not.
  std::vector<int64_t> throttle_reasons;  // Per GPU.
  std::vector<int> xid_errors;            // Per GPU, fired in (previous, now].
  std::vector<bool> gpu_idle;             // Per GPU: the tenant idles it.
  int64_t storage_bytes_per_s = 0;        // 0: healthy.
  int64_t latency_spike_us = 0;           // 0: none.
};

inline constexpr int kFaultLinesMax = 10000;

// INVALID_ARGUMENT (FAULT_SCRIPT_INVALID) naming the line for a bad script.
absl::StatusOr<std::vector<Fault>> ParseFaultScript(const std::string& text);
absl::StatusOr<std::vector<Fault>> ReadFaultScript(const std::string& path);

// Faults of `node` in effect at `now` (since start); XIDs that fired after
// `previous` and at or before `now` are counted.
FaultState FaultsAt(const std::vector<Fault>& faults, const std::string& node, int gpu_count,
                    absl::Duration previous, absl::Duration now);

}  // namespace sv::agent

#endif  // SV_AGENT_FAULT_SCRIPT_H_
