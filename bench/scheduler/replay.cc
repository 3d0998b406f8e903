// Event-driven replay of GPU job traces against every placement policy, side
// by side, with the same queue policy (priority then FIFO, backfill around
// nodes held for the oldest blocked request), then ours again moving a few
// small instances when the oldest waiting job needs whole nodes (freely, and
// by svd's move rule), then three
// rows that move jobs at will: two with free migration between nodes and
// the fluid bound without nodes. Prints one markdown table per trace and fleet size.
//
// Any CSV works: name the columns for submit time (s), duration (s) and GPU
// count with flags. The fleet is sized as a multiple of the trace's peak
// concurrent demand (every job started at its submit time), as in the
// README of /work/shared/data/traces.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <queue>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench_util.h"
#include "scheduler/scheduler.h"

ABSL_FLAG(std::vector<std::string>, trace, {},
          "CSV files to replay (default: cluster01..cluster10 in --trace_dir)");
ABSL_FLAG(std::string, trace_dir, "/work/shared/data/traces", "trace folder");
ABSL_FLAG(std::string, submit_column, "submission_time", "submit time column (s)");
ABSL_FLAG(std::string, duration_column, "duration", "duration column (s)");
ABSL_FLAG(std::string, gpus_column, "num_gpu", "GPU count column");
ABSL_FLAG(std::vector<std::string>, scales, std::vector<std::string>({"0.6", "0.8"}),
          "fleet sizes as multiples of the peak concurrent demand");
ABSL_FLAG(int, nodes_per_leaf, 16, "nodes under one leaf switch");
ABSL_FLAG(int, leaves_per_pod, 4, "leaf switches in one pod");
ABSL_FLAG(uint64_t, seed, 1, "seed for the random policy");
ABSL_FLAG(int64_t, move_running_min_s, 600,
          "svd's move rule: a job must have run this long since it started or last moved "
          "(svd --move-running-min-s)");
ABSL_FLAG(int, moves_per_pass_max, 64, "svd's move rule: moves per pass at most");

namespace sv::scheduler::bench {
namespace {

struct Job {
  int64_t submit_s = 0;
  int64_t duration_s = 0;
  int gpus = 0;
};

struct Trace {
  std::string name;
  std::vector<Job> jobs;
  int skipped = 0;
};

absl::StatusOr<Trace> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header = absl::StrSplit(absl::StripSuffix(line, "\r"), ',');
  int columns[3] = {-1, -1, -1};
  const std::string wanted[3] = {absl::GetFlag(FLAGS_submit_column),
                                 absl::GetFlag(FLAGS_duration_column),
                                 absl::GetFlag(FLAGS_gpus_column)};
  for (int c = 0; c < 3; ++c) {
    for (size_t i = 0; i < header.size(); ++i) {
      if (header[i] == wanted[c]) columns[c] = static_cast<int>(i);
    }
    if (columns[c] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": no column '", wanted[c], "'"));
    }
  }
  Trace trace;
  trace.name = path.substr(path.find_last_of('/') + 1);
  while (std::getline(in, line)) {
    std::vector<absl::string_view> cells = absl::StrSplit(absl::StripSuffix(line, "\r"), ',');
    double values[3];
    bool ok = true;
    for (int c = 0; c < 3; ++c) {
      ok = ok && columns[c] < static_cast<int>(cells.size()) &&
           absl::SimpleAtod(cells[columns[c]], &values[c]);
    }
    Job job{std::llround(values[0]), std::llround(values[1]),
            static_cast<int>(std::lround(values[2]))};
    if (!ok || job.duration_s <= 0 ||
        !ValidateRequest(Request{1, job.gpus, 0}).ok()) {
      trace.skipped++;
      continue;
    }
    trace.jobs.push_back(job);
  }
  std::stable_sort(trace.jobs.begin(), trace.jobs.end(),
                   [](const Job& a, const Job& b) { return a.submit_s < b.submit_s; });
  return trace;
}

