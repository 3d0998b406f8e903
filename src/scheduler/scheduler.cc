// The scheduling pipeline: candidates, filters, weighted scores, reserve.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/internal/plugins.h"
#include "scheduler/internal/search.h"

namespace sv::scheduler {

using internal::CandidateSource;
using internal::GangMode;
using internal::SnapshotState;

struct Scheduler::Plugins {
  CandidateSource source = CandidateSource::kFrontFirst;
  GangMode gang_mode = GangMode::kTree;
  bool group_aware = true;
  std::vector<std::unique_ptr<internal::FilterPlugin>> filters;
  std::vector<internal::WeightedScore> scores;
  std::vector<std::unique_ptr<internal::ReservePlugin>> reservers;
};

namespace {

template <typename T>
internal::WeightedScore Weighted(int weight) {
  return internal::WeightedScore{std::make_unique<T>(), weight};
}

// Each policy is a choice of candidate source, scores and gang search over
// the same filters and reserve plugins.
void ConfigurePolicy(Policy policy, Scheduler::Plugins* plugins);

}  // namespace

Scheduler::Scheduler(SchedulerOptions options)
    : options_(options),
      plugins_(std::make_unique<Plugins>()),
      rng_state_(options.seed) {
  assert(options_.candidates_max >= 1 && options_.candidates_max <= 4096);
  plugins_->filters.push_back(std::make_unique<internal::PinnedNodeFilter>());
  plugins_->filters.push_back(std::make_unique<internal::NodeStateFilter>());
  plugins_->filters.push_back(std::make_unique<internal::FreeGpusFilter>());
  plugins_->reservers.push_back(std::make_unique<internal::GpuReservePlugin>());
  ConfigurePolicy(options_.policy, plugins_.get());
}

Scheduler::~Scheduler() = default;

namespace {

void ConfigurePolicy(Policy policy, Scheduler::Plugins* plugins) {
  switch (policy) {
    case Policy::kDefault:
      // Small requests: the first fitting node in topology order (see
      // docs/scheduler.md, "Why front first"); the scores then only rank
      // that single candidate, and GPU choice keeps NUMA groups whole.
      plugins->source = CandidateSource::kFrontFirst;
      plugins->scores.push_back(Weighted<internal::MostAllocatedScore>(4));
      plugins->scores.push_back(Weighted<internal::GroupFitScore>(2));
      plugins->scores.push_back(Weighted<internal::LeafPackingScore>(1));
      return;
    case Policy::kFirstFit:
      plugins->source = CandidateSource::kIndexOrder;
      plugins->gang_mode = GangMode::kIndexOrder;
      plugins->group_aware = false;
      return;
    case Policy::kBestFit:
      plugins->source = CandidateSource::kTightestBucket;
      plugins->gang_mode = GangMode::kIndexOrder;
      plugins->scores.push_back(Weighted<internal::MostAllocatedScore>(1));
      return;
    case Policy::kSpread:
      plugins->source = CandidateSource::kLoosest;
      plugins->gang_mode = GangMode::kIndexOrder;
      plugins->scores.push_back(Weighted<internal::LeastAllocatedScore>(1));
      return;
    case Policy::kRandom:
      plugins->source = CandidateSource::kRandom;
      plugins->gang_mode = GangMode::kRandom;
      plugins->group_aware = false;
      return;
    case Policy::kTopologyTree:
      plugins->source = CandidateSource::kTightestBucket;
      plugins->scores.push_back(Weighted<internal::MostAllocatedScore>(1));
      return;
  }
}

bool PassesFilters(const Scheduler::Plugins& plugins, const SnapshotState& state,
                   const Request& request, NodeIndex node) {
  for (const auto& filter : plugins.filters) {
    if (!filter->Filter(state, request, node).kept) return false;
  }
  return true;
}

}  // namespace

int Placement::gpu_count() const {
  int count = 0;
  for (const NodeAssignment& part : nodes) count += internal::GpuCount(part.gpus);
  return count;
}

absl::Status ValidateRequest(const Request& request) {
  if (request.instance <= kNoInstance) {
    return absl::InvalidArgumentError("instance id must be positive");
  }
  int count = request.gpu_count;
  if (count < 1 || count > kGpuCountMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_count must be 1 to ", kGpuCountMax, ", got ", count));
  }
  if (count > kGpusPerNode && count % kGpusPerNode != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_count above ", kGpusPerNode, " must be a multiple of ",
        kGpusPerNode, ", got ", count));
  }
  if (request.max_leaves < 0 || request.max_leaves > kGangNodeCountMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_leaves must be 0 (no limit) to ", kGangNodeCountMax));
  }
  if (request.pinned_node >= 0 && count > kGpusPerNode) {
    return absl::InvalidArgumentError(
        "a gang spans several nodes and cannot be pinned to one");
  }
  return absl::OkStatus();
}

