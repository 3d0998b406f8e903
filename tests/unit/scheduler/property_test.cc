// Property tests: random fleets and random streams of requests, releases,
// cordons, drains, resizes and queue passes, for every policy and several
// seeds. An independent model (a plain map of GPU -> instance kept by the
// test from the decisions returned) must agree with the snapshot, and:
//   - no GPU is ever booked twice;
//   - a gang is all or nothing, on whole ready nodes;
//   - nodes that are not ready never receive new GPUs;
//   - a small request fails only if no ready node has enough free GPUs, and
//     a tree gang without a leaf limit fails only if no zone has enough
//     whole free nodes.
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "test_fleet.h"

namespace sv::scheduler {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

// GPU sizes drawn roughly like the ITP trace, with more gangs to stress them.
int DrawGpuCount(Rng& rng) {
  static constexpr int kSizes[] = {1, 1, 1, 1, 1, 2, 3, 4, 8, 8, 16, 32, 64, 128};
  return kSizes[rng.Below(static_cast<int>(std::size(kSizes)))];
}

class Model {
 public:
  using Gpu = std::pair<NodeIndex, int>;

  // Applies a placement returned by the scheduler; fails the test if any
  // GPU was already booked in the model.
  void Book(InstanceId instance, const std::vector<NodeAssignment>& parts) {
    for (const NodeAssignment& part : parts) {
      for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
        if (!(part.gpus & (1u << gpu))) continue;
        auto [it, inserted] = owner_.try_emplace(Gpu{part.node, gpu}, instance);
        ASSERT_TRUE(inserted) << "GPU " << part.node << "/" << gpu
                              << " double-booked by " << instance
                              << " and " << it->second;
      }
    }
  }
  void Free(InstanceId instance, const std::vector<NodeAssignment>& parts) {
    for (const NodeAssignment& part : parts) {
      for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
        if (!(part.gpus & (1u << gpu))) continue;
        auto it = owner_.find(Gpu{part.node, gpu});
        ASSERT_TRUE(it != owner_.end() && it->second == instance);
        owner_.erase(it);
      }
    }
  }
  void FreeAll(InstanceId instance) {
    std::erase_if(owner_, [&](const auto& entry) { return entry.second == instance; });
  }
  void ExpectMatches(const Snapshot& snapshot) const {
    int held = 0;
    for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
      for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
        InstanceId holder = snapshot.gpu_holder(node, gpu);
        auto it = owner_.find(Gpu{node, gpu});
        InstanceId expected = it == owner_.end() ? kNoInstance : it->second;
        ASSERT_EQ(holder, expected) << "node " << node << " gpu " << gpu;
        if (holder != kNoInstance) held++;
      }
    }
    ASSERT_EQ(held, static_cast<int>(owner_.size()));
  }

 private:
  std::map<Gpu, InstanceId> owner_;
};

bool AnyReadyNodeFits(const Snapshot& snapshot, int gpu_count) {
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    NodeInfo info = snapshot.node(node);
    if (info.state == NodeState::kReady &&
        __builtin_popcount(info.free_gpus) >= gpu_count) {
      return true;
    }
  }
  return false;
}

bool AnyZoneHoldsGang(const Snapshot& snapshot, int node_count) {
  std::map<std::string, int> whole_by_zone;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    NodeInfo info = snapshot.node(node);
    if (info.state == NodeState::kReady && info.free_gpus == kAllGpus) {
      whole_by_zone[std::string(info.zone)]++;
    }
  }
  for (const auto& [zone, count] : whole_by_zone) {
    if (count >= node_count) return true;
  }
  return false;
}

class Harness {
 public:
  Harness(Policy policy, uint64_t seed)
      : rng_(seed), scheduler_(SchedulerOptions{policy, 16, seed}) {
    testing::FleetShape shape{1 + rng_.Below(2), 1 + rng_.Below(3),
                              1 + rng_.Below(4), 2 + rng_.Below(8)};
    std::vector<NodeSpec> nodes = testing::MakeFleet(shape);
    snapshot_ = std::make_unique<Snapshot>(testing::MustBuild(nodes));
    policy_ = policy;
  }

  void Step() {
    int op = rng_.Below(100);
    if (op < 45) {
      PlaceOne();
    } else if (op < 75) {
      ReleaseOne();
    } else if (op < 82) {
      ChangeNodeState();
    } else if (op < 92) {
      ResizeOne();
    } else {
      QueuePass();
    }
    ASSERT_TRUE(snapshot_->CheckInvariants());
    model_.ExpectMatches(*snapshot_);
  }

 private:
  void CheckPlacement(const Request& request, const Placement& placement) {
    ASSERT_EQ(placement.gpu_count(), request.gpu_count);
    for (const NodeAssignment& part : placement.nodes) {
      ASSERT_EQ(snapshot_->node(part.node).state, NodeState::kReady);
    }
    if (request.gpu_count > kGpusPerNode) {
      ASSERT_EQ(static_cast<int>(placement.nodes.size()),
                request.gpu_count / kGpusPerNode);
      for (const NodeAssignment& part : placement.nodes) {
        ASSERT_EQ(part.gpus, kAllGpus);
      }
      if (request.max_leaves > 0) {
        ASSERT_LE(placement.leaf_count, request.max_leaves);
      }
    } else {
      ASSERT_EQ(placement.nodes.size(), 1u);
    }
  }

