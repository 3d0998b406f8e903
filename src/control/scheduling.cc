#include "control/scheduling.h"

#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::control {
namespace {

using scheduler::InstanceId;

// Holder of the GPU slots a node lacks (a node with fewer than 8 GPUs), so
// the library never places on them. Never a mapped id: those count from 1.
constexpr InstanceId kAbsentGpu = std::numeric_limits<InstanceId>::max();

// The library names instances by positive integers; the database by text.
class IdMap {
 public:
  InstanceId Intern(const std::string& id) {
    auto [it, inserted] = ids_.try_emplace(id, static_cast<InstanceId>(names_.size() + 1));
    if (inserted) names_.push_back(id);
    return it->second;
  }
  std::optional<InstanceId> Find(const std::string& id) const {
    auto it = ids_.find(id);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  const std::string& Name(InstanceId id) const {
    assert(id >= 1 && id <= static_cast<InstanceId>(names_.size()));
    return names_[id - 1];
  }

 private:
  std::map<std::string, InstanceId> ids_;
  std::vector<std::string> names_;
};

scheduler::NodeState ToLibrary(store::NodeState state) {
  switch (state) {
    case store::NodeState::kReady: return scheduler::NodeState::kReady;
    case store::NodeState::kCordoned: return scheduler::NodeState::kCordoned;
    case store::NodeState::kDraining: return scheduler::NodeState::kDraining;
    case store::NodeState::kDown: return scheduler::NodeState::kDown;
  }
  return scheduler::NodeState::kDown;
}

// Snapshot node i is view.nodes[i]; every reservation holder is interned.
absl::StatusOr<scheduler::Snapshot> BuildSnapshot(const store::FleetView& view, IdMap& ids) {
  std::map<std::string, size_t> index_of;
  std::vector<scheduler::NodeSpec> specs(view.nodes.size());
  for (size_t i = 0; i < view.nodes.size(); ++i) {
    const store::FleetNodeRow& n = view.nodes[i];
    index_of[n.id] = i;
    specs[i] = {n.name, n.zone, n.pod, n.leaf_switch, ToLibrary(n.state), {}};
    for (int gpu = n.gpu_count; gpu < scheduler::kGpusPerNode; ++gpu) {
      specs[i].gpu_holders[gpu] = kAbsentGpu;
    }
  }
  for (const store::ReservationRow& r : view.reservations) {
    auto it = index_of.find(r.node_id);
    if (it == index_of.end() || r.gpu_index < 0 || r.gpu_index >= scheduler::kGpusPerNode) {
      return Error(absl::StatusCode::kInternal, "FLEET_INCONSISTENT",
                   absl::StrCat("reservation of ", r.instance_id, " names an unknown GPU"));
    }
    specs[it->second].gpu_holders[r.gpu_index] = ids.Intern(r.instance_id);
  }
  auto snapshot = scheduler::Snapshot::Build(specs);
  if (!snapshot.ok()) {
    return Error(absl::StatusCode::kFailedPrecondition, "INVALID_TOPOLOGY",
                 absl::StrCat("the fleet's topology is unusable: ",
                              std::string(snapshot.status().message())));
  }
  return snapshot;
}

// The queue in library form. A pinned node that is gone maps past the
// fleet, so the request waits (the filters reject every node).
std::vector<scheduler::PendingRequest> PendingOf(const store::FleetView& view, IdMap& ids) {
  std::map<std::string, scheduler::NodeIndex> node_index;
  for (size_t i = 0; i < view.nodes.size(); ++i) {
    node_index[view.nodes[i].id] = static_cast<scheduler::NodeIndex>(i);
  }
  std::vector<scheduler::PendingRequest> pending;
  pending.reserve(view.pending.size());
  for (const store::PendingRow& p : view.pending) {
    if (!p.held_reason.empty()) continue;  // DecideQueue gives it its reason.
    scheduler::Request request{ids.Intern(p.id), p.gpu_count, p.max_leaves};
    if (!p.pinned_node_id.empty()) {
      auto it = node_index.find(p.pinned_node_id);
      request.pinned_node = it != node_index.end()
                                ? it->second
                                : static_cast<scheduler::NodeIndex>(view.nodes.size());
    }
    pending.push_back({request, p.tenant_id, p.priority, p.queue_seq});
  }
  return pending;
}

std::map<std::string, int> GpusInUse(const store::FleetView& view) {
  std::map<std::string, int> in_use;
  for (const store::ReservationRow& r : view.reservations) ++in_use[r.tenant_id];
  return in_use;
}

scheduler::TenantQuota QuotaOf(const store::FleetView& view, const std::string& tenant_id,
                               const SchedulingOptions& options) {
  auto it = view.quotas.find(tenant_id);
  if (it == view.quotas.end()) return options.default_quota;
  return {it->second.gpus_in_use_max, it->second.pending_count_max};
}

scheduler::QueueOptions QueueOptionsFor(const store::FleetView& view,
                                        const SchedulingOptions& options) {
  scheduler::QueueOptions q;
  q.default_quota = options.default_quota;
  for (const auto& [tenant, row] : view.quotas) {
    q.tenant_quotas[tenant] = {row.gpus_in_use_max, row.pending_count_max};
  }
  q.tenant_gpus_in_use = GpusInUse(view);
  // The store already bounds what a pass reads: the first queue_max
  // waiting instances and the first few of each tenant missing from them
  // (migration 0121). Every one of them may be tried.
  q.pending_items_max = static_cast<int>(view.pending.size());
  return q;
}

std::vector<store::GpuGrant> GrantsOf(const store::FleetView& view,
                                      const std::vector<scheduler::NodeAssignment>& parts) {
  std::vector<store::GpuGrant> grants;
  for (const scheduler::NodeAssignment& part : parts) {
    store::GpuGrant grant{view.nodes[part.node].id, {}};
    for (int gpu = 0; gpu < scheduler::kGpusPerNode; ++gpu) {
      if (part.gpus & (1u << gpu)) grant.gpu_indices.push_back(gpu);
    }
    grants.push_back(std::move(grant));
  }
  return grants;
}

// The library's message names its own integer ids; keep only the part
// after "GPUs: ", which says what is short.
std::string ShortageOf(const absl::Status& status) {
  const std::string message(status.message());
  const size_t at = message.find("GPUs: ");
  return at == std::string::npos ? message : message.substr(at + 6);
}

absl::Status ResizeError(const absl::Status& status, const std::string& instance_id,
                         int new_gpu_count) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return Error(status.code(), "INVALID_GPU_COUNT",
                   "gpu_count for a resize must be a multiple of 8 from 8 to 128");
    case absl::StatusCode::kResourceExhausted:
      return Error(status.code(), "INSUFFICIENT_CAPACITY",
                   absl::StrCat("cannot grow ", instance_id, " to ", new_gpu_count,
                                " GPUs: ", ShortageOf(status)));
    default:
      return Error(absl::StatusCode::kFailedPrecondition, "NOT_WHOLE_NODES",
                   absl::StrCat("instance ", instance_id,
                                " does not hold whole nodes; only instances of 8 GPUs "
                                "or more on whole nodes can be resized"));
  }
}