int PeakDemand(const std::vector<Job>& jobs) {
  std::vector<std::pair<int64_t, int>> events;
  for (const Job& job : jobs) {
    events.push_back({job.submit_s, job.gpus});
    events.push_back({job.submit_s + job.duration_s, -job.gpus});
  }
  std::sort(events.begin(), events.end());  // ends (negative) first on ties
  int running = 0, peak = 0;
  for (const auto& [time, delta] : events) {
    running += delta;
    peak = std::max(peak, running);
  }
  return peak;
}

struct Outcome {
  std::string policy;
  std::vector<int64_t> start_s;  // -1: never started
  std::vector<int> leaves;
  double busy_gpu_s = 0;      // inside the arrival window
  double stranded_gpu_s = 0;  // free GPUs while a gang waited
  double gang_wait_s = 0;     // time during which some gang waited
  double queued_busy_gpu_s = 0;  // used GPUs while any job waited
  double queued_s = 0;           // time during which any job waited
  int64_t moves = 0;             // instances moved between nodes
};

// Integrates used GPUs over the arrival window and free GPUs while a gang
// waits.
class Meter {
 public:
  Meter(const std::vector<Job>& jobs, int capacity)
      : window_start_(jobs.front().submit_s),
        window_end_(jobs.back().submit_s),
        capacity_(capacity) {}
  void Advance(Outcome& outcome, int64_t from, int64_t to, int used,
               bool any_waiting, bool gang_waiting) const {
    int64_t a = std::max(from, window_start_);
    int64_t b = std::min(to, window_end_);
    if (b > a) outcome.busy_gpu_s += static_cast<double>(b - a) * used;
    if (any_waiting) {
      outcome.queued_busy_gpu_s += static_cast<double>(to - from) * used;
      outcome.queued_s += static_cast<double>(to - from);
    }
    if (gang_waiting) {
      outcome.stranded_gpu_s += static_cast<double>(to - from) * (capacity_ - used);
      outcome.gang_wait_s += static_cast<double>(to - from);
    }
  }
  int capacity() const { return capacity_; }
  double WindowGpuSeconds() const {
    return static_cast<double>(window_end_ - window_start_) * capacity_;
  }

 private:
  int64_t window_start_, window_end_;
  int capacity_;
};

using EndQueue = std::priority_queue<std::pair<int64_t, int>,
                                     std::vector<std::pair<int64_t, int>>,
                                     std::greater<>>;

// How ours may move running jobs. kStragglers: after each pass, every small
// job may move, with no limit, and the moves stay whether or not the oldest
// waiting job then starts. kSvd: svd's rule (docs/scheduler.md, "Moving
// instances"): only small jobs that have run move_running_min_s since they
// started or last moved, at most moves_per_pass_max per pass, and only when
// the oldest waiting job waits for capacity and then starts in the same pass.
enum class MoveRule { kNone, kStragglers, kSvd };

