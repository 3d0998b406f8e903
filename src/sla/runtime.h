#ifndef SV_SLA_RUNTIME_H_
#define SV_SLA_RUNTIME_H_

// The SLA monitor in svd (docs/sla.md): the in-memory windows, their
// checkpoints, and the judgement that turns each paid instance-hour into a
// window record and refunds.
//
//   agents --StreamTelemetry--> Monitor (memory, per instance-hour)
//                                  | every checkpoint_interval and at Stop
//                                  v
//                        sla_window_checkpoints (per replica)
//                                  | hour end + grace (+ replica allowance)
//                                  v  JudgeLoop, leader only
//            ledger charges --> Judge() --> sla_windows + sla_refund transfers

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/periodic_loop.h"
#include "sla/monitor.h"
#include "sla/sla.h"
#include "store/database.h"
#include "store/leader_loop.h"
#include "store/sla_store.h"

namespace sv::sla {

struct SlaOptions {
  MonitorOptions monitor;
  std::vector<SlaDefinition> definitions = DefaultDefinitions();
  // Names this replica's checkpoint rows; replicas must differ.
  std::string replica = "svd";
  absl::Duration checkpoint_interval = absl::Seconds(5);
  absl::Duration judge_interval = absl::Seconds(5);
  // With several replicas, each writes its closed hours at its next
  // checkpoint; the judge waits this long more so they are in.
  absl::Duration replica_flush_allowance = absl::ZeroDuration();
  // On an empty cursor, the first hour judged is this far back.
  absl::Duration first_run_lookback = absl::Hours(2);
};

struct JudgeResult {
  int64_t hours = 0;
  int64_t windows = 0;       // New window records.
  int64_t breaches = 0;      // Breached metrics.
  int64_t refunds_posted = 0;
  int64_t refund_micros = 0;
};

// The key of a refund: sla:{instance}:{hour}:{metric}, hour in Unix hours.
std::string RefundKey(const std::string& instance_id, absl::Time hour_start, Metric metric);

class Runtime {
 public:
  Runtime(store::Database& db, const Clock& clock, SlaOptions options);

  Monitor& monitor() { return monitor_; }
  store::SlaStore& store() { return store_; }
  const SlaOptions& options() const { return options_; }

  // Loads this replica's checkpoint (after a restart).
  absl::Status Restore();
  // Writes the windows that changed and the late-sample counts.
  absl::Status Checkpoint();

  // Judges every hour that is due at `now` and not judged yet.
  absl::StatusOr<JudgeResult> JudgeDue(absl::Time now);
  // Judges one hour; instance-hours already judged are skipped, and refund
  // keys already posted are replays, so running it again posts nothing.
  absl::StatusOr<JudgeResult> JudgeHour(absl::Time hour_start, absl::Time now);

  // The definitions a tenant's hours are judged on (configured + overrides).
  absl::StatusOr<std::vector<SlaDefinition>> DefinitionsFor(const std::string& tenant_id);
  std::vector<SlaDefinition> Effective(const std::vector<store::SlaOverrideRow>& rows) const;

 private:
  store::Database& db_;
  const Clock& clock_;
  SlaOptions options_;
  Monitor monitor_;
  store::SlaStore store_;
};

// Checkpoints every checkpoint_interval, on every replica, and once more
// at Stop() (shutdown), so a restart mid-hour loses no evidence.
class CheckpointLoop {
 public:
  explicit CheckpointLoop(Runtime& runtime);
  void Start() { loop_.Start(); }
  void Stop() { loop_.Stop(); }

 private:
  PeriodicLoop loop_;
};

// Judges due hours every judge_interval, only while this replica leads.
class JudgeLoop {
 public:
  JudgeLoop(Runtime& runtime, const Clock& clock);
  void SetLeaderGate(const store::LeaderGate* gate) { loop_.SetLeaderGate(gate); }
  void Start() { loop_.Start(); }
  void Stop() { loop_.Stop(); }

 private:
  void Turn();
  Runtime& runtime_;
  const Clock& clock_;
  store::LeaderLoop loop_;
};

}  // namespace sv::sla

#endif  // SV_SLA_RUNTIME_H_