// Users read the cause first, then the library's detail (which filter
// rejected how many nodes, or which quota binds).
std::string WaitReason(const scheduler::QueueDecision& d) {
  const char* cause = "waiting";
  switch (d.cause) {
    case scheduler::WaitCause::kNoCapacity: cause = "waiting for capacity"; break;
    case scheduler::WaitCause::kQuota: cause = "waiting for quota"; break;
    case scheduler::WaitCause::kHeldForOlder: cause = "waiting in queue order"; break;
    case scheduler::WaitCause::kPassLimit: cause = "waiting for the next pass"; break;
    case scheduler::WaitCause::kInvalid: cause = "cannot be placed"; break;
    case scheduler::WaitCause::kNone: break;
  }
  return d.reason.empty() ? cause : absl::StrCat(cause, ": ", d.reason);
}

// Growth is a request that arrives now, so it goes behind the queue: a
// queue pass runs first on the snapshot (its placements stay reserved there)
// and the nodes it holds for the oldest blocked gang are fenced off, so a
// resize can never take what the queue is owed.
absl::Status ServeQueueFirst(const store::FleetView& view, IdMap& ids,
                             scheduler::Scheduler& scheduler, const SchedulingOptions& options,
                             scheduler::Snapshot& snapshot) {
  if (view.pending.empty()) return absl::OkStatus();
  std::vector<scheduler::PendingRequest> pending = PendingOf(view, ids);
  scheduler::QueueOptions queue = QueueOptionsFor(view, options);
  queue.explain = false;
  scheduler::QueuePassResult pass = scheduler.RunQueuePass(snapshot, pending, queue);
  for (scheduler::NodeIndex node : pass.held_nodes) {
    if (snapshot.node(node).state == scheduler::NodeState::kReady) {
      snapshot.SetNodeState(node, scheduler::NodeState::kCordoned);
    }
  }
  return absl::OkStatus();
}