  void PlaceOne() {
    Request request{next_id_++, DrawGpuCount(rng_), 0};
    if (request.gpu_count > kGpusPerNode && rng_.Below(4) == 0) {
      request.max_leaves = 1 + rng_.Below(3);
    }
    // Placements are checked against the state before them.
    Snapshot before = *snapshot_;
    absl::StatusOr<Placement> placement = scheduler_.Place(*snapshot_, request);
    if (!placement.ok()) {
      ASSERT_EQ(placement.status().code(), absl::StatusCode::kResourceExhausted);
      ASSERT_EQ(snapshot_->free_gpu_count(), before.free_gpu_count());
      ExpectFailureJustified(before, request);
      return;
    }
    for (const NodeAssignment& part : placement->nodes) {
      ASSERT_EQ(before.node(part.node).free_gpus & part.gpus, part.gpus);
    }
    CheckPlacement(request, *placement);
    model_.Book(request.instance, placement->nodes);
    running_.push_back(request.instance);
  }

  void ExpectFailureJustified(const Snapshot& before, const Request& request) {
    if (request.gpu_count <= kGpusPerNode) {
      ASSERT_FALSE(AnyReadyNodeFits(before, request.gpu_count));
    } else if (request.max_leaves == 0 && (policy_ == Policy::kDefault ||
                                           policy_ == Policy::kTopologyTree)) {
      ASSERT_FALSE(AnyZoneHoldsGang(before, request.gpu_count / kGpusPerNode));
    }
  }

  void ReleaseOne() {
    if (running_.empty()) return;
    size_t pick = rng_.Below(static_cast<int>(running_.size()));
    InstanceId instance = running_[pick];
    running_.erase(running_.begin() + pick);
    snapshot_->Release(instance);
    model_.FreeAll(instance);
  }

  void ChangeNodeState() {
    NodeIndex node = rng_.Below(snapshot_->node_count());
    static constexpr NodeState kStates[] = {NodeState::kReady, NodeState::kReady,
                                            NodeState::kCordoned,
                                            NodeState::kDraining, NodeState::kDown};
    NodeState state = kStates[rng_.Below(5)];
    if (state == NodeState::kDraining) {
      DrainReport report = scheduler_.Drain(*snapshot_, node);
      for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
        InstanceId holder = snapshot_->gpu_holder(node, gpu);
        if (holder == kNoInstance) continue;
        ASSERT_TRUE(std::binary_search(report.instances_to_move.begin(),
                                       report.instances_to_move.end(), holder));
      }
      return;
    }
    snapshot_->SetNodeState(node, state);
  }

  void ResizeOne() {
    if (running_.empty()) return;
    InstanceId instance = running_[rng_.Below(static_cast<int>(running_.size()))];
    std::vector<NodeAssignment> before = snapshot_->InstanceNodes(instance);
    int target = kGpusPerNode * (1 + rng_.Below(kGangNodeCountMax));
    int free_before = snapshot_->free_gpu_count();
    absl::StatusOr<ResizeResult> result = scheduler_.Resize(*snapshot_, instance, target);
    if (!result.ok()) {
      ASSERT_EQ(snapshot_->InstanceNodes(instance), before);
      ASSERT_EQ(snapshot_->free_gpu_count(), free_before);
      return;
    }
    ASSERT_EQ(result->placement.gpu_count(), target);
    for (const NodeAssignment& part : result->added) {
      ASSERT_EQ(part.gpus, kAllGpus);
      ASSERT_EQ(snapshot_->node(part.node).state, NodeState::kReady);
    }
    model_.Free(instance, result->removed);
    model_.Book(instance, result->added);
  }

  void QueuePass() {
    std::vector<PendingRequest> pending;
    int count = 1 + rng_.Below(6);
    for (int i = 0; i < count; ++i) {
      pending.push_back(PendingRequest{Request{next_id_++, DrawGpuCount(rng_), 0},
                                       rng_.Below(2) ? "a" : "b", rng_.Below(2),
                                       static_cast<int64_t>(i)});
    }
    QueueOptions options;
    options.default_quota.gpus_in_use_max = 96;
    QueuePassResult result = scheduler_.RunQueuePass(*snapshot_, pending, options);
    ASSERT_EQ(result.decisions.size(), pending.size());
    int position = 0;
    for (const QueueDecision& decision : result.decisions) {
      if (!decision.placed) {
        ASSERT_EQ(decision.position, ++position);
        continue;
      }
      model_.Book(decision.instance, decision.placement.nodes);
      running_.push_back(decision.instance);
    }
  }

  Rng rng_;
  Scheduler scheduler_;
  std::unique_ptr<Snapshot> snapshot_;
  Policy policy_;
  Model model_;
  std::vector<InstanceId> running_;
  InstanceId next_id_ = 1;
};

class PropertyTest : public ::testing::TestWithParam<std::pair<Policy, uint64_t>> {};

TEST_P(PropertyTest, RandomStreamsKeepInvariants) {
  Harness harness(GetParam().first, GetParam().second);
  for (int step = 0; step < 1500; ++step) {
    harness.Step();
    if (::testing::Test::HasFatalFailure()) {
      FAIL() << "at step " << step;
    }
  }
}

std::vector<std::pair<Policy, uint64_t>> Params() {
  std::vector<std::pair<Policy, uint64_t>> params;
  for (Policy policy : {Policy::kDefault, Policy::kFirstFit, Policy::kBestFit,
                        Policy::kSpread, Policy::kRandom, Policy::kTopologyTree}) {
    for (uint64_t seed : {1, 2, 3, 4}) params.push_back({policy, seed});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndSeeds, PropertyTest, ::testing::ValuesIn(Params()));

}  // namespace
}  // namespace sv::scheduler
