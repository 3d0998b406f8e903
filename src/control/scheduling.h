#ifndef SV_CONTROL_SCHEDULING_H_
#define SV_CONTROL_SCHEDULING_H_

// Wires the pure scheduler library (sv_scheduler) to PostgreSQL: the adapter
// functions turn a store::FleetView into a scheduler::Snapshot and queue,
// and map the library's decisions back to database ids; Scheduling runs
// them inside SchedulingStore's transactions.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/scheduler.h"
#include "store/scheduling_store.h"

namespace sv::control {

struct SchedulingOptions {
  scheduler::SchedulerOptions scheduler;
  // Applies to tenants without a tenant_quotas row. The pending default
  // matches the store's limit of 1,000 unfinished instances per tenant, so
  // only an operator's quota tightens it.
  scheduler::TenantQuota default_quota{1024, 1000};
  int queue_max = 1000;  // pending instances read per pass
  // Moving instances (docs/scheduler.md, "Moving instances"): when the
  // oldest waiting request needs whole nodes and the fleet has its GPUs
  // free but scattered, a pass may move movable small instances that have
  // run at least move_running_min, at most moves_per_pass_max of them, and
  // only when the waiting request is placed by the same pass.
  bool move_instances = true;
  absl::Duration move_running_min = absl::Minutes(10);
  int moves_per_pass_max = 64;
  // Test-only fault: _exit() after a pass has written its decisions and
  // before it commits. svd sets it from SV_FAULT_CRASH_AFTER_DECIDE=1.
  bool crash_after_decide = false;
};

// Exit code of the crash_after_decide fault, so a test can tell it apart.
inline constexpr int kCrashAfterDecideExitCode = 86;

// ---- The adapter (pure; unit-tested without a database) ---------------------

// The queue pass: every pending instance of the view gets a verdict, placed
// (with its GPUs) or waiting (with its position and reason). Instances of
// view.movable that move get a verdict too (QueueVerdict::moved_from).
absl::StatusOr<std::vector<store::QueueVerdict>> DecideQueue(
    const store::FleetView& view, const SchedulingOptions& options);

// INVALID_ARGUMENT / INVALID_GPU_COUNT unless `new_gpu_count` is a size a
// resize can reach: a multiple of 8 from 8 to 128.
absl::Status CheckResizeGpuCount(int new_gpu_count);

// Grows or shrinks a whole-node instance held in the view; growth keeps it
// within `max_leaves` leaf switches (0: no limit). Fails with
// INVALID_ARGUMENT / FAILED_PRECONDITION / RESOURCE_EXHAUSTED and a reason.
absl::StatusOr<store::ResizeVerdict> DecideResize(const store::FleetView& view,
                                                  const std::string& instance_id,
                                                  const std::string& tenant_id,
                                                  int new_gpu_count, int max_leaves,
                                                  const SchedulingOptions& options);

// RESOURCE_EXHAUSTED / QUOTA_EXCEEDED when a new create would exceed the
// tenant's pending quota; a retry of an accepted create always passes.
absl::Status CheckAdmission(const store::AdmissionView& view, const std::string& tenant_id,
                            const SchedulingOptions& options);

// ---- Running it against the database ------------------------------------------

class Scheduling {
 public:
  Scheduling(store::Database& db, SchedulingOptions options);

  // One queue pass; returns how many instances were placed and how many
  // stay waiting.
  // With wait_for_lock false, returns at once (lock_busy) when another pass
  // holds the placement lock.
  absl::StatusOr<store::PassOutcome> RunPass(absl::Time now, bool wait_for_lock = true);
  // Returns the GPU count before the resize.
  // Growth is held to `gate` (store::SchedulingStore::ResizeInstance).
  absl::StatusOr<int> Resize(const std::string& tenant_id, const std::string& id,
                             int new_gpu_count, absl::Time now,
                             const store::CreateGate& gate = {},
                             std::optional<store::CreateRefusal>* refusal = nullptr);
  absl::Status Admit(const std::string& tenant_id, const std::string& request_id);

  store::SchedulingStore& store() { return store_; }
  const SchedulingOptions& options() const { return options_; }

 private:
  store::SchedulingStore store_;
  SchedulingOptions options_;
};

}  // namespace sv::control

#endif  // SV_CONTROL_SCHEDULING_H_
