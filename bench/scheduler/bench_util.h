// Small helpers shared by the scheduler benchmarks.
#ifndef SV_BENCH_SCHEDULER_BENCH_UTIL_H_
#define SV_BENCH_SCHEDULER_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler::bench {

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
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

inline int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The p-th percentile (0-100) by nearest rank; 0 for an empty sample.
template <typename T>
T Percentile(std::vector<T> values, double p) {
  if (values.empty()) return T{};
  size_t rank = static_cast<size_t>(p / 100.0 * (values.size() - 1) + 0.5);
  std::nth_element(values.begin(), values.begin() + rank, values.end());
  return values[rank];
}

// A fleet of `node_count` nodes, nodes_per_leaf to a leaf, leaves_per_pod
// to a pod, one zone; names follow the unit tests' convention.
inline std::vector<NodeSpec> MakeFleet(int node_count, int nodes_per_leaf,
                                       int leaves_per_pod) {
  std::vector<NodeSpec> nodes;
  nodes.reserve(node_count);
  for (int i = 0; i < node_count; ++i) {
    int leaf = i / nodes_per_leaf;
    int pod = leaf / leaves_per_pod;
    NodeSpec spec;
    spec.zone = "z0";
    spec.pod = absl::StrCat("z0-p", pod);
    spec.leaf = absl::StrCat(spec.pod, "-l", leaf);
    spec.name = absl::StrCat(spec.leaf, "-n", i);
    nodes.push_back(std::move(spec));
  }
  return nodes;
}

}  // namespace sv::scheduler::bench

#endif  // SV_BENCH_SCHEDULER_BENCH_UTIL_H_
