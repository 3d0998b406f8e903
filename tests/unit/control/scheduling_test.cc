// The adapter between the database's view of the fleet and sv_scheduler:
// ids map back to the right rows, node states and partial nodes are
// respected, quotas and admission hold, resize keeps the instance, and over
// random fleets no verdict ever double-books a GPU or splits a gang.
#include "control/scheduling.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "common/status.h"

namespace sv::control {
namespace {

using store::FleetView;
using store::NodeState;

// `nodes` nodes named n00.., `per_leaf` per leaf switch, all in one pod.
FleetView Fleet(int nodes, int per_leaf) {
  FleetView view;
  for (int i = 0; i < nodes; ++i) {
    std::string name = absl::StrCat("n", i < 10 ? "0" : "", i);
    view.nodes.push_back({absl::StrCat("id-", name), name, "z1", "p1",
                          absl::StrCat("leaf", i / per_leaf), 8, NodeState::kReady});
  }
  return view;
}

void Reserve(FleetView& view, int node, const std::string& instance, const std::string& tenant,
             std::vector<int> gpus) {
  for (int gpu : gpus) {
    view.reservations.push_back({view.nodes[node].id, gpu, instance, tenant});
  }
}

void ReserveWhole(FleetView& view, int node, const std::string& instance,
                  const std::string& tenant) {
  Reserve(view, node, instance, tenant, {0, 1, 2, 3, 4, 5, 6, 7});
}

void Queue(FleetView& view, const std::string& id, int gpus, int64_t seq,
           const std::string& tenant = "t1") {
  view.pending.push_back({id, tenant, gpus, 0, 0, seq, {}});
}

int GrantedGpus(const store::QueueVerdict& v) {
  int total = 0;
  for (const auto& g : v.grants) total += static_cast<int>(g.gpu_indices.size());
  return total;
}

std::map<std::string, store::QueueVerdict> ById(const std::vector<store::QueueVerdict>& vs) {
  std::map<std::string, store::QueueVerdict> by_id;
  for (const auto& v : vs) by_id[v.instance_id] = v;
  return by_id;
}

TEST(DecideQueueTest, PlacesOnFreeGpusAndNamesDatabaseIds) {
  FleetView view = Fleet(2, 2);
  ReserveWhole(view, 0, "ins-busy", "t1");
  Queue(view, "ins-new", 8, 1);
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 1u);
  const auto& v = (*verdicts)[0];
  EXPECT_EQ(v.instance_id, "ins-new");
  ASSERT_EQ(v.grants.size(), 1u);
  EXPECT_EQ(v.grants[0].node_id, "id-n01");
  EXPECT_EQ(v.grants[0].gpu_indices, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(v.queue_position, 0);
}

// An instance with a node-local volume goes to that volume's node (by
// database id), even where the default policy would pick another; a node
// that no longer exists leaves it waiting with the reason.
TEST(DecideQueueTest, NodeLocalVolumePinsThePlacement) {
  FleetView view = Fleet(3, 3);
  Queue(view, "ins-pinned", 2, 1);
  view.pending.back().pinned_node_id = "id-n02";
  Queue(view, "ins-free", 2, 2);
  Queue(view, "ins-gone", 1, 3);
  view.pending.back().pinned_node_id = "id-removed";
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  auto by_id = ById(*verdicts);
  ASSERT_EQ(by_id["ins-pinned"].grants.size(), 1u);
  EXPECT_EQ(by_id["ins-pinned"].grants[0].node_id, "id-n02");
  ASSERT_EQ(by_id["ins-free"].grants.size(), 1u);
  EXPECT_EQ(by_id["ins-free"].grants[0].node_id, "id-n00");
  EXPECT_TRUE(by_id["ins-gone"].grants.empty());
  EXPECT_NE(by_id["ins-gone"].reason.find("not the node that holds its node-local volumes"),
            std::string::npos)
      << by_id["ins-gone"].reason;
}

TEST(DecideQueueTest, UnschedulableNodesGetNothing) {
  FleetView view = Fleet(4, 4);
  view.nodes[0].state = NodeState::kCordoned;
  view.nodes[1].state = NodeState::kDraining;
  view.nodes[2].state = NodeState::kDown;
  ReserveWhole(view, 3, "ins-busy", "t1");
  Queue(view, "ins-a", 1, 1);
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok());
  const auto& v = (*verdicts)[0];
  EXPECT_TRUE(v.grants.empty());
  EXPECT_EQ(v.queue_position, 1);
  EXPECT_EQ(v.reason.rfind("waiting for capacity: ", 0), 0u) << v.reason;
}

TEST(DecideQueueTest, MissingGpuSlotsOfSmallNodesAreNeverGranted) {
  FleetView view = Fleet(1, 1);
  view.nodes[0].gpu_count = 6;
  Queue(view, "ins-a", 4, 1);
  Queue(view, "ins-b", 2, 2);
  Queue(view, "ins-c", 1, 3);
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok());
  auto by_id = ById(*verdicts);
  std::set<int> used;
  for (const auto& [id, v] : by_id) {
    for (const auto& g : v.grants) {
      for (int gpu : g.gpu_indices) {
        EXPECT_LT(gpu, 6) << id;
        EXPECT_TRUE(used.insert(gpu).second) << "GPU " << gpu << " granted twice";
      }
    }
  }
  EXPECT_EQ(GrantedGpus(by_id["ins-a"]), 4);
  EXPECT_EQ(GrantedGpus(by_id["ins-b"]), 2);
  EXPECT_TRUE(by_id["ins-c"].grants.empty());  // 6 slots, all taken
}