Outcome ReplayPolicy(const std::vector<Job>& jobs, int node_count,
                     Policy policy, MoveRule move_rule = MoveRule::kNone) {
  std::vector<NodeSpec> specs = MakeFleet(node_count, absl::GetFlag(FLAGS_nodes_per_leaf),
                                          absl::GetFlag(FLAGS_leaves_per_pod));
  Snapshot snapshot = *Snapshot::Build(specs);
  Scheduler scheduler(SchedulerOptions{policy, 32, absl::GetFlag(FLAGS_seed)});
  QueueOptions options;
  options.explain = false;
  options.default_quota = TenantQuota{1 << 30, 1 << 30};
  options.pending_items_max = 1 << 30;
  options.placements_per_pass_max = 1 << 30;
  Outcome outcome{std::string(PolicyName(policy)),
                  std::vector<int64_t>(jobs.size(), -1),
                  std::vector<int>(jobs.size(), 0)};
  Meter meter(jobs, node_count * kGpusPerNode);
  EndQueue ends;
  // When each job started or last moved (svd's running_since).
  std::vector<int64_t> settled_s(jobs.size(), 0);
  std::vector<PendingRequest> pending;
  size_t next = 0;
  int used = 0, gangs_waiting = 0;
  int64_t now = jobs.front().submit_s;
  while (next < jobs.size() || !ends.empty()) {
    int64_t at = next < jobs.size() ? jobs[next].submit_s : INT64_MAX;
    if (!ends.empty()) at = std::min(at, ends.top().first);
    meter.Advance(outcome, now, at, used, !pending.empty(), gangs_waiting > 0);
    now = at;
    while (!ends.empty() && ends.top().first == now) {
      int job = ends.top().second;
      ends.pop();
      snapshot.Release(job + 1);
      used -= jobs[job].gpus;
    }
    while (next < jobs.size() && jobs[next].submit_s == now) {
      pending.push_back(PendingRequest{Request{static_cast<InstanceId>(next + 1),
                                               jobs[next].gpus, 0},
                                       "trace", 0, static_cast<int64_t>(next)});
      if (jobs[next].gpus > kGpusPerNode) gangs_waiting++;
      next++;
    }
    if (pending.empty()) continue;
    auto record = [&](const QueuePassResult& pass) {
      if (pass.placed_count == 0) return;
      for (const QueueDecision& decision : pass.decisions) {
        if (!decision.placed) continue;
        int job = static_cast<int>(decision.instance - 1);
        outcome.start_s[job] = now;
        outcome.leaves[job] = decision.placement.leaf_count;
        settled_s[job] = now;
        ends.push({now + jobs[job].duration_s, job});
        used += jobs[job].gpus;
        if (jobs[job].gpus > kGpusPerNode) gangs_waiting--;
      }
      std::erase_if(pending, [&](const PendingRequest& item) {
        return outcome.start_s[item.request.instance - 1] >= 0;
      });
    };
    auto pass_once = [&] { record(scheduler.RunQueuePass(snapshot, pending, options)); };
    pass_once();
    if (move_rule == MoveRule::kSvd && !pending.empty()) {
      const InstanceId oldest = pending.front().request.instance;
      const int gpus = jobs[oldest - 1].gpus;
      if (gpus >= kGpusPerNode && snapshot.free_gpu_count() >= gpus) {
        Snapshot moved = snapshot;
        const std::vector<Move> moves = scheduler.EmptyNodes(
            moved, {gpus / kGpusPerNode,
                    [&](InstanceId id) {
                      return jobs[id - 1].gpus < kGpusPerNode &&
                             now - settled_s[id - 1] >= absl::GetFlag(FLAGS_move_running_min_s);
                    },
                    absl::GetFlag(FLAGS_moves_per_pass_max)});
        if (!moves.empty()) {
          QueuePassResult again = scheduler.RunQueuePass(moved, pending, options);
          const bool placed = std::any_of(
              again.decisions.begin(), again.decisions.end(),
              [&](const QueueDecision& d) { return d.instance == oldest && d.placed; });
          if (placed) {
            if (!moved.CheckInvariants()) {
              std::fprintf(stderr, "replay: moving instances broke the snapshot\n");
              std::abort();
            }
            // As svd writes them: one move per job, from where it was to
            // where it ends; one that ends where it started does not move.
            std::map<InstanceId, std::vector<NodeAssignment>> first_from;
            for (const Move& move : moves) first_from.try_emplace(move.instance, move.from);
            for (const auto& [id, from] : first_from) {
              if (moved.InstanceNodes(id) == from) continue;
              settled_s[id - 1] = now;
              outcome.moves++;
            }
            snapshot = std::move(moved);
            record(again);
          }
        }
      }
    }
    // The oldest waiting job takes whole nodes and the fleet has its GPUs
    // free, scattered: move small instances to empty the nodes it needs.
    if (move_rule == MoveRule::kStragglers && !pending.empty()) {
      const int gpus = jobs[pending.front().request.instance - 1].gpus;
      if (gpus >= kGpusPerNode && snapshot.free_gpu_count() >= gpus) {
        // Small instances move; 1 << 30 moves is no limit for a replay.
        const std::vector<Move> moves = scheduler.EmptyNodes(
            snapshot, {gpus / kGpusPerNode,
                       [&](InstanceId id) { return jobs[id - 1].gpus < kGpusPerNode; },
                       1 << 30});
        const int moved = static_cast<int>(moves.size());
        if (!snapshot.CheckInvariants()) {
          std::fprintf(stderr, "replay: moving instances broke the snapshot\n");
          std::abort();
        }
        if (moved > 0) {
          outcome.moves += moved;
          pass_once();
        }
      }
    }
  }
  return outcome;
}

