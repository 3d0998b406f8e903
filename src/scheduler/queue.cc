// The queue pass: priority then FIFO, quotas, and backfill that holds nodes
// for the oldest blocked request so that it cannot be starved.
#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "scheduler/internal/search.h"
#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler {
namespace {

using internal::SnapshotState;

std::vector<size_t> QueueOrder(std::span<const PendingRequest> pending) {
  std::vector<size_t> order(pending.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PendingRequest& x = pending[a];
    const PendingRequest& y = pending[b];
    if (x.priority != y.priority) return x.priority > y.priority;
    if (x.sequence != y.sequence) return x.sequence < y.sequence;
    return x.request.instance < y.request.instance;
  });
  return order;
}

const TenantQuota& QuotaOf(const QueueOptions& options,
                           const std::string& tenant) {
  auto found = options.tenant_quotas.find(tenant);
  return found == options.tenant_quotas.end() ? options.default_quota
                                              : found->second;
}

// Top `need` schedulable nodes of `nodes` by free GPUs, and how many GPUs
// on them are still in use (what must end before the hold is whole).
std::pair<int, std::vector<NodeIndex>> CheapestNodes(
    const SnapshotState& state, std::vector<NodeIndex> nodes, int need) {
  std::erase_if(nodes, [&](NodeIndex node) { return !state.Schedulable(node); });
  if (static_cast<int>(nodes.size()) < need) {
    return {std::numeric_limits<int>::max(), {}};
  }
  std::partial_sort(nodes.begin(), nodes.begin() + need, nodes.end(),
                    [&](NodeIndex a, NodeIndex b) {
                      int free_a = internal::GpuCount(state.nodes[a].free);
                      int free_b = internal::GpuCount(state.nodes[b].free);
                      return free_a != free_b ? free_a > free_b : a < b;
                    });
  nodes.resize(need);
  int in_use = 0;
  for (NodeIndex node : nodes) {
    in_use += kGpusPerNode - internal::GpuCount(state.nodes[node].free);
  }
  return {in_use, nodes};
}

// Nodes to hold for a blocked gang: the leaf, else pod, else zone whose
// best `need` nodes have the fewest GPUs still in use.
std::vector<NodeIndex> ChooseGangHold(const SnapshotState& state, int need,
                                      int max_leaves) {
  std::pair<int, std::vector<NodeIndex>> best{std::numeric_limits<int>::max(),
                                              {}};
  for (const internal::LeafRecord& leaf : state.leaves) {
    auto candidate = CheapestNodes(state, leaf.nodes, need);
    if (candidate.first < best.first) best = std::move(candidate);
  }
  if (!best.second.empty() || max_leaves == 1) return best.second;
  for (const internal::PodRecord& pod : state.pods) {
    std::vector<NodeIndex> nodes;
    for (int32_t leaf : pod.leaves) {
      nodes.insert(nodes.end(), state.leaves[leaf].nodes.begin(),
                   state.leaves[leaf].nodes.end());
    }
    auto candidate = CheapestNodes(state, std::move(nodes), need);
    if (candidate.first < best.first) best = std::move(candidate);
  }
  if (!best.second.empty()) return best.second;
  for (int32_t zone = 0; zone < static_cast<int32_t>(state.zones.size());
       ++zone) {
    std::vector<NodeIndex> nodes;
    for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size());
         ++node) {
      if (state.ZoneOf(node) == zone) nodes.push_back(node);
    }
    auto candidate = CheapestNodes(state, std::move(nodes), need);
    if (candidate.first < best.first) best = std::move(candidate);
  }
  return best.second;
}

