// Decision speed of the default policy: placements per second and p50/p99
// decision latency for the ITP trace's job-size mix on 1k, 5k and 10k-node
// fleets kept about 80% full, and a 128-GPU gang on a 10k-node fleet that is
// 90% full. Every timing is also printed as a ratio against baselines
// measured in the same run (a trivial first-fit scan over the same snapshot
// and a fixed reference loop), because the machines are noisy.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench_util.h"
#include "scheduler/internal/snapshot_state.h"
#include "scheduler/scheduler.h"

ABSL_FLAG(std::string, nodes, "1000,5000,10000", "fleet sizes, comma-separated");
ABSL_FLAG(int, decisions, 200000, "timed decisions per fleet size");
ABSL_FLAG(int, gang_repeats, 2000, "timed 128-GPU gang decisions");
ABSL_FLAG(int, nodes_per_leaf, 32, "nodes under one leaf switch");
ABSL_FLAG(int, leaves_per_pod, 8, "leaf switches in one pod");
ABSL_FLAG(uint64_t, seed, 1, "random seed");

namespace sv::scheduler::bench {
namespace {

// GPU counts per job over all ten ITP cluster files, from the README in
// /work/shared/data/traces ("GPU-count distribution").
struct SizeWeight {
  int gpus;
  int jobs;
};
constexpr SizeWeight kItpMix[] = {{1, 57682}, {2, 1483}, {4, 2371}, {8, 7009},
                                  {16, 381},  {32, 354}, {64, 71}};

int DrawSize(Rng& rng, bool small_only) {
  int total = 0;
  for (const SizeWeight& entry : kItpMix) {
    if (!small_only || entry.gpus <= kGpusPerNode) total += entry.jobs;
  }
  int pick = static_cast<int>(rng.Below(total));
  for (const SizeWeight& entry : kItpMix) {
    if (small_only && entry.gpus > kGpusPerNode) continue;
    if (pick < entry.jobs) return entry.gpus;
    pick -= entry.jobs;
  }
  return 1;
}

struct Fleet {
  Snapshot snapshot;
  std::vector<InstanceId> running;
  InstanceId next_id = 1;
};

double UsedShare(const Snapshot& snapshot) {
  return 1.0 - static_cast<double>(snapshot.free_gpu_count()) /
                   snapshot.ready_gpu_count();
}

void ReleaseRandom(Fleet& fleet, Rng& rng) {
  size_t pick = rng.Below(fleet.running.size());
  fleet.snapshot.Release(fleet.running[pick]);
  fleet.running[pick] = fleet.running.back();
  fleet.running.pop_back();
}

Fleet FillTo(int node_count, double share, bool small_only, Policy policy,
             Rng& rng) {
  std::vector<NodeSpec> specs = MakeFleet(node_count, absl::GetFlag(FLAGS_nodes_per_leaf),
                                          absl::GetFlag(FLAGS_leaves_per_pod));
  Fleet fleet{*Snapshot::Build(specs), {}, 1};
  Scheduler scheduler(SchedulerOptions{policy, 32, 7});
  int failures = 0;
  while (UsedShare(fleet.snapshot) < share && failures < 1000) {
    Request request{fleet.next_id++, DrawSize(rng, small_only), 0};
    if (scheduler.Place(fleet.snapshot, request).ok()) {
      fleet.running.push_back(request.instance);
    } else {
      failures++;
    }
  }
  return fleet;
}

// Every leaf keeps `free_per_leaf` whole free nodes and the rest is full, so
// a 128-GPU gang must be spread over several leaves of one pod.
Fleet ScatteredFleet(int node_count, int free_per_leaf) {
  int nodes_per_leaf = absl::GetFlag(FLAGS_nodes_per_leaf);
  std::vector<NodeSpec> specs =
      MakeFleet(node_count, nodes_per_leaf, absl::GetFlag(FLAGS_leaves_per_pod));
  Fleet fleet{*Snapshot::Build(specs), {}, 1};
  for (int node = 0; node < node_count; ++node) {
    if (node % nodes_per_leaf < free_per_leaf) continue;
    InstanceId id = fleet.next_id++;
    if (fleet.snapshot.Reserve(Placement{id, {{node, kAllGpus}}, 1}).ok()) {
      fleet.running.push_back(id);
    }
  }
  return fleet;
}

// Trivial first fit over the same snapshot records: the baseline.
NodeIndex FirstFitScan(const Snapshot& snapshot, int gpu_count) {
  const internal::SnapshotState& state = snapshot.state();
  for (NodeIndex node = 0; node < static_cast<NodeIndex>(state.nodes.size());
       ++node) {
    const internal::NodeRecord& record = state.nodes[node];
    if (record.state == NodeState::kReady &&
        internal::GpuCount(record.free) >= gpu_count) {
      return node;
    }
  }
  return -1;
}

double FirstFitMeanNanos(const Snapshot& snapshot, Rng& rng, int repeats) {
  int64_t sink = 0;
  int64_t start = NowNanos();
  for (int i = 0; i < repeats; ++i) sink += FirstFitScan(snapshot, DrawSize(rng, true));
  int64_t elapsed = NowNanos() - start;
  if (sink == 42) std::printf(" ");
  return static_cast<double>(elapsed) / repeats;
}

// Naive gang baseline: the first 16 whole free ready nodes by index.
double FirstFitGangNanos(const Snapshot& snapshot, int repeats) {
  const internal::SnapshotState& state = snapshot.state();
  int64_t sink = 0;
  int64_t start = NowNanos();
  for (int i = 0; i < repeats; ++i) {
    int found = 0;
    for (NodeIndex node = 0;
         node < static_cast<NodeIndex>(state.nodes.size()) && found < 16; ++node) {
      const internal::NodeRecord& record = state.nodes[node];
      if (record.state == NodeState::kReady && record.free == kAllGpus) {
        found++;
        sink += node;
      }
    }
  }
  int64_t elapsed = NowNanos() - start;
  if (sink == 42) std::printf(" ");
  return static_cast<double>(elapsed) / repeats;
}

// A fixed amount of plain arithmetic, to express times in machine units.
double ReferenceLoopNanos() {
  Rng rng(12345);
  uint64_t sink = 0;
  int64_t start = NowNanos();
  for (int i = 0; i < 1000; ++i) sink ^= rng.Next();
  int64_t elapsed = NowNanos() - start;
  if (sink == 42) std::printf(" ");
  return static_cast<double>(elapsed);
}

void RunMix(int node_count, Rng& rng, double reference_ns) {
  Fleet fleet = FillTo(node_count, 0.80, false, Policy::kDefault, rng);
  Scheduler scheduler(SchedulerOptions{});
  std::vector<int64_t> small_ns, gang_ns;
  int decisions = absl::GetFlag(FLAGS_decisions);
  int placed = 0;
  for (int i = 0; i < decisions; ++i) {
    Request request{fleet.next_id++, DrawSize(rng, false), 0};
    int64_t start = NowNanos();
    absl::StatusOr<Placement> placement = scheduler.Place(fleet.snapshot, request);
    int64_t elapsed = NowNanos() - start;
    (request.gpu_count <= kGpusPerNode ? small_ns : gang_ns).push_back(elapsed);
    if (placement.ok()) {
      placed++;
      fleet.running.push_back(request.instance);
    }
    while (UsedShare(fleet.snapshot) > 0.80 && !fleet.running.empty()) {
      ReleaseRandom(fleet, rng);
    }
  }
  int64_t total_ns = 0;
  for (int64_t ns : small_ns) total_ns += ns;
  for (int64_t ns : gang_ns) total_ns += ns;
  double per_second = decisions / (total_ns / 1e9);
  double mean_ns = static_cast<double>(total_ns) / decisions;
  double first_fit_ns = FirstFitMeanNanos(fleet.snapshot, rng, 20000);
  std::printf(
      "%6d nodes | %9.0f decisions/s | placed %5.1f%% | <=8 GPUs p50 %6.2f us "
      "p99 %6.2f us | gangs p50 %7.2f us p99 %7.2f us | mean %.2f us = %.2fx "
      "first-fit scan (%.2f us) = %.2fx ref loop\n",
      node_count, per_second, 100.0 * placed / decisions,
      Percentile(small_ns, 50) / 1e3, Percentile(small_ns, 99) / 1e3,
      Percentile(gang_ns, 50) / 1e3, Percentile(gang_ns, 99) / 1e3,
      mean_ns / 1e3, mean_ns / first_fit_ns, first_fit_ns / 1e3,
      mean_ns / reference_ns);
}

void TimeGang(const char* label, Fleet& fleet, double reference_ns) {
  Scheduler scheduler(SchedulerOptions{});
  std::vector<int64_t> ns;
  int ok = 0;
  int leaves = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_gang_repeats); ++i) {
    Request request{fleet.next_id++, 128, 0};
    int64_t start = NowNanos();
    absl::StatusOr<Placement> placement = scheduler.Place(fleet.snapshot, request);
    ns.push_back(NowNanos() - start);
    if (!placement.ok()) continue;
    ok++;
    leaves += placement->leaf_count;
    fleet.snapshot.Release(request.instance);
  }
  double first_fit_ns = FirstFitGangNanos(fleet.snapshot, 2000);
  std::printf(
      "128-GPU gang, %s: placed %d/%zu (mean %.1f leaves) | p50 %.2f us p99 "
      "%.2f us | p99 = %.2fx first-fit gang scan (%.2f us) = %.1fx ref loop\n",
      label, ok, ns.size(), ok ? static_cast<double>(leaves) / ok : 0.0,
      Percentile(ns, 50) / 1e3, Percentile(ns, 99) / 1e3,
      Percentile(ns, 99) / first_fit_ns, first_fit_ns / 1e3,
      Percentile(ns, 99) / reference_ns);
}