TEST(DecideQueueTest, OlderGangIsNotOvertakenBySmallInstances) {
  // Three of four nodes free; the 32-GPU gang needs all four. The small
  // instances behind it must not take the free nodes it waits for.
  FleetView view = Fleet(4, 4);
  ReserveWhole(view, 0, "ins-blocker", "t1");
  Queue(view, "ins-gang", 32, 1);
  for (int i = 0; i < 5; ++i) Queue(view, absl::StrCat("ins-small", i), 1, 2 + i);
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok());
  auto by_id = ById(*verdicts);
  EXPECT_TRUE(by_id["ins-gang"].grants.empty());
  EXPECT_EQ(by_id["ins-gang"].queue_position, 1);
  for (int i = 0; i < 5; ++i) {
    const auto& v = by_id[absl::StrCat("ins-small", i)];
    EXPECT_TRUE(v.grants.empty()) << v.instance_id << " took a held node";
    EXPECT_EQ(v.queue_position, 2 + i);
  }
}

TEST(DecideQueueTest, TenantGpuQuotaHoldsBackItsInstances) {
  FleetView view = Fleet(4, 4);
  ReserveWhole(view, 0, "ins-running", "t1");
  view.quotas["t1"] = {"t1", 8, 10};
  Queue(view, "ins-over", 1, 1, "t1");
  Queue(view, "ins-other", 1, 2, "t2");
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok());
  auto by_id = ById(*verdicts);
  EXPECT_TRUE(by_id["ins-over"].grants.empty());
  EXPECT_EQ(by_id["ins-over"].reason.rfind("waiting for quota: ", 0), 0u)
      << by_id["ins-over"].reason;
  EXPECT_EQ(GrantedGpus(by_id["ins-other"]), 1);
}

TEST(DecideQueueTest, PriorityGoesFirst) {
  FleetView view = Fleet(1, 1);
  Queue(view, "ins-old", 8, 1);
  Queue(view, "ins-urgent", 8, 2);
  view.pending[1].priority = 10;
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok());
  auto by_id = ById(*verdicts);
  EXPECT_EQ(GrantedGpus(by_id["ins-urgent"]), 8);
  EXPECT_TRUE(by_id["ins-old"].grants.empty());
}

TEST(DecideQueueTest, EmptyFleetKeepsEverythingWaiting) {
  FleetView view;  // no agent has registered yet
  Queue(view, "ins-a", 1, 1);
  Queue(view, "ins-b", 64, 2);
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 2u);
  for (const auto& v : *verdicts) {
    EXPECT_TRUE(v.grants.empty());
    EXPECT_GT(v.queue_position, 0);
    EXPECT_FALSE(v.reason.empty());
  }
}

// The store bounds what a pass reads (queue_max rows in queue order, and
// the first few of each tenant missing from them: migration 0121); every
// row it read is tried, those past queue_max included (they were left
// "waiting for the next pass", so a tenant hidden behind a full head was
// read and never placed).
TEST(DecideQueueTest, EveryRequestTheStoreReadIsTried) {
  FleetView view = Fleet(4, 4);
  for (int i = 0; i < 3; ++i) Queue(view, absl::StrCat("ins-", i), 1, i);
  SchedulingOptions options;
  options.queue_max = 2;
  auto verdicts = DecideQueue(view, options);
  ASSERT_TRUE(verdicts.ok());
  auto by_id = ById(*verdicts);
  EXPECT_EQ(GrantedGpus(by_id["ins-0"]), 1);
  EXPECT_EQ(GrantedGpus(by_id["ins-1"]), 1);
  EXPECT_EQ(GrantedGpus(by_id["ins-2"]), 1) << by_id["ins-2"].reason;
}

