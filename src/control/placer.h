#ifndef SV_CONTROL_PLACER_H_
#define SV_CONTROL_PLACER_H_

#include <vector>

#include "store/store.h"

namespace sv::control {

// Decides placements for the queue, in order, over the free GPUs. Instances
// of 1-8 GPUs go on one node, best fit (the fullest node that still fits, and
// within one half of four GPUs when the request fits there). Larger ones take
// whole free nodes, preferring the fewest leaf switches. Pure: no I/O.
std::vector<store::PlacementDecision> PlaceQueue(
    const std::vector<store::FreeNode>& nodes,
    const std::vector<store::PendingInstance>& queue);

}  // namespace sv::control

#endif  // SV_CONTROL_PLACER_H_
