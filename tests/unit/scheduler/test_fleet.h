// Helpers that build small fleets for the scheduler tests.
#ifndef SV_TESTS_UNIT_SCHEDULER_TEST_FLEET_H_
#define SV_TESTS_UNIT_SCHEDULER_TEST_FLEET_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace sv::scheduler::testing {

struct FleetShape {
  int zones = 1;
  int pods_per_zone = 1;
  int leaves_per_pod = 1;
  int nodes_per_leaf = 4;
};

// Nodes are numbered in topology order: node i of leaf l of pod p of zone z
// is named "z<z>-p<p>-l<l>-n<i>".
inline std::vector<NodeSpec> MakeFleet(const FleetShape& shape) {
  std::vector<NodeSpec> nodes;
  for (int z = 0; z < shape.zones; ++z) {
    for (int p = 0; p < shape.pods_per_zone; ++p) {
      for (int l = 0; l < shape.leaves_per_pod; ++l) {
        for (int n = 0; n < shape.nodes_per_leaf; ++n) {
          NodeSpec spec;
          spec.zone = absl::StrCat("z", z);
          spec.pod = absl::StrCat(spec.zone, "-p", p);
          spec.leaf = absl::StrCat(spec.pod, "-l", l);
          spec.name = absl::StrCat(spec.leaf, "-n", n);
          nodes.push_back(spec);
        }
      }
    }
  }
  return nodes;
}

// Marks the first `gpu_count` GPUs of node `index` as held by `instance`.
inline void Occupy(std::vector<NodeSpec>& nodes, int index, int gpu_count,
                   InstanceId instance) {
  for (int gpu = 0; gpu < gpu_count; ++gpu) {
    nodes[index].gpu_holders[gpu] = instance;
  }
}

inline Snapshot MustBuild(const std::vector<NodeSpec>& nodes) {
  absl::StatusOr<Snapshot> snapshot = Snapshot::Build(nodes);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return *std::move(snapshot);
}

inline int HeldGpus(const Snapshot& snapshot, InstanceId instance) {
  int count = 0;
  for (NodeIndex node = 0; node < snapshot.node_count(); ++node) {
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
      if (snapshot.gpu_holder(node, gpu) == instance) count++;
    }
  }
  return count;
}

}  // namespace sv::scheduler::testing

#endif  // SV_TESTS_UNIT_SCHEDULER_TEST_FLEET_H_