// After a pass: if the oldest waiting request needs whole nodes, waits for
// capacity, and the fleet has its GPUs free but scattered, movable small
// instances are moved (on a copy of the snapshot) until enough nodes are
// empty, and the pass runs again for what still waits. The moves are kept
// only if that second pass places the request they were made for;
// otherwise nothing moves. `pass` becomes the pass's decisions in queue
// order (the first pass's placements, then the second pass's decisions).
std::vector<scheduler::Move> MoveForOldestWaiting(
    const store::FleetView& view, IdMap& ids, const SchedulingOptions& options,
    scheduler::Scheduler& scheduler, const std::vector<scheduler::PendingRequest>& pending,
    const scheduler::QueueOptions& queue, scheduler::Snapshot& snapshot,
    scheduler::QueuePassResult& pass, int& for_gpu_count) {
  if (!options.move_instances || view.movable.empty()) return {};
  const auto oldest = std::find_if(pass.decisions.begin(), pass.decisions.end(),
                                   [](const scheduler::QueueDecision& d) { return !d.placed; });
  if (oldest == pass.decisions.end() || oldest->cause != scheduler::WaitCause::kNoCapacity) {
    return {};
  }
  const auto request = std::find_if(
      pending.begin(), pending.end(),
      [&](const scheduler::PendingRequest& p) { return p.request.instance == oldest->instance; });
  assert(request != pending.end());
  const int gpu_count = request->request.gpu_count;
  if (gpu_count < scheduler::kGpusPerNode || request->request.pinned_node >= 0 ||
      snapshot.free_gpu_count() < gpu_count) {
    return {};
  }
  std::set<InstanceId> movable;
  for (const std::string& id : view.movable) {
    if (auto known = ids.Find(id); known.has_value()) movable.insert(*known);
  }
  scheduler::Snapshot moved = snapshot;
  std::vector<scheduler::Move> moves = scheduler.EmptyNodes(
      moved, {gpu_count / scheduler::kGpusPerNode,
              [&](InstanceId id) { return movable.contains(id); }, options.moves_per_pass_max});
  if (moves.empty()) return {};
  // The second pass sees what the first placed: those requests are gone
  // from the queue and their GPUs count against their tenants' quotas.
  std::set<InstanceId> placed;
  for (const scheduler::QueueDecision& d : pass.decisions) {
    if (d.placed) placed.insert(d.instance);
  }
  std::vector<scheduler::PendingRequest> rest;
  scheduler::QueueOptions after = queue;
  for (const scheduler::PendingRequest& p : pending) {
    if (!placed.contains(p.request.instance)) {
      rest.push_back(p);
    } else {
      after.tenant_gpus_in_use[p.tenant] += p.request.gpu_count;
    }
  }
  scheduler::QueuePassResult again = scheduler.RunQueuePass(moved, rest, after);
  const bool oldest_placed =
      std::any_of(again.decisions.begin(), again.decisions.end(),
                  [&](const scheduler::QueueDecision& d) {
                    return d.instance == oldest->instance && d.placed;
                  });
  if (!oldest_placed) return {};
  for_gpu_count = gpu_count;
  std::vector<scheduler::QueueDecision> decisions;
  for (scheduler::QueueDecision& d : pass.decisions) {
    if (d.placed) decisions.push_back(std::move(d));
  }
  for (scheduler::QueueDecision& d : again.decisions) decisions.push_back(std::move(d));
  pass.decisions = std::move(decisions);
  snapshot = std::move(moved);
  return moves;
}

}  // namespace