std::vector<NodeIndex> ChooseHold(const SnapshotState& state,
                                  const Request& request) {
  if (request.gpu_count > kGpusPerNode) {
    std::vector<NodeIndex> nodes = ChooseGangHold(
        state, request.gpu_count / kGpusPerNode, request.max_leaves);
    // Holding nodes the request could never use would strand them for
    // nothing.
    if (request.max_leaves > 0 &&
        internal::CountLeaves(state, nodes) > request.max_leaves) {
      return {};
    }
    return nodes;
  }
  for (int free = request.gpu_count - 1; free >= 0; --free) {
    if (!state.buckets[free].empty()) {
      return {*std::min_element(state.buckets[free].begin(),
                                state.buckets[free].end())};
    }
  }
  return {};
}

// Within one pass capacity only shrinks, so once a shape fails every larger
// shape fails too; remembering that keeps a long queue cheap.
class FailureCache {
 public:
  FailureCache() { gang_nodes_.fill(std::numeric_limits<int>::max()); }
  // A pinned request's failure says nothing about other nodes, nor theirs
  // about its node, so pinned requests neither use nor feed the cache.
  bool KnownToFail(const Request& request) const {
    if (request.pinned_node >= 0) return false;
    if (request.gpu_count <= kGpusPerNode) {
      return request.gpu_count >= small_gpus_;
    }
    return request.gpu_count / kGpusPerNode >= gang_nodes_[request.max_leaves];
  }
  void Record(const Request& request) {
    if (request.pinned_node >= 0) return;
    if (request.gpu_count <= kGpusPerNode) {
      small_gpus_ = std::min(small_gpus_, request.gpu_count);
      return;
    }
    int& nodes = gang_nodes_[request.max_leaves];
    nodes = std::min(nodes, request.gpu_count / kGpusPerNode);
  }

 private:
  int small_gpus_ = kGpusPerNode + 1;
  std::array<int, kGangNodeCountMax + 1> gang_nodes_;
};

// Limits, quota and strict order, checked before trying to place. Fills in
// the decision's cause and reason and returns false when the item waits.
bool MayTry(const PendingRequest& item, int rank, int placed_count,
            int in_use, InstanceId blocked_by, const QueueOptions& options,
            QueueDecision& decision) {
  if (rank >= options.pending_items_max ||
      placed_count >= options.placements_per_pass_max) {
    decision.cause = WaitCause::kPassLimit;
    if (options.explain) decision.reason = "beyond this pass's limits";
    return false;
  }
  const TenantQuota& quota = QuotaOf(options, item.tenant);
  if (in_use + item.request.gpu_count > quota.gpus_in_use_max) {
    decision.cause = WaitCause::kQuota;
    if (options.explain) {
      decision.reason = absl::StrCat(
          "tenant ", item.tenant, " GPU quota: ", in_use, " in use + ",
          item.request.gpu_count, " requested > ", quota.gpus_in_use_max);
    }
    return false;
  }
  if (blocked_by != kNoInstance) {
    decision.cause = WaitCause::kHeldForOlder;
    if (options.explain) {
      decision.reason = absl::StrCat("waiting behind instance ", blocked_by);
    }
    return false;
  }
  return true;
}

void AssignPositions(QueuePassResult& result) {
  int position = 0;
  for (QueueDecision& decision : result.decisions) {
    decision.position = decision.placed ? 0 : ++position;
  }
}

}  // namespace

absl::Status CheckPendingQuota(const QueueOptions& options,
                               absl::string_view tenant, int pending_count) {
  const TenantQuota& quota = QuotaOf(options, std::string(tenant));
  if (pending_count >= quota.pending_count_max) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", tenant, " already has ", pending_count,
        " pending instances (quota ", quota.pending_count_max, ")"));
  }
  return absl::OkStatus();
}