TEST(DecideQueueTest, MalformedTopologyIsAnErrorNotACrash) {
  FleetView view = Fleet(2, 2);
  view.nodes[1].pod = "p2";  // leaf0 now sits in two pods
  Queue(view, "ins-a", 1, 1);
  auto verdicts = DecideQueue(view, {});
  EXPECT_EQ(verdicts.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(verdicts.status()), "INVALID_TOPOLOGY");
}

// Two half-used nodes and a waiting 8-GPU instance: the movable
// instances of one node move to the other, and the waiting instance gets the
// emptied node in the same pass.
FleetView HalfUsedPair() {
  FleetView view = Fleet(2, 2);
  Reserve(view, 0, "ins-a", "t1", {0, 1});
  Reserve(view, 0, "ins-b", "t1", {2, 3});
  Reserve(view, 1, "ins-c", "t2", {0, 1, 2});
  Reserve(view, 1, "ins-d", "t2", {3});
  Queue(view, "ins-big", 8, 1, "t3");
  return view;
}

TEST(DecideQueueTest, MovableInstancesMakeRoomForAWaitingWholeNode) {
  FleetView view = HalfUsedPair();
  view.movable = {"ins-c", "ins-d"};
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  auto by_id = ById(*verdicts);
  ASSERT_EQ(by_id.count("ins-big"), 1u);
  ASSERT_EQ(by_id["ins-big"].grants.size(), 1u);
  EXPECT_EQ(by_id["ins-big"].grants[0].node_id, "id-n01");
  EXPECT_TRUE(by_id["ins-big"].moved_from.empty());
  std::set<std::pair<std::string, int>> taken;
  for (const char* id : {"ins-c", "ins-d"}) {
    const store::QueueVerdict& v = by_id[id];
    ASSERT_EQ(v.moved_from.size(), 1u) << id;
    EXPECT_EQ(v.moved_from[0].node_id, "id-n01");
    ASSERT_EQ(v.grants.size(), 1u) << id;
    EXPECT_EQ(v.grants[0].node_id, "id-n00");
    EXPECT_EQ(v.grants[0].gpu_indices.size(), v.moved_from[0].gpu_indices.size());
    for (int gpu : v.grants[0].gpu_indices) {
      EXPECT_GE(gpu, 4) << id << " landed on a GPU ins-a or ins-b holds";
      EXPECT_TRUE(taken.insert({v.grants[0].node_id, gpu}).second);
    }
    // Names the size waited for, never the other tenant's id (the store
    // puts the nodes before it).
    EXPECT_EQ(v.reason, "to free whole nodes for a waiting 8-GPU instance");
    EXPECT_EQ(v.reason.find("ins-big"), std::string::npos) << v.reason;
  }
  EXPECT_EQ(by_id.count("ins-a"), 0u);
  EXPECT_EQ(by_id.count("ins-b"), 0u);
}

TEST(DecideQueueTest, NothingMovesWithoutConsentOrWhenMovesAreOff) {
  FleetView view = HalfUsedPair();
  view.movable = {"ins-c"};  // ins-d's tenant did not agree: its node stays.
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 1u);
  EXPECT_TRUE((*verdicts)[0].grants.empty());
  EXPECT_EQ((*verdicts)[0].queue_position, 1);

  view.movable = {"ins-c", "ins-d"};
  SchedulingOptions off;
  off.move_instances = false;
  verdicts = DecideQueue(view, off);
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 1u);
  EXPECT_TRUE((*verdicts)[0].grants.empty());
}

