// Private: the plugin interfaces and the built-in plugins, in the manner of
// the Kubernetes scheduler framework. A filter or score is a pure function of
// the snapshot it is handed, so what-if runs can reuse them on a copy.
#ifndef SV_SCHEDULER_INTERNAL_PLUGINS_H_
#define SV_SCHEDULER_INTERNAL_PLUGINS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler::internal {

inline constexpr int kScoreMax = 100;

struct FilterResult {
  bool kept = true;
  // Short phrase completing "N nodes ...", e.g. "short of free GPUs".
  absl::string_view reason;
};

class FilterPlugin {
 public:
  virtual ~FilterPlugin() = default;
  virtual absl::string_view Name() const = 0;
  virtual FilterResult Filter(const SnapshotState& state,
                              const Request& request, NodeIndex node) const = 0;
};

// Raw scores: higher is better. The pipeline normalizes them to 0-100 over
// the candidates and multiplies by the plugin's weight.
class ScorePlugin {
 public:
  virtual ~ScorePlugin() = default;
  virtual absl::string_view Name() const = 0;
  virtual int64_t Score(const SnapshotState& state, const Request& request,
                        NodeIndex node) const = 0;
};

// Unreserve must be idempotent: it may be called for a placement that was
// only partly reserved, or twice.
class ReservePlugin {
 public:
  virtual ~ReservePlugin() = default;
  virtual absl::string_view Name() const = 0;
  virtual absl::Status Reserve(Snapshot& snapshot,
                               const Placement& placement) = 0;
  virtual void Unreserve(Snapshot& snapshot, const Placement& placement) = 0;
};

// Rejects nodes that are cordoned, draining, down or held for an older
// request.
class NodeStateFilter final : public FilterPlugin {
 public:
  absl::string_view Name() const override { return "NodeState"; }
  FilterResult Filter(const SnapshotState& state, const Request& request,
                      NodeIndex node) const override;
};

// A pinned request (node-local volumes) keeps only its node.
class PinnedNodeFilter final : public FilterPlugin {
 public:
  absl::string_view Name() const override { return "PinnedNode"; }
  FilterResult Filter(const SnapshotState& state, const Request& request,
                      NodeIndex node) const override;
};

// Small requests need gpu_count free GPUs; gangs need a wholly free node.
class FreeGpusFilter final : public FilterPlugin {
 public:
  absl::string_view Name() const override { return "FreeGpus"; }
  FilterResult Filter(const SnapshotState& state, const Request& request,
                      NodeIndex node) const override;
};

// Kubernetes MostAllocated: GPUs in use after placing. Packs tightly.
class MostAllocatedScore final : public ScorePlugin {
 public:
  absl::string_view Name() const override { return "MostAllocated"; }
  int64_t Score(const SnapshotState& state, const Request& request,
                NodeIndex node) const override;
};

// Kubernetes LeastAllocated: GPUs left free after placing. Spreads.
class LeastAllocatedScore final : public ScorePlugin {
 public:
  absl::string_view Name() const override { return "LeastAllocated"; }
  int64_t Score(const SnapshotState& state, const Request& request,
                NodeIndex node) const override;
};

// Prefers nodes where a request of up to 4 GPUs fits inside one NUMA group,
// and best of all fills that group exactly.
class GroupFitScore final : public ScorePlugin {
 public:
  absl::string_view Name() const override { return "GroupFit"; }
  int64_t Score(const SnapshotState& state, const Request& request,
                NodeIndex node) const override;
};

// Prefers nodes in leaves with fewer wholly free nodes, so that the leaves
// best able to hold a gang stay intact.
class LeafPackingScore final : public ScorePlugin {
 public:
  absl::string_view Name() const override { return "LeafPacking"; }
  int64_t Score(const SnapshotState& state, const Request& request,
                NodeIndex node) const override;
};

// First fit: the lowest node index wins.
class LowestIndexScore final : public ScorePlugin {
 public:
  absl::string_view Name() const override { return "LowestIndex"; }
  int64_t Score(const SnapshotState& state, const Request& request,
                NodeIndex node) const override;
};

// Writes the reservation into the snapshot's GPU map.
class GpuReservePlugin final : public ReservePlugin {
 public:
  absl::string_view Name() const override { return "GpuReserve"; }
  absl::Status Reserve(Snapshot& snapshot, const Placement& placement) override;
  void Unreserve(Snapshot& snapshot, const Placement& placement) override;
};

struct WeightedScore {
  std::unique_ptr<ScorePlugin> plugin;
  int weight = 1;
};

// Normalizes raw scores to 0-100 over the candidates (min-max; all equal
// gives 0) and adds weight * normalized into totals.
void AddNormalizedScores(const std::vector<int64_t>& raw, int weight,
                         std::vector<int64_t>& totals);

// GPUs to give a small request on a node. group_aware keeps a request of up
// to 4 GPUs inside the tightest NUMA group that can hold it.
GpuMask PickGpus(GpuMask free, int gpu_count, bool group_aware);

}  // namespace sv::scheduler::internal

#endif  // SV_SCHEDULER_INTERNAL_PLUGINS_H_