void TimeQueuePass(Fleet& fleet, Rng& rng) {
  std::vector<PendingRequest> pending;
  for (int i = 0; i < 5000; ++i) {
    pending.push_back(PendingRequest{Request{fleet.next_id++, DrawSize(rng, false), 0},
                                     "t", 0, i});
  }
  QueueOptions options;
  options.default_quota.gpus_in_use_max = 1 << 30;
  Scheduler scheduler(SchedulerOptions{});
  std::vector<int64_t> ns;
  for (int round = 0; round < 10; ++round) {
    Snapshot copy = fleet.snapshot;
    int64_t start = NowNanos();
    QueuePassResult result = scheduler.RunQueuePass(copy, pending, options);
    ns.push_back(NowNanos() - start);
    if (round == 0) {
      std::printf("queue pass, 5000 pending on 10k nodes 90%% full: placed %d, ",
                  result.placed_count);
    }
  }
  std::printf("p50 %.2f ms (with explanations)\n", Percentile(ns, 50) / 1e6);
}

}  // namespace
}  // namespace sv::scheduler::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace sv::scheduler::bench;
  Rng rng(absl::GetFlag(FLAGS_seed));
  double reference_ns = ReferenceLoopNanos();
  for (int i = 0; i < 4; ++i) reference_ns = std::min(reference_ns, ReferenceLoopNanos());
  std::printf("reference loop (1000 splitmix steps): %.2f us\n", reference_ns / 1e3);
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',')) {
    int node_count = 0;
    if (!absl::SimpleAtoi(part, &node_count) || node_count <= 0) continue;
    RunMix(node_count, rng, reference_ns);
  }
  Fleet packed = FillTo(10000, 0.90, true, sv::scheduler::Policy::kDefault, rng);
  std::printf("10k fleet filled with <=8-GPU jobs by our policy: %.1f%% used\n",
              100.0 * UsedShare(packed.snapshot));
  TimeGang("10k nodes 90% full (packed)", packed, reference_ns);
  Fleet scattered = FillTo(10000, 0.90, true, sv::scheduler::Policy::kSpread, rng);
  TimeGang("10k nodes 90% full (spread fill)", scattered, reference_ns);
  Fleet scattered_whole = ScatteredFleet(10000, 3);
  std::printf("10k fleet with 3 whole free nodes per leaf, the rest full: %.1f%% used\n",
              100.0 * UsedShare(scattered_whole.snapshot));
  TimeGang("10k nodes, 3 free per leaf", scattered_whole, reference_ns);
  TimeQueuePass(packed, rng);
  return 0;
}