QueuePassResult Scheduler::RunQueuePass(Snapshot& snapshot,
                                        std::span<const PendingRequest> pending,
                                        const QueueOptions& options) {
  QueuePassResult result;
  std::vector<size_t> order = QueueOrder(pending);
  result.decisions.resize(order.size());
  std::map<std::string, int> usage = options.tenant_gpus_in_use;
  FailureCache failures;
  // Explaining costs a scan of every node; requests of the same shape share
  // one explanation until the snapshot changes (a placement or the hold).
  std::map<std::tuple<int, int, NodeIndex>, std::string> explained;
  InstanceId blocked_by = kNoInstance;
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const PendingRequest& item = pending[order[rank]];
    const Request& request = item.request;
    QueueDecision& decision = result.decisions[rank];
    decision.instance = request.instance;
    if (absl::Status status = ValidateRequest(request); !status.ok()) {
      decision.cause = WaitCause::kInvalid;
      decision.reason = std::string(status.message());
      continue;
    }
    int& in_use = usage[item.tenant];
    if (!MayTry(item, static_cast<int>(rank), result.placed_count, in_use,
                blocked_by, options, decision)) {
      continue;
    }
    if (!failures.KnownToFail(request)) {
      absl::StatusOr<Placement> placement = Place(snapshot, request);
      if (placement.ok()) {
        decision.placed = true;
        decision.placement = *std::move(placement);
        in_use += request.gpu_count;
        result.placed_count++;
        explained.clear();
        continue;
      }
      failures.Record(request);
    }
    decision.cause = WaitCause::kNoCapacity;
    if (options.explain) {
      auto [it, inserted] = explained.try_emplace(
          std::tuple{request.gpu_count, request.max_leaves, request.pinned_node});
      if (inserted) it->second = Explain(snapshot, request);
      decision.reason = it->second;
    }
    if (!options.backfill) {
      blocked_by = request.instance;
      continue;
    }
    if (request.pinned_node >= 0) {
      if (request.pinned_node >= snapshot.node_count()) continue;
      // Only its own node can take it, so hold that node against younger
      // requests (else small backfills could starve it without limit); it
      // does not use up the one gang-sized hold below.
      const internal::NodeRecord& node = snapshot.state().nodes[request.pinned_node];
      if (node.state == NodeState::kReady && !node.held) {
        snapshot.mutable_state().SetHeld(request.pinned_node, true);
        result.held_nodes.push_back(request.pinned_node);
        explained.clear();
        if (options.explain) absl::StrAppend(&decision.reason, "; its node is held for it");
      }
      continue;
    }
    if (result.held_for != kNoInstance) continue;
    // The oldest blocked request: hold the nodes it will need, so younger
    // requests backfill only elsewhere and cannot delay it without limit.
    // One that no set of nodes could ever serve (a gang larger than any
    // zone, or than its leaf limit allows) holds nothing and leaves the
    // hold to the next: it used to take the one hold and hold nothing, and
    // every younger gang could then be starved by backfill without limit.
    const std::vector<NodeIndex> hold = ChooseHold(snapshot.state(), request);
    if (hold.empty()) continue;
    result.held_for = request.instance;
    const size_t first_new = result.held_nodes.size();
    for (NodeIndex node : hold) {
      if (!snapshot.state().nodes[node].held) result.held_nodes.push_back(node);
    }
    for (size_t i = first_new; i < result.held_nodes.size(); ++i) {
      snapshot.mutable_state().SetHeld(result.held_nodes[i], true);
    }
    explained.clear();
    if (options.explain) {
      absl::StrAppend(&decision.reason, "; ", result.held_nodes.size() - first_new,
                      " nodes held for it");
    }
  }
  for (NodeIndex node : result.held_nodes) {
    snapshot.mutable_state().SetHeld(node, false);
  }
  AssignPositions(result);
  return result;
}

absl::string_view WaitCauseName(WaitCause cause) {
  switch (cause) {
    case WaitCause::kNone:
      return "none";
    case WaitCause::kNoCapacity:
      return "no_capacity";
    case WaitCause::kHeldForOlder:
      return "held_for_older";
    case WaitCause::kQuota:
      return "quota";
    case WaitCause::kPassLimit:
      return "pass_limit";
    case WaitCause::kInvalid:
      return "invalid";
  }
  return "unknown";
}

}  // namespace sv::scheduler