absl::StatusOr<Placement> Scheduler::Find(const Snapshot& snapshot,
                                          const Request& request) {
  if (absl::Status status = ValidateRequest(request); !status.ok()) {
    return status;
  }
  const SnapshotState& state = snapshot.state();
  Placement placement;
  placement.instance = request.instance;
  if (request.gpu_count > kGpusPerNode) {
    std::vector<NodeIndex> nodes = internal::FindGangNodes(
        state, request.gpu_count / kGpusPerNode, request.max_leaves,
        plugins_->gang_mode, rng_state_);
    if (nodes.empty()) {
      return absl::ResourceExhaustedError(Explain(snapshot, request));
    }
    std::sort(nodes.begin(), nodes.end());
    for (NodeIndex node : nodes) {
      assert(PassesFilters(*plugins_, state, request, node));
      placement.nodes.push_back({node, kAllGpus});
    }
    placement.leaf_count = internal::CountLeaves(state, nodes);
    return placement;
  }
  std::vector<NodeIndex> candidates;
  if (request.pinned_node >= 0) {
    if (request.pinned_node < snapshot.node_count()) {
      candidates.push_back(request.pinned_node);
    }
  } else {
    candidates = internal::SmallCandidates(state, request.gpu_count, plugins_->source,
                                           options_.candidates_max, rng_state_);
  }
  std::erase_if(candidates, [&](NodeIndex node) {
    return !PassesFilters(*plugins_, state, request, node);
  });
  if (candidates.empty()) {
    return absl::ResourceExhaustedError(Explain(snapshot, request));
  }
  std::vector<int64_t> totals(candidates.size(), 0);
  std::vector<int64_t> raw(candidates.size());
  for (const internal::WeightedScore& score : plugins_->scores) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      raw[i] = score.plugin->Score(state, request, candidates[i]);
    }
    internal::AddNormalizedScores(raw, score.weight, totals);
  }
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (totals[i] > totals[best] ||
        (totals[i] == totals[best] && candidates[i] < candidates[best])) {
      best = i;
    }
  }
  NodeIndex node = candidates[best];
  placement.nodes.push_back(
      {node, internal::PickGpus(state.nodes[node].free, request.gpu_count,
                                plugins_->group_aware)});
  placement.leaf_count = 1;
  return placement;
}

absl::StatusOr<Placement> Scheduler::Place(Snapshot& snapshot,
                                           const Request& request) {
  absl::StatusOr<Placement> placement = Find(snapshot, request);
  if (!placement.ok()) return placement;
  if (absl::Status status = ReserveAll(snapshot, *placement); !status.ok()) {
    return status;
  }
  return placement;
}

absl::Status Scheduler::ReserveAll(Snapshot& snapshot,
                                   const Placement& placement) {
  for (size_t done = 0; done < plugins_->reservers.size(); ++done) {
    absl::Status status = plugins_->reservers[done]->Reserve(snapshot, placement);
    if (status.ok()) continue;
    // A failed Reserve changes nothing, so only the earlier ones roll back.
    for (size_t undo = done; undo-- > 0;) {
      plugins_->reservers[undo]->Unreserve(snapshot, placement);
    }
    return status;
  }
  return absl::OkStatus();
}

