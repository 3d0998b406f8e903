#ifndef SV_AGENT_AGENT_H_
#define SV_AGENT_AGENT_H_

// svagent's core: holds the stream to svd, reconnects with backoff, and
// reconciles what svd wants running against what the runtime runs.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/instance_record.h"
#include "agent/fault_script.h"
#include "agent/runtime_driver.h"
#include "agent/telemetry.h"
#include "agent/telemetry_collector.h"
#include "common/clock.h"

namespace sv::agent {

// The collector's options (node name, GPU count, simulated, sampling,
// probes and the fault script) are the agent's own; the agent adds how it
// reaches svd, where the node sits, and its timings.
struct AgentOptions : CollectorOptions {
  std::string endpoint;    // host:port of svd.
  std::string credential;  // svn_<id>_<secret>.
  std::string ca_pem;      // PEM CA bundle: TLS to svd trusting it; empty: plaintext.
  // PEM client certificate and key for svd's --tls-client-ca (mutual TLS).
  std::string client_cert_pem;
  std::string client_key_pem;
  std::string zone = "zone-a";
  std::string pod = "pod-1";
  std::string leaf_switch = "leaf-1";
  std::string gpu_model = "RTX 4090";
  absl::Duration heartbeat_interval = absl::Seconds(5);
  absl::Duration telemetry_interval = absl::Seconds(10);
  absl::Duration runtime_poll_interval = absl::Seconds(1);
  absl::Duration reconnect_backoff_min = absl::Milliseconds(200);
  absl::Duration reconnect_backoff_max = absl::Seconds(10);
  absl::Duration rpc_connect_timeout = absl::Seconds(5);
  // Where the agent keeps its instances' runs and the instances that ended
  // while svd still wanted them (agent/instance_record.h), so that a
  // restarted svagent neither starts a finished job again nor adopts an old
  // run's process as a new one; empty: in memory only (simulated agents).
  std::string record_file;
};

class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<RuntimeDriver> driver,
        std::unique_ptr<TelemetrySource> telemetry, const Clock& clock);
  ~Agent();

  // Runs until Stop() or a scripted death.
  void Run();
  // Thread-safe; makes Run() return soon.
  void Stop();

  // For tests and logs: how many times the stream was (re)established.
  int sessions() const { return sessions_.load(); }

 private:
  class Session;
  bool Sleep(absl::Duration d);  // False when stopping.
  // The session's loop sleeps until its next timer, or until its reader
  // nudges it (a new desired set): Nudges() before looking at what changed,
  // then SleepUnlessNudged() with that count, so no nudge is missed.
  uint64_t Nudges();
  void Nudge();
  bool SleepUnlessNudged(absl::Duration d, uint64_t seen);  // False when stopping.

  AgentOptions options_;
  std::unique_ptr<RuntimeDriver> driver_;
  std::unique_ptr<TelemetrySource> telemetry_;
  const Clock& clock_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  uint64_t nudges_ = 0;  // Guarded by mutex_.
  std::atomic<int> sessions_{0};
  // What the agent knows of its instances beyond the runtime, kept across
  // connections, and with options_.record_file across processes
  // (agent/instance_record.h). Touched only by the sessions' loop, one
  // session at a time; SaveRecord() after each change.
  // - The run each instance was started (or last confirmed) under. It was
  //   the connection's own: after a reconnect the agent took an old run's
  //   process for the run svd now wanted, even when svd had stopped the
  //   instance and placed it again on other GPUs while the agent was away,
  //   and the GPUs it still used were another tenant's.
  // - Instances that ended by themselves while svd still wanted them: the
  //   runtime forgets an ended instance, so one whose exit report a broken
  //   stream lost was started again by the next connection's first pass,
  //   and svd never heard it had ended.
  using Ended = EndedInstance;
  InstanceRecord record_;
  std::map<std::string, int64_t>& runs_ = record_.runs;
  std::map<std::string, Ended>& ended_ = record_.ended;
  void SaveRecord();
  // What each running instance has mounted (hot attach and detach); kept
  // across connections like ended_, and touched by the same loop only.
  std::map<std::string, std::vector<VolumeMap>> mounted_;
};

}  // namespace sv::agent

#endif  // SV_AGENT_AGENT_H_