// Three ways of moving jobs at will, each work-conserving in queue order:
// every waiting job that fits starts.
//  - kFluid: GPUs pooled with no node or switch boundaries (the fluid bound).
//  - kRelaxed and kPacked: free migration with node boundaries. At every
//    event the running jobs may be moved between nodes, but a job of up to
//    8 GPUs stays on one node and a gang takes gpus/8 whole nodes.
//    kRelaxed (an upper bound) counts the nodes any packing needs at least:
//    the gangs' nodes, plus one node per job of 5-8 GPUs (no two share one)
//    or the small jobs' GPUs / 8, whichever is more. kPacked (achievable)
//    puts the small jobs, largest first, each onto the node with the least
//    room that still holds it (best fit decreasing), on the nodes the gangs
//    leave; a set it packs can really be placed.
// Between kPacked and kRelaxed lies what any policy could reach if it moved
// instances freely; the gap from a real policy to kPacked is at most what
// migration could win back, and the gap from kRelaxed to kFluid is what
// node boundaries cost alone.
enum class Pool { kFluid, kRelaxed, kPacked };

Outcome ReplayPooled(const std::vector<Job>& jobs, int node_count, Pool mode) {
  const char* name = mode == Pool::kFluid     ? "fluid bound"
                     : mode == Pool::kRelaxed ? "free migration, node bound (relaxed)"
                                              : "free migration, packed (best fit decreasing)";
  Outcome outcome{name, std::vector<int64_t>(jobs.size(), -1), std::vector<int>(jobs.size(), 0)};
  Meter meter(jobs, node_count * kGpusPerNode);
  EndQueue ends;
  std::vector<int> pending;
  size_t next = 0;
  int used = 0, gangs_waiting = 0;
  int gang_nodes = 0, half_plus = 0, small_gpus = 0;
  std::array<int, kGpusPerNode + 1> small_count{};  // Running small jobs by size.
  auto add = [&](int gpus, int sign) {
    used += sign * gpus;
    if (gpus > kGpusPerNode) {
      gang_nodes += sign * gpus / kGpusPerNode;
      return;
    }
    small_gpus += sign * gpus;
    small_count[gpus] += sign;
    if (2 * gpus > kGpusPerNode) half_plus += sign;
  };
  auto fits = [&] {
    if (mode == Pool::kFluid) return used <= node_count * kGpusPerNode;
    const int nodes = node_count - gang_nodes;
    if (nodes < 0) return false;
    const int relaxed = std::max(half_plus, (small_gpus + kGpusPerNode - 1) / kGpusPerNode);
    if (relaxed > nodes) return false;
    if (mode == Pool::kRelaxed) return true;
    // Nodes by their free GPUs; all start empty.
    std::array<int, kGpusPerNode + 1> by_free{};
    by_free[kGpusPerNode] = nodes;
    for (int size = kGpusPerNode; size >= 1; --size) {
      for (int k = 0; k < small_count[size]; ++k) {
        int room = size;
        while (room <= kGpusPerNode && by_free[room] == 0) ++room;
        if (room > kGpusPerNode) return false;
        by_free[room]--;
        by_free[room - size]++;
      }
    }
    return true;
  };
  int64_t now = jobs.front().submit_s;
  while (next < jobs.size() || !ends.empty()) {
    int64_t at = next < jobs.size() ? jobs[next].submit_s : INT64_MAX;
    if (!ends.empty()) at = std::min(at, ends.top().first);
    meter.Advance(outcome, now, at, used, !pending.empty(), gangs_waiting > 0);
    now = at;
    while (!ends.empty() && ends.top().first == now) {
      add(jobs[ends.top().second].gpus, -1);
      ends.pop();
    }
    while (next < jobs.size() && jobs[next].submit_s == now) {
      if (jobs[next].gpus > kGpusPerNode) gangs_waiting++;
      pending.push_back(static_cast<int>(next++));
    }
    // A job that did not fit this event: no larger one fits either (a
    // larger job in its place is never easier to place), so skip them.
    int smallest_refused = INT32_MAX;
    std::erase_if(pending, [&](int job) {
      if (jobs[job].gpus >= smallest_refused) return false;
      add(jobs[job].gpus, +1);
      if (!fits()) {
        add(jobs[job].gpus, -1);
        smallest_refused = jobs[job].gpus;
        return false;
      }
      outcome.start_s[job] = now;
      ends.push({now + jobs[job].duration_s, job});
      if (jobs[job].gpus > kGpusPerNode) gangs_waiting--;
      return true;
    });
  }
  return outcome;
}