// Moves are kept only if the instance they are for is then placed: a
// 16-GPU gang needs two whole nodes; moving ins-d empties n02, but ins-a
// and ins-b cannot move, so no second node empties and nothing moves.
TEST(DecideQueueTest, NoMoveUnlessTheWaitingInstanceIsPlaced) {
  FleetView view = Fleet(3, 3);
  Reserve(view, 0, "ins-a", "t1", {0});
  Reserve(view, 1, "ins-b", "t1", {0});
  Reserve(view, 2, "ins-d", "t2", {0, 1});
  Queue(view, "ins-gang", 16, 1, "t3");
  view.movable = {"ins-d"};
  auto verdicts = DecideQueue(view, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 1u);
  EXPECT_EQ((*verdicts)[0].instance_id, "ins-gang");
  EXPECT_TRUE((*verdicts)[0].grants.empty());

  // A request waiting for its quota, not for capacity, moves nothing.
  FleetView quota = HalfUsedPair();
  quota.movable = {"ins-c", "ins-d"};
  quota.quotas["t3"] = {"t3", 4, 10};
  verdicts = DecideQueue(quota, {});
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 1u);
  EXPECT_TRUE((*verdicts)[0].grants.empty());
  EXPECT_TRUE((*verdicts)[0].moved_from.empty());
}

// The per-pass limit: three movable instances on the node to empty and a
// limit of two leave everything where it is.
TEST(DecideQueueTest, MovesPerPassAreBounded) {
  FleetView view = Fleet(2, 2);
  Reserve(view, 0, "ins-a", "t1", {0, 1, 2, 3});
  Reserve(view, 1, "ins-c", "t2", {0});
  Reserve(view, 1, "ins-d", "t2", {1});
  Reserve(view, 1, "ins-e", "t2", {2});
  Queue(view, "ins-big", 8, 1, "t3");
  view.movable = {"ins-c", "ins-d", "ins-e"};
  SchedulingOptions options;
  options.moves_per_pass_max = 2;
  auto verdicts = DecideQueue(view, options);
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  ASSERT_EQ(verdicts->size(), 1u);
  EXPECT_TRUE((*verdicts)[0].grants.empty());
  options.moves_per_pass_max = 3;
  verdicts = DecideQueue(view, options);
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  EXPECT_EQ(verdicts->size(), 4u);
  EXPECT_EQ(ById(*verdicts)["ins-big"].grants.size(), 1u);
}

// Random fleets, reservations and queues: an independent check of every
// verdict against the view.
TEST(DecideQueueTest, RandomFleetsNeverDoubleBookOrSplitGangs) {
  std::mt19937 rng(20261129);
  const int sizes[] = {1, 2, 4, 8, 16, 24, 32, 64};
  for (int round = 0; round < 200; ++round) {
    const int node_count = 1 + static_cast<int>(rng() % 24);
    FleetView view = Fleet(node_count, 1 + static_cast<int>(rng() % 8));
    std::map<std::string, NodeState> state_of;
    for (auto& n : view.nodes) {
      n.state = static_cast<NodeState>(rng() % 5 == 0 ? 1 + rng() % 3 : 0);
      state_of[n.id] = n.state;
    }
    std::set<std::pair<std::string, int>> taken;
    for (int node = 0; node < node_count; ++node) {
      for (int gpu = 0; gpu < 8; ++gpu) {
        if (rng() % 3 == 0) {
          Reserve(view, node, absl::StrCat("ins-r", node, "-", gpu), "t9", {gpu});
          taken.insert({view.nodes[node].id, gpu});
        }
      }
    }
    std::map<std::string, int> asked;
    const int queue_length = static_cast<int>(rng() % 12);
    for (int i = 0; i < queue_length; ++i) {
      std::string id = absl::StrCat("ins-q", i);
      asked[id] = sizes[rng() % 8];
      Queue(view, id, asked[id], i, absl::StrCat("t", rng() % 3));
    }
    auto verdicts = DecideQueue(view, {});
    ASSERT_TRUE(verdicts.ok()) << verdicts.status();
    ASSERT_EQ(static_cast<int>(verdicts->size()), queue_length);
    for (const auto& v : *verdicts) {
      if (v.grants.empty()) {
        EXPECT_GT(v.queue_position, 0);
        continue;
      }
      EXPECT_EQ(GrantedGpus(v), asked[v.instance_id]) << "gang split or oversized";
      for (const auto& g : v.grants) {
        EXPECT_EQ(state_of[g.node_id], NodeState::kReady);
        if (asked[v.instance_id] > 8) {
          EXPECT_EQ(g.gpu_indices.size(), 8u);
        }
        for (int gpu : g.gpu_indices) {
          EXPECT_TRUE(taken.insert({g.node_id, gpu}).second)
              << g.node_id << "/" << gpu << " booked twice in round " << round;
        }
      }
    }
  }
}