absl::StatusOr<std::vector<store::QueueVerdict>> DecideQueue(const store::FleetView& view,
                                                             const SchedulingOptions& options) {
  IdMap ids;
  SV_ASSIGN_OR_RETURN(scheduler::Snapshot snapshot, BuildSnapshot(view, ids));
  std::vector<scheduler::PendingRequest> pending = PendingOf(view, ids);
  scheduler::Scheduler scheduler(options.scheduler);
  const scheduler::QueueOptions queue = QueueOptionsFor(view, options);
  scheduler::QueuePassResult pass = scheduler.RunQueuePass(snapshot, pending, queue);
  int waiting_gpus = 0;
  const std::vector<scheduler::Move> moves = MoveForOldestWaiting(
      view, ids, options, scheduler, pending, queue, snapshot, pass, waiting_gpus);
  std::vector<store::QueueVerdict> verdicts;
  verdicts.reserve(pass.decisions.size() + moves.size());
  // An instance can move more than once in one call (A to B, then B on to
  // C): the database sees one move, from where it was to where it ends. One
  // that ends where it started does not move.
  std::vector<InstanceId> order;
  std::map<InstanceId, std::pair<std::vector<scheduler::NodeAssignment>,
                                 std::vector<scheduler::NodeAssignment>>> net;
  for (const scheduler::Move& move : moves) {
    auto [it, first] = net.try_emplace(move.instance, move.from, move.to.nodes);
    if (first) {
      order.push_back(move.instance);
    } else {
      it->second.second = move.to.nodes;
    }
  }
  for (InstanceId id : order) {
    const auto& [from, to] = net.at(id);
    if (from == to) continue;
    store::QueueVerdict v;
    v.instance_id = ids.Name(id);
    v.grants = GrantsOf(view, to);
    v.moved_from = GrantsOf(view, from);
    // Another tenant's instance may be the one waiting: name only its size.
    v.reason = absl::StrCat("to free whole nodes for a waiting ", waiting_gpus, "-GPU instance");
    verdicts.push_back(std::move(v));
  }
  for (const scheduler::QueueDecision& d : pass.decisions) {
    store::QueueVerdict v;
    v.instance_id = ids.Name(d.instance);
    if (d.placed) {
      v.grants = GrantsOf(view, d.placement.nodes);
    } else {
      v.queue_position = d.position;
      v.reason = WaitReason(d);
    }
    verdicts.push_back(std::move(v));
  }
  for (const store::PendingRow& p : view.pending) {
    if (p.held_reason.empty()) continue;
    store::QueueVerdict v;
    v.instance_id = p.id;
    v.reason = absl::StrCat("waiting for its volume: ", p.held_reason);
    verdicts.push_back(std::move(v));
  }
  return verdicts;
}

