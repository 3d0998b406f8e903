// The foundation placer: tight packing, halves of four, gangs on whole
// nodes under few leaves, and reasons for whatever must wait.

#include "control/placer.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace sv::control {
namespace {

std::vector<store::FreeNode> Fleet(int nodes, int leaves) {
  std::vector<store::FreeNode> fleet;
  for (int i = 0; i < nodes; ++i) {
    store::FreeNode n;
    n.node.id = "node-" + std::to_string(i);
    n.node.name = n.node.id;
    n.node.leaf_switch = "leaf-" + std::to_string(i * leaves / nodes);
    n.node.gpu_model = "RTX 4090";
    n.node.gpu_count = 8;
    n.free_gpu_mask = 0xff;
    fleet.push_back(n);
  }
  return fleet;
}

store::PendingInstance Want(const std::string& id, int gpus) {
  return {id, "ten-a", gpus, "RTX 4090", 0, ""};
}

TEST(PlacerTest, SmallInstancesShareANodeAndStayInAHalf) {
  auto fleet = Fleet(4, 1);
  auto d = PlaceQueue(fleet, {Want("a", 2), Want("b", 2), Want("c", 4)});
  ASSERT_EQ(d.size(), 3u);
  std::set<std::string> nodes;
  for (const auto& x : d) {
    ASSERT_EQ(x.node_gpus.size(), 1u);
    nodes.insert(x.node_gpus[0].first);
    std::set<int> halves;
    for (int g : x.node_gpus[0].second) halves.insert(g / 4);
    EXPECT_EQ(halves.size(), 1u) << x.instance_id;
  }
  EXPECT_EQ(nodes.size(), 1u);  // Packed tightly: three instances, one node.
}

TEST(PlacerTest, PrefersTheFullestNodeThatFits) {
  auto fleet = Fleet(3, 1);
  fleet[1].free_gpu_mask = 0x03;  // Two GPUs free.
  fleet[2].free_gpu_mask = 0x0f;
  auto d = PlaceQueue(fleet, {Want("a", 2)});
  EXPECT_EQ(d[0].node_gpus[0].first, "node-1");
}

TEST(PlacerTest, GangUsesOneLeafWhenOneCanHoldIt) {
  auto fleet = Fleet(16, 2);  // Leaves of 8 nodes.
  fleet[0].free_gpu_mask = 0x7f;  // Leaf 0 has seven whole free nodes.
  auto d = PlaceQueue(fleet, {Want("g", 64)});
  ASSERT_EQ(d[0].node_gpus.size(), 8u);
  for (const auto& [node, gpus] : d[0].node_gpus) {
    EXPECT_GE(std::stoi(node.substr(5)), 8) << "must be in leaf-1";
    EXPECT_EQ(gpus.size(), 8u);
  }
}

TEST(PlacerTest, GangSpansLeavesOnlyWhenItMust) {
  auto fleet = Fleet(16, 4);  // Four leaves of four nodes.
  auto d = PlaceQueue(fleet, {Want("g", 64)});
  ASSERT_EQ(d[0].node_gpus.size(), 8u);
  std::set<std::string> leaves;
  for (const auto& [node, gpus] : d[0].node_gpus) {
    leaves.insert(fleet[std::stoi(node.substr(5))].node.leaf_switch);
  }
  EXPECT_EQ(leaves.size(), 2u);
}

TEST(PlacerTest, WhatCannotFitWaitsWithAReason) {
  auto fleet = Fleet(2, 1);
  fleet[0].free_gpu_mask = 0x01;
  auto d = PlaceQueue(fleet, {Want("big", 16), Want("small", 8), Want("tiny", 1)});
  EXPECT_TRUE(d[0].node_gpus.empty());
  EXPECT_NE(d[0].wait_reason.find("whole free"), std::string::npos);
  EXPECT_FALSE(d[1].node_gpus.empty());
  EXPECT_FALSE(d[2].node_gpus.empty());
  auto again = PlaceQueue(fleet, {Want("x", 8), Want("y", 8)});
  EXPECT_TRUE(again[1].node_gpus.empty());
  EXPECT_NE(again[1].wait_reason.find("no ready RTX 4090 node has 8 free GPUs"),
            std::string::npos)
      << again[1].wait_reason;
}

// Property: over random fleets and queues, no GPU is handed out twice, no
// used GPU is handed out, and each decision is all or nothing.
TEST(PlacerTest, RandomQueuesNeverDoubleBook) {
  std::mt19937 rng(42);
  const int sizes[] = {1, 2, 3, 4, 8, 16, 32, 64, 128};
  for (int round = 0; round < 200; ++round) {
    auto fleet = Fleet(1 + rng() % 40, 1 + rng() % 5);
    for (auto& n : fleet) n.free_gpu_mask = (rng() % 3 == 0) ? rng() & 0xff : 0xff;
    std::vector<store::PendingInstance> queue;
    for (int i = 0; i < 30; ++i) queue.push_back(Want("i" + std::to_string(i), sizes[rng() % 9]));
    std::map<std::string, uint8_t> free;
    for (const auto& n : fleet) free[n.node.id] = n.free_gpu_mask;
    auto decisions = PlaceQueue(fleet, queue);
    ASSERT_EQ(decisions.size(), queue.size());
    for (size_t i = 0; i < decisions.size(); ++i) {
      int total = 0;
      for (const auto& [node, gpus] : decisions[i].node_gpus) {
        for (int g : gpus) {
          ASSERT_TRUE(free[node] & (1u << g)) << "GPU handed out twice";
          free[node] &= ~(1u << g);
          ++total;
        }
      }
      EXPECT_TRUE(total == 0 || total == queue[i].gpu_count);
      EXPECT_EQ(total == 0, !decisions[i].wait_reason.empty());
    }
  }
}

}  // namespace
}  // namespace sv::control