int SizeClass(int gpus) {
  if (gpus == 1) return 0;
  if (gpus <= 4) return 1;
  if (gpus == 8) return 2;
  return 3;
}

std::string Minutes(double seconds) {
  double minutes = seconds / 60.0;
  return minutes >= 100 ? absl::StrCat(std::llround(minutes))
                        : absl::StrFormat("%.1f", minutes);
}

void PrintRow(const std::vector<Job>& jobs, const Outcome& outcome,
              const Meter& meter) {
  std::vector<double> waits[4];
  std::vector<double> jct;
  int gangs = 0, gang_leaves = 0, one_leaf = 0, unplaced = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (outcome.start_s[j] < 0) {
      unplaced++;
      continue;
    }
    double wait = static_cast<double>(outcome.start_s[j] - jobs[j].submit_s);
    waits[SizeClass(jobs[j].gpus)].push_back(wait);
    jct.push_back(wait + static_cast<double>(jobs[j].duration_s));
    if (jobs[j].gpus > kGpusPerNode && outcome.leaves[j] > 0) {
      gangs++;
      gang_leaves += outcome.leaves[j];
      if (outcome.leaves[j] == 1) one_leaf++;
    }
  }
  double mean_jct = 0;
  for (double value : jct) mean_jct += value;
  mean_jct /= std::max<size_t>(1, jct.size());
  double queued_util = outcome.queued_s > 0
                           ? outcome.queued_busy_gpu_s /
                                 (outcome.queued_s * meter.capacity())
                           : 0;
  std::printf("| %s | %.1f | %.1f | %.0f |", outcome.policy.c_str(),
              100.0 * outcome.busy_gpu_s / meter.WindowGpuSeconds(),
              100.0 * queued_util, outcome.queued_s / 3600);
  for (const std::vector<double>& w : waits) {
    std::printf(" %s / %s / %s |", Minutes(Percentile(w, 50)).c_str(),
                Minutes(Percentile(w, 95)).c_str(), Minutes(Percentile(w, 99)).c_str());
  }
  std::printf(" %.2f | %.2f |", mean_jct / 3600, Percentile(jct, 99) / 3600);
  if (gangs > 0) {
    std::printf(" %.2f | %.0f%% |", static_cast<double>(gang_leaves) / gangs,
                100.0 * one_leaf / gangs);
  } else {
    std::printf(" - | - |");
  }
  double mean_free = outcome.gang_wait_s > 0 ? outcome.stranded_gpu_s / outcome.gang_wait_s : 0;
  std::printf(" %.0f (%.0f) |%s\n", outcome.stranded_gpu_s / 3600, mean_free,
              unplaced ? absl::StrCat(" unplaced ", unplaced).c_str() : "");
}

