// Private: candidate generation and gang search over the snapshot indexes.
#ifndef SV_SCHEDULER_INTERNAL_SEARCH_H_
#define SV_SCHEDULER_INTERNAL_SEARCH_H_

#include <cstdint>
#include <vector>

#include "scheduler/internal/snapshot_state.h"

namespace sv::scheduler::internal {

// Where a small request's candidate nodes come from.
enum class CandidateSource {
  kFrontFirst,     // the first node in topology order that fits
  kTightestBucket, // every node of the tightest bucket that fits
  kLoosest,        // free-count buckets descending
  kIndexOrder,     // the lowest-index node that fits
  kRandom,         // one node drawn uniformly among those that fit
};

enum class GangMode {
  kTree,        // lowest switch level, then best fit across leaves
  kIndexOrder,  // the lowest-index whole free nodes
  kRandom,      // whole free nodes drawn uniformly
};

// Small, seeded and stable across platforms (unlike std distributions).
uint64_t NextRandom(uint64_t& state);

std::vector<NodeIndex> SmallCandidates(const SnapshotState& state,
                                       int gpu_count, CandidateSource source,
                                       int candidates_max, uint64_t& rng);

// Whole free nodes for a gang of node_count nodes, or empty when none fit
// within max_leaves (0: no limit) and one zone.
std::vector<NodeIndex> FindGangNodes(const SnapshotState& state,
                                     int node_count, int max_leaves,
                                     GangMode mode, uint64_t& rng);

// Chooses leaves from `leaves` to cover `need` whole free nodes: as few
// leaves as possible, the last one by best fit. Empty when impossible.
std::vector<NodeIndex> CoverWithLeaves(const SnapshotState& state,
                                       std::vector<int32_t> leaves, int need,
                                       int max_leaves);

int CountLeaves(const SnapshotState& state, const std::vector<NodeIndex>& nodes);

}  // namespace sv::scheduler::internal

#endif  // SV_SCHEDULER_INTERNAL_SEARCH_H_