TEST(DecideResizeTest, GrowsNearTheInstanceAndShrinksBack) {
  FleetView view = Fleet(16, 8);
  ReserveWhole(view, 9, "ins-gang", "t1");  // leaf1
  auto grow = DecideResize(view, "ins-gang", "t1", 64, 0, {});
  ASSERT_TRUE(grow.ok()) << grow.status();
  ASSERT_EQ(grow->added.size(), 7u);
  for (const auto& g : grow->added) {
    int index = std::stoi(g.node_id.substr(4));
    EXPECT_GE(index, 8) << "grew onto another leaf: " << g.node_id;
    EXPECT_EQ(g.gpu_indices.size(), 8u);
  }
  EXPECT_TRUE(grow->removed.empty());

  FleetView big = Fleet(16, 8);
  for (int node = 8; node < 16; ++node) ReserveWhole(big, node, "ins-gang", "t1");
  auto shrink = DecideResize(big, "ins-gang", "t1", 16, 0, {});
  ASSERT_TRUE(shrink.ok()) << shrink.status();
  EXPECT_EQ(shrink->removed.size(), 6u);
  EXPECT_TRUE(shrink->added.empty());
}

TEST(DecideResizeTest, ShortCapacityAndQuotaFailCleanly) {
  FleetView view = Fleet(4, 4);
  ReserveWhole(view, 0, "ins-gang", "t1");
  ReserveWhole(view, 1, "ins-other", "t2");
  auto short_of = DecideResize(view, "ins-gang", "t1", 64, 0, {});
  EXPECT_EQ(short_of.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(short_of.status()), "INSUFFICIENT_CAPACITY");

  view.quotas["t1"] = {"t1", 16, 10};
  auto over = DecideResize(view, "ins-gang", "t1", 24, 0, {});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(over.status()), "QUOTA_EXCEEDED");
  EXPECT_TRUE(DecideResize(view, "ins-gang", "t1", 16, 0, {}).ok());
}

TEST(DecideResizeTest, GrowthGoesBehindTheQueue) {
  // A waiting 32-GPU gang is owed the three free nodes: growth must not
  // take them, whether the gang fits now or is blocked and holds them.
  for (int waiting_gpus : {24, 32}) {
    FleetView view = Fleet(4, 4);
    ReserveWhole(view, 0, "ins-gang", "t1");
    Queue(view, "ins-waiting", waiting_gpus, 1, "t2");
    auto grow = DecideResize(view, "ins-gang", "t1", 16, 0, {});
    EXPECT_EQ(ReasonOf(grow.status()), "INSUFFICIENT_CAPACITY") << waiting_gpus;
    auto shrink_or_same = DecideResize(view, "ins-gang", "t1", 8, 0, {});
    EXPECT_TRUE(shrink_or_same.ok());
  }
  FleetView view = Fleet(4, 4);
  ReserveWhole(view, 0, "ins-gang", "t1");
  Queue(view, "ins-small", 8, 1, "t2");
  auto grow = DecideResize(view, "ins-gang", "t1", 16, 0, {});
  ASSERT_TRUE(grow.ok()) << grow.status();  // the queue takes one node, growth another
  EXPECT_EQ(grow->added.size(), 1u);
}

TEST(DecideResizeTest, PartialNodeInstancesCannotBeResized) {
  FleetView view = Fleet(2, 2);
  Reserve(view, 0, "ins-small", "t1", {0, 1, 2, 3});
  auto result = DecideResize(view, "ins-small", "t1", 16, 0, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(result.status()), "NOT_WHOLE_NODES");
  auto none = DecideResize(view, "ins-ghost", "t1", 16, 0, {});
  EXPECT_EQ(ReasonOf(none.status()), "INSTANCE_HOLDS_NO_GPUS");
}

TEST(CheckAdmissionTest, PendingQuotaAtItsLimit) {
  SchedulingOptions options;
  options.default_quota.pending_count_max = 3;
  store::AdmissionView view;
  view.pending_count = 2;
  EXPECT_TRUE(CheckAdmission(view, "t1", options).ok());
  view.pending_count = 3;
  absl::Status status = CheckAdmission(view, "t1", options);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(status), "QUOTA_EXCEEDED");
  view.request_seen = true;  // a retry of an accepted create still answers
  EXPECT_TRUE(CheckAdmission(view, "t1", options).ok());
  view.request_seen = false;
  view.quota = store::TenantQuotaRow{"t1", 8, 10};  // the tenant's own row wins
  EXPECT_TRUE(CheckAdmission(view, "t1", options).ok());
}

}  // namespace
}  // namespace sv::control