absl::StatusOr<store::ResizeVerdict> DecideResize(const store::FleetView& view,
                                                  const std::string& instance_id,
                                                  const std::string& tenant_id,
                                                  int new_gpu_count, int max_leaves,
                                                  const SchedulingOptions& options) {
  IdMap ids;
  SV_ASSIGN_OR_RETURN(scheduler::Snapshot snapshot, BuildSnapshot(view, ids));
  std::optional<InstanceId> id = ids.Find(instance_id);
  if (!id.has_value()) {
    return Error(absl::StatusCode::kFailedPrecondition, "INSTANCE_HOLDS_NO_GPUS",
                 absl::StrCat("instance ", instance_id, " holds no GPUs"));
  }
  const int old_gpu_count = static_cast<int>(snapshot.InstanceNodes(*id).size()) *
                            scheduler::kGpusPerNode;
  const int in_use = GpusInUse(view)[tenant_id];
  const scheduler::TenantQuota quota = QuotaOf(view, tenant_id, options);
  if (new_gpu_count > old_gpu_count &&
      in_use + new_gpu_count - old_gpu_count > quota.gpus_in_use_max) {
    return Error(absl::StatusCode::kResourceExhausted, "QUOTA_EXCEEDED",
                 absl::StrCat("the tenant's GPU quota is ", quota.gpus_in_use_max, "; ",
                              in_use, " in use, the resize needs ",
                              new_gpu_count - old_gpu_count, " more"));
  }
  scheduler::Scheduler scheduler(options.scheduler);
  if (new_gpu_count > old_gpu_count) {
    SV_RETURN_IF_ERROR(ServeQueueFirst(view, ids, scheduler, options, snapshot));
  }
  auto result = scheduler.Resize(snapshot, *id, new_gpu_count, max_leaves);
  if (!result.ok()) return ResizeError(result.status(), instance_id, new_gpu_count);
  return store::ResizeVerdict{GrantsOf(view, result->added), GrantsOf(view, result->removed)};
}

absl::Status CheckAdmission(const store::AdmissionView& view, const std::string& tenant_id,
                            const SchedulingOptions& options) {
  if (view.request_seen) return absl::OkStatus();
  scheduler::QueueOptions q;
  q.default_quota = options.default_quota;
  if (view.quota.has_value()) {
    q.tenant_quotas[tenant_id] = {view.quota->gpus_in_use_max, view.quota->pending_count_max};
  }
  absl::Status status = scheduler::CheckPendingQuota(q, tenant_id, view.pending_count);
  if (status.ok()) return status;
  return Error(absl::StatusCode::kResourceExhausted, "QUOTA_EXCEEDED",
               std::string(status.message()));
}

Scheduling::Scheduling(store::Database& db, SchedulingOptions options)
    : store_(db), options_(options) {}

absl::StatusOr<store::PassOutcome> Scheduling::RunPass(absl::Time now, bool wait_for_lock) {
  store::BeforeCommitHook hook;
  if (options_.crash_after_decide) {
    hook = [] {
      spdlog::critical("control: fault SV_FAULT_CRASH_AFTER_DECIDE: exiting before commit");
      spdlog::default_logger()->flush();
      _exit(kCrashAfterDecideExitCode);
    };
  }
  auto outcome = store_.RunQueuePass(
      [this](const store::FleetView& view) { return DecideQueue(view, options_); },
      options_.queue_max, now, hook, wait_for_lock,
      options_.move_instances ? std::optional(options_.move_running_min) : std::nullopt);
  return outcome;
}

absl::Status CheckResizeGpuCount(int new_gpu_count) {
  if (new_gpu_count < scheduler::kGpusPerNode || new_gpu_count > scheduler::kGpuCountMax ||
      new_gpu_count % scheduler::kGpusPerNode != 0) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_GPU_COUNT",
                 "gpu_count for a resize must be a multiple of 8 from 8 to 128");
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Scheduling::Resize(const std::string& tenant_id, const std::string& id,
                                       int new_gpu_count, absl::Time now,
                                       const store::CreateGate& gate,
                                       std::optional<store::CreateRefusal>* refusal) {
  SV_RETURN_IF_ERROR(CheckResizeGpuCount(new_gpu_count));
  return store_.ResizeInstance(
      tenant_id, id, new_gpu_count, options_.queue_max,
      [this](const store::FleetView& view, const std::string& instance,
             const std::string& tenant, int gpus, int max_leaves) {
        return DecideResize(view, instance, tenant, gpus, max_leaves, options_);
      },
      now, gate, refusal);
}

absl::Status Scheduling::Admit(const std::string& tenant_id, const std::string& request_id) {
  SV_ASSIGN_OR_RETURN(store::AdmissionView view, store_.LoadAdmission(tenant_id, request_id));
  return CheckAdmission(view, tenant_id, options_);
}

}  // namespace sv::control