void ReplayTrace(const Trace& trace) {
  int peak = PeakDemand(trace.jobs);
  int largest = 0;
  for (const Job& job : trace.jobs) largest = std::max(largest, job.gpus);
  for (const std::string& scale_text : absl::GetFlag(FLAGS_scales)) {
    double scale = 0;
    if (!absl::SimpleAtod(scale_text, &scale) || scale <= 0) continue;
    int node_count = static_cast<int>(std::ceil(scale * peak / kGpusPerNode));
    node_count = std::max(node_count, (largest + kGpusPerNode - 1) / kGpusPerNode);
    std::printf(
        "\n### %s: %zu jobs (%d skipped), peak demand %d GPUs, fleet %gx = "
        "%d nodes (%d GPUs), %d nodes/leaf\n\n",
        trace.name.c_str(), trace.jobs.size(), trace.skipped, peak, scale,
        node_count, node_count * kGpusPerNode, absl::GetFlag(FLAGS_nodes_per_leaf));
    std::printf(
        "| policy | util %% | util while queued %% | hours queued | wait min "
        "p50/p95/p99: 1 GPU | 2-4 | 8 | 16-128 | "
        "JCT mean h | JCT p99 h | leaves/gang | gangs in 1 leaf | stranded "
        "GPU-h (mean free GPUs while a gang waits) |\n");
    std::printf("|---|---:|---:|---:|---|---|---|---|---:|---:|---:|---:|---:|\n");
    Meter meter(trace.jobs, node_count * kGpusPerNode);
    for (Policy policy : {Policy::kRandom, Policy::kFirstFit, Policy::kBestFit,
                          Policy::kSpread, Policy::kTopologyTree, Policy::kDefault}) {
      PrintRow(trace.jobs, ReplayPolicy(trace.jobs, node_count, policy), meter);
      std::fflush(stdout);
    }
    Outcome moving = ReplayPolicy(trace.jobs, node_count, Policy::kDefault,
                                  MoveRule::kStragglers);
    moving.policy = absl::StrCat("ours, moving stragglers (", moving.moves, " moves)");
    PrintRow(trace.jobs, moving, meter);
    Outcome svd_moves = ReplayPolicy(trace.jobs, node_count, Policy::kDefault, MoveRule::kSvd);
    svd_moves.policy = absl::StrCat("ours, svd's move rule (", svd_moves.moves, " moves)");
    PrintRow(trace.jobs, svd_moves, meter);
    for (Pool mode : {Pool::kPacked, Pool::kRelaxed, Pool::kFluid}) {
      PrintRow(trace.jobs, ReplayPooled(trace.jobs, node_count, mode), meter);
    }
  }
}

}  // namespace
}  // namespace sv::scheduler::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> paths = absl::GetFlag(FLAGS_trace);
  std::string dir = absl::GetFlag(FLAGS_trace_dir);
  if (paths.empty()) {
    // All ten clusters take about 2 s on one core, so the default is all.
    for (int i = 1; i <= 10; ++i) {
      paths.push_back(absl::StrFormat("%s/cluster%02d.csv", dir, i));
    }
  }
  for (const std::string& path : paths) {
    absl::StatusOr<sv::scheduler::bench::Trace> trace =
        sv::scheduler::bench::LoadTrace(path);
    if (!trace.ok()) {
      std::fprintf(stderr, "%s\n", trace.status().ToString().c_str());
      return 1;
    }
    if (trace->jobs.empty()) continue;
    sv::scheduler::bench::ReplayTrace(*trace);
  }
  return 0;
}
