#include "control/placer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <map>

#include "absl/strings/str_cat.h"

namespace sv::control {
namespace {

constexpr int kGpusPerNode = 8;
constexpr uint8_t kHalfMasks[2] = {0x0f, 0xf0};

int FreeCount(uint8_t mask) { return std::popcount(static_cast<unsigned>(mask)); }

// Picks `count` free GPUs of a node, inside one half when one can hold them.
std::vector<int> PickGpus(uint8_t free_mask, int count) {
  uint8_t from = free_mask;
  if (count <= 4) {
    int best_half = -1;
    for (int h = 0; h < 2; ++h) {
      int in_half = FreeCount(free_mask & kHalfMasks[h]);
      if (in_half >= count &&
          (best_half < 0 || in_half < FreeCount(free_mask & kHalfMasks[best_half]))) {
        best_half = h;
      }
    }
    if (best_half >= 0) from = free_mask & kHalfMasks[best_half];
  }
  std::vector<int> gpus;
  for (int i = 0; i < kGpusPerNode && static_cast<int>(gpus.size()) < count; ++i) {
    if (from & (1u << i)) gpus.push_back(i);
  }
  assert(static_cast<int>(gpus.size()) == count);
  return gpus;
}

store::PlacementDecision PlaceSmall(std::vector<store::FreeNode>& nodes,
                                    const store::PendingInstance& p) {
  int best = -1;
  int model_nodes = 0;
  int most_free = 0;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const auto& n = nodes[i];
    if (n.node.gpu_model != p.gpu_model) continue;
    ++model_nodes;
    int free = FreeCount(n.free_gpu_mask);
    most_free = std::max(most_free, free);
    if (free < p.gpu_count) continue;
    if (best < 0 || free < FreeCount(nodes[best].free_gpu_mask)) best = i;
  }
  store::PlacementDecision d{p.id, {}, ""};
  if (best < 0) {
    d.wait_reason = absl::StrCat("waiting for capacity: no ready ", p.gpu_model,
                                 " node has ", p.gpu_count, " free GPUs (",
                                 model_nodes, " ready nodes, the emptiest has ",
                                 most_free, " free)");
    return d;
  }
  std::vector<int> gpus = PickGpus(nodes[best].free_gpu_mask, p.gpu_count);
  for (int g : gpus) nodes[best].free_gpu_mask &= ~(1u << g);
  d.node_gpus.push_back({nodes[best].node.id, gpus});
  return d;
}

store::PlacementDecision PlaceGang(std::vector<store::FreeNode>& nodes,
                                   const store::PendingInstance& p) {
  const int needed = p.gpu_count / kGpusPerNode;
  std::map<std::string, std::vector<int>> free_by_leaf;
  int free_total = 0;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const auto& n = nodes[i];
    if (n.node.gpu_model != p.gpu_model || n.node.gpu_count != kGpusPerNode ||
        n.free_gpu_mask != 0xff) {
      continue;
    }
    free_by_leaf[n.node.leaf_switch].push_back(i);
    ++free_total;
  }
  store::PlacementDecision d{p.id, {}, ""};
  if (free_total < needed) {
    d.wait_reason = absl::StrCat("waiting for capacity: needs ", needed,
                                 " whole free ", p.gpu_model, " nodes, ", free_total,
                                 " are free");
    return d;
  }
  // The fullest leaf that can hold the whole gang; else fill from the
  // leaves with the most free nodes so that the gang spans as few as possible.
  std::vector<std::pair<std::string, std::vector<int>>> leaves(free_by_leaf.begin(),
                                                               free_by_leaf.end());
  std::stable_sort(leaves.begin(), leaves.end(), [](const auto& a, const auto& b) {
    return a.second.size() < b.second.size();
  });
  std::vector<int> chosen;
  for (const auto& [leaf, idx] : leaves) {
    if (static_cast<int>(idx.size()) >= needed) {
      chosen.assign(idx.begin(), idx.begin() + needed);
      break;
    }
  }
  if (chosen.empty()) {
    for (auto it = leaves.rbegin(); it != leaves.rend(); ++it) {
      for (int i : it->second) {
        if (static_cast<int>(chosen.size()) < needed) chosen.push_back(i);
      }
    }
  }
  for (int i : chosen) {
    nodes[i].free_gpu_mask = 0;
    d.node_gpus.push_back({nodes[i].node.id, {0, 1, 2, 3, 4, 5, 6, 7}});
  }
  return d;
}

}  // namespace

std::vector<store::PlacementDecision> PlaceQueue(
    const std::vector<store::FreeNode>& snapshot,
    const std::vector<store::PendingInstance>& queue) {
  std::vector<store::FreeNode> nodes = snapshot;
  std::vector<store::PlacementDecision> decisions;
  decisions.reserve(queue.size());
  for (const auto& p : queue) {
    assert(p.gpu_count >= 1 && p.gpu_count <= 128);
    decisions.push_back(p.gpu_count <= kGpusPerNode ? PlaceSmall(nodes, p)
                                                    : PlaceGang(nodes, p));
  }
  return decisions;
}

}  // namespace sv::control