std::string Scheduler::Explain(const Snapshot& snapshot,
                               const Request& request) const {
  if (absl::Status status = ValidateRequest(request); !status.ok()) {
    return std::string(status.message());
  }
  const SnapshotState& state = snapshot.state();
  std::map<absl::string_view, int> rejected;
  int kept = 0;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    internal::FilterResult result;
    for (const auto& filter : plugins_->filters) {
      result = filter->Filter(state, request, node);
      if (!result.kept) break;
    }
    if (result.kept) {
      kept++;
    } else {
      rejected[result.reason]++;
    }
  }
  std::vector<std::pair<int, absl::string_view>> counts;
  for (const auto& [reason, count] : rejected) counts.push_back({count, reason});
  std::sort(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::string detail;
  for (const auto& [count, reason] : counts) {
    absl::StrAppend(&detail, detail.empty() ? "" : ", ", count,
                    detail.empty() ? (count == 1 ? " node " : " nodes ") : " ",
                    reason);
  }
  if (request.gpu_count <= kGpusPerNode) {
    return absl::StrCat("no node fits ", request.gpu_count, " GPUs",
                        detail.empty() ? "" : ": ", detail);
  }
  int need = request.gpu_count / kGpusPerNode;
  std::string head = absl::StrCat("no placement for ", request.gpu_count,
                                  " GPUs as ", need, " whole nodes: ", kept,
                                  " wholly free");
  if (kept >= need) {
    absl::StrAppend(&head, ", but not within ",
                    request.max_leaves > 0
                        ? absl::StrCat(request.max_leaves, " leaf switches")
                        : std::string("one zone"));
  }
  std::string result = absl::StrCat(head, detail.empty() ? "" : "; ", detail);
  // A gang larger than any zone's ready nodes waits for capacity that is not
  // there at all, not for other instances to end: say so.
  std::map<absl::string_view, int> ready_per_zone;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    const NodeInfo& info = snapshot.node(node);
    if (info.state == NodeState::kReady) ready_per_zone[info.zone]++;
  }
  int most_ready = 0;
  for (const auto& [zone, count] : ready_per_zone) most_ready = std::max(most_ready, count);
  if (most_ready < need) {
    absl::StrAppend(&result, "; the fleet has ", most_ready,
                    ready_per_zone.size() > 1 ? " ready nodes at most in one zone"
                                              : " ready nodes",
                    ", fewer than the ", need,
                    " it needs, so it waits until nodes are added or return");
  }
  return result;
}

void Scheduler::Cordon(Snapshot& snapshot, NodeIndex node) {
  snapshot.SetNodeState(node, NodeState::kCordoned);
}

DrainReport Scheduler::Drain(Snapshot& snapshot, NodeIndex node) {
  snapshot.SetNodeState(node, NodeState::kDraining);
  DrainReport report;
  report.node = node;
  for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
    InstanceId holder = snapshot.gpu_holder(node, gpu);
    if (holder != kNoInstance) report.instances_to_move.push_back(holder);
  }
  std::sort(report.instances_to_move.begin(), report.instances_to_move.end());
  report.instances_to_move.erase(std::unique(report.instances_to_move.begin(),
                                             report.instances_to_move.end()),
                                 report.instances_to_move.end());
  return report;
}

absl::string_view NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kReady:
      return "ready";
    case NodeState::kCordoned:
      return "cordoned";
    case NodeState::kDraining:
      return "draining";
    case NodeState::kDown:
      return "down";
  }
  return "unknown";
}

absl::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kDefault:
      return "ours";
    case Policy::kFirstFit:
      return "first-fit";
    case Policy::kBestFit:
      return "best-fit";
    case Policy::kSpread:
      return "spread";
    case Policy::kRandom:
      return "random";
    case Policy::kTopologyTree:
      return "topo-tree";
  }
  return "unknown";
}

}  // namespace sv::scheduler
