// Start confirmations of many nodes in one transaction
// (store::AgentStore::ConfirmStartedBatch) on a real PostgreSQL: each node's
// answer is its own, a gang confirmed by all its nodes in one batch becomes
// RUNNING once, as of its last node's report, and confirmations sent by
// many nodes at once through the group commit start every instance exactly
// once.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "control/scheduling.h"
#include "store/agent_store.h"
#include "store/database.h"
#include "store/scheduling_store.h"
#include "store/store.h"
#include "tests/integration/harness.h"

namespace sv::store {
namespace {

class StartConfirmBatchTest : public ::testing::Test {
 protected:
  void Open(int nodes) {
    db_ = sv::testing::CreateMigratedDatabase(&url_, 16);
    ASSERT_NE(db_, nullptr);
    store_ = std::make_unique<Store>(*db_);
    ASSERT_TRUE(sv::testing::AddSimulatedNodes(*store_, nodes, 1, now_).ok());
    auto tenant = store_->CreateTenant(
        {"acme", "ops@acme.example", Role::kMember, "key-acme", "salt-acme",
         std::string(64, 'a')},
        now_);
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    tenant_ = tenant->tenant.id;
  }

  std::string Create(const std::string& name, int gpus) {
    auto created = store_->CreateInstance(tenant_, {name, gpus, "RTX 4090", "ubuntu"},
                                          "r-" + name, "f-" + name, now_);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->id : "";
  }

  // Places what waits and tells every node (SCHEDULED -> STARTING).
  void PlaceAndTell(AgentStore& agents, int nodes) {
    control::Scheduling scheduling(*db_, control::SchedulingOptions{});
    ASSERT_TRUE(scheduling.RunPass(now_).ok());
    for (int n = 0; n < nodes; ++n) {
      ASSERT_TRUE(agents.DesiredForNode(absl::StrCat("node-", n), now_).ok());
    }
  }

  // The nodes an instance holds GPUs on, in id order.
  std::vector<std::string> NodesOf(const std::string& id) {
    std::vector<std::string> nodes;
    for (const auto& row : Query(absl::StrCat(
             "SELECT DISTINCT node_id FROM gpu_reservations WHERE instance_id = '", id,
             "' ORDER BY node_id"))) {
      nodes.push_back(row[0].as<std::string>());
    }
    return nodes;
  }

  pqxx::result Query(const std::string& sql) {
    pqxx::connection c(url_);
    pqxx::nontransaction n(c);
    return n.exec(sql);
  }

  std::string State(const std::string& id) {
    return Query(absl::StrCat("SELECT state FROM instances WHERE id = '", id, "'"))[0][0]
        .as<std::string>();
  }

  // How many events moved the instance to `state`.
  int64_t Events(const std::string& id, const std::string& state) {
    return Query(absl::StrCat("SELECT count(*) FROM instance_events WHERE instance_id = '", id,
                              "' AND to_state = '", state, "'"))[0][0]
        .as<int64_t>();
  }

  // running_since and the RUNNING event's time, in Unix seconds.
  std::pair<int64_t, int64_t> RunningTimes(const std::string& id) {
    auto row = Query(absl::StrCat(
        "SELECT extract(epoch FROM i.running_since)::bigint, "
        "extract(epoch FROM e.at)::bigint FROM instances i JOIN instance_events e "
        "ON e.instance_id = i.id AND e.to_state = 'RUNNING' WHERE i.id = '",
        id, "'"))[0];
    return {row[0].as<int64_t>(), row[1].as<int64_t>()};
  }

  std::string url_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
  std::unique_ptr<Database> db_;
  std::unique_ptr<Store> store_;
  std::string tenant_;
};

TEST_F(StartConfirmBatchTest, ABatchOfNodesAnswersEachNodeAndStartsAGangOnce) {
  Open(3);
  AgentStore agents(*db_);
  const std::string gang = Create("gang", 16);
  const std::string small = Create("small", 1);
  const std::string gone = Create("gone", 1);
  PlaceAndTell(agents, 3);
  const std::vector<std::string> gang_nodes = NodesOf(gang);
  const std::vector<std::string> small_nodes = NodesOf(small);
  ASSERT_EQ(gang_nodes.size(), 2u);
  ASSERT_EQ(small_nodes.size(), 1u);
  ASSERT_EQ(NodesOf(gone), small_nodes);  // Both 1-GPU instances share the third node.
  const std::string third = small_nodes[0];
  ASSERT_EQ(State(gang), "STARTING");
  ASSERT_TRUE(store_->DeleteInstance(tenant_, gone, now_).ok());

  // The gang's two nodes report 1 s and 3 s from now, the third node 2 s;
  // the third node also names the gang (not its own), an unknown id and the
  // deleted instance.
  std::vector<StartConfirmation> batch = {
      {gang_nodes[0], {gang}, now_ + absl::Seconds(1)},
      {gang_nodes[1], {gang, "ins-nosuchinstance"}, now_ + absl::Seconds(3)},
      {third, {small, gang, gone, small}, now_ + absl::Seconds(2)},
  };
  auto results = agents.ConfirmStartedBatch(batch);
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(results[0]->size(), 1u);
  EXPECT_TRUE(*(*results[0])[0]);  // RUNNING once the batch is written.
  ASSERT_EQ(results[1]->size(), 2u);
  EXPECT_TRUE(*(*results[1])[0]);
  EXPECT_EQ(sv::ReasonOf((*results[1])[1].status()), "UNKNOWN_INSTANCE");
  EXPECT_EQ((*results[1])[1].status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(results[2]->size(), 4u);
  EXPECT_TRUE(*(*results[2])[0]);
  EXPECT_EQ(sv::ReasonOf((*results[2])[1].status()), "UNKNOWN_INSTANCE");
  EXPECT_EQ(sv::ReasonOf((*results[2])[2].status()), "STALE_REPORT");
  EXPECT_EQ((*results[2])[2].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(*(*results[2])[3]);  // An id named twice gets two answers.

  // One RUNNING event each, as of the last of its nodes' reports.
  const int64_t t0 = absl::ToUnixSeconds(now_);
  EXPECT_EQ(State(gang), "RUNNING");
  EXPECT_EQ(Events(gang, "RUNNING"), 1);
  EXPECT_EQ(RunningTimes(gang), std::make_pair(t0 + 3, t0 + 3));
  EXPECT_EQ(State(small), "RUNNING");
  EXPECT_EQ(Events(small, "RUNNING"), 1);
  EXPECT_EQ(RunningTimes(small), std::make_pair(t0 + 2, t0 + 2));
  EXPECT_EQ(State(gone), "DELETED");
  // Each confirming node's heartbeat moved up to its own report.
  for (const auto& [node, at] : std::vector<std::pair<std::string, int64_t>>{
           {gang_nodes[0], t0 + 1}, {gang_nodes[1], t0 + 3}, {third, t0 + 2}}) {
    EXPECT_EQ(Query(absl::StrCat("SELECT extract(epoch FROM last_heartbeat_at)::bigint FROM "
                                 "nodes WHERE id = '",
                                 node, "'"))[0][0]
                  .as<int64_t>(),
              at)
        << node;
  }

  // The same reports again, later: read, not written.
  for (auto& c : batch) c.now += absl::Minutes(1);
  const int64_t starts =
      Query("SELECT count(*) FROM instance_node_starts")[0][0].as<int64_t>();
  results = agents.ConfirmStartedBatch(batch);
  ASSERT_TRUE(results[0].ok() && results[1].ok() && results[2].ok());
  EXPECT_TRUE(*(*results[0])[0]);
  EXPECT_TRUE(*(*results[2])[0]);
  EXPECT_EQ(Events(gang, "RUNNING"), 1);
  EXPECT_EQ(RunningTimes(gang), std::make_pair(t0 + 3, t0 + 3));
  EXPECT_EQ(Query("SELECT count(*) FROM instance_node_starts")[0][0].as<int64_t>(), starts);
}

TEST_F(StartConfirmBatchTest, OneNodeOfAGangLeavesItStartingUntilTheOther) {
  Open(2);
  AgentStore agents(*db_);
  const std::string gang = Create("gang", 16);
  PlaceAndTell(agents, 2);
  const std::vector<std::string> nodes = NodesOf(gang);
  ASSERT_EQ(nodes.size(), 2u);
  auto first = agents.ConfirmStartedBatch({{nodes[0], {gang}, now_ + absl::Seconds(5)}});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  EXPECT_FALSE(*(*first[0])[0]);
  EXPECT_EQ(State(gang), "STARTING");
  // The second node's report comes first in time but last to arrive: the
  // instance runs as of that report, the later of the two writes.
  auto second = agents.ConfirmStartedMany(nodes[1], {gang}, now_ + absl::Seconds(7));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(*(*second)[0]);
  const int64_t t0 = absl::ToUnixSeconds(now_);
  EXPECT_EQ(RunningTimes(gang), std::make_pair(t0 + 7, t0 + 7));
  EXPECT_EQ(Events(gang, "RUNNING"), 1);
}

// A stop keeps the start confirmations of the run it ended; placed again,
// the gang must not count them, nor confirmations that come before any
// node was told of the new run (an earlier run's process still running):
// one node's confirmation leaves it STARTING until the other node confirms
// this run too.
TEST_F(StartConfirmBatchTest, ConfirmationsOfAnEarlierRunDoNotCompleteAGang) {
  Open(2);
  AgentStore agents(*db_);
  const std::string gang = Create("gang", 16);
  PlaceAndTell(agents, 2);
  std::vector<std::string> nodes = NodesOf(gang);
  ASSERT_EQ(nodes.size(), 2u);
  ASSERT_TRUE(agents.ConfirmStartedMany(nodes[0], {gang}, now_ + absl::Seconds(1)).ok());
  ASSERT_TRUE(agents.ConfirmStartedMany(nodes[1], {gang}, now_ + absl::Seconds(1)).ok());
  ASSERT_EQ(State(gang), "RUNNING");
  now_ += absl::Minutes(1);
  ASSERT_TRUE(store_->StopInstance(tenant_, gang, "stopped by the user", now_).ok());
  // A start whose caller read the instance running, so held it to no
  // credit gate, finds it stopped: refused, to be tried again.
  auto unchecked = store_->StartInstance(tenant_, gang, now_, -1, false);
  EXPECT_EQ(unchecked.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(sv::ReasonOf(unchecked.status()), "INSTANCE_CHANGED");
  EXPECT_EQ(State(gang), "STOPPED");
  ASSERT_TRUE(store_->StartInstance(tenant_, gang, now_).ok());
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  ASSERT_EQ(State(gang), "SCHEDULED");
  nodes = NodesOf(gang);
  ASSERT_EQ(nodes.size(), 2u);
  // Both nodes answer before either read its desired set: the earlier
  // run's processes, which count for nothing.
  for (const std::string& node : nodes) {
    auto early = agents.ConfirmStartedMany(node, {gang}, now_ + absl::Seconds(2));
    ASSERT_TRUE(early.ok()) << early.status();
    ASSERT_TRUE((*early)[0].ok()) << (*early)[0].status();
    EXPECT_FALSE(*(*early)[0]);
  }
  EXPECT_EQ(State(gang), "SCHEDULED");
  EXPECT_EQ(Events(gang, "RUNNING"), 1);
  // Told, only the first node answers.
  ASSERT_TRUE(agents.DesiredForNode(nodes[0], now_ + absl::Seconds(2)).ok());
  ASSERT_TRUE(agents.DesiredForNode(nodes[1], now_ + absl::Seconds(2)).ok());
  auto first = agents.ConfirmStartedMany(nodes[0], {gang}, now_ + absl::Seconds(2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)[0].ok()) << (*first)[0].status();
  EXPECT_FALSE(*(*first)[0]);
  EXPECT_EQ(State(gang), "STARTING");
  EXPECT_EQ(Events(gang, "RUNNING"), 1);
  auto second = agents.ConfirmStartedMany(nodes[1], {gang}, now_ + absl::Seconds(3));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)[0].ok()) << (*second)[0].status();
  EXPECT_TRUE(*(*second)[0]);
  EXPECT_EQ(State(gang), "RUNNING");
}

// Desired-set reads of several nodes in one transaction
// (AgentStore::DesiredForNodes): each node gets its own set, a gang told on
// both its nodes moves to STARTING once, a node that is not there is
// NODE_DOWN, and the one instance with a library mount gets it.
// Goal: the node-death sweep locks the silent node's instances and reads
// them again under the locks, so what committed while it waited is seen:
// here another transaction grows one instance onto a second node (new
// reservations, a resize event 20 s after the node's last heartbeat) and
// deletes another. It used to read both as RUNNING before their locks,
// then stop the grown one keeping its new GPUs (STOPPED, holding a node)
// and turn the deleted one back into STOPPED; and the stop, dated to the
// last heartbeat, sorted before the resize, so billing saw the grown size
// run on (migration 0118).
TEST_F(StartConfirmBatchTest, NodeDeathRereadsInstancesUnderTheirLocks) {
  Open(2);
  AgentStore agents(*db_);
  const std::string grow = Create("grow", 4);
  const std::string gone = Create("gone", 1);
  PlaceAndTell(agents, 2);
  const std::vector<std::string> nodes = NodesOf(grow);
  ASSERT_EQ(nodes.size(), 1u);
  ASSERT_EQ(NodesOf(gone), nodes);
  const std::string x = nodes[0];
  auto started = agents.ConfirmStartedBatch({{x, {grow, gone}, now_ + absl::Seconds(1)}});
  ASSERT_EQ(started.size(), 1u);
  ASSERT_TRUE(started[0].ok()) << started[0].status();
  ASSERT_EQ(State(grow), "RUNNING");
  ASSERT_EQ(State(gone), "RUNNING");
  const std::string y =
      Query(absl::StrCat("SELECT id FROM nodes WHERE id <> '", x, "'"))[0][0].as<std::string>();
  Query(absl::StrCat("UPDATE nodes SET last_heartbeat_at = to_timestamp(",
                     absl::ToUnixSeconds(now_ + absl::Hours(2)), ") WHERE id = '", y, "'"));

  pqxx::connection c(url_);
  pqxx::work other(c);
  const std::string later = absl::StrCat("to_timestamp(", absl::ToUnixSeconds(now_) + 20, ")");
  other.exec(absl::StrCat("SELECT 1 FROM instances WHERE id IN ('", grow, "', '", gone,
                          "') ORDER BY id FOR UPDATE"));
  other.exec(absl::StrCat("INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, "
                          "reserved_at) SELECT '", y, "', g, '", grow, "', ", later,
                          " FROM generate_series(0, 3) g"));
  other.exec(absl::StrCat("INSERT INTO instance_events (instance_id, at, from_state, to_state, "
                          "reason) VALUES ('", grow, "', ", later,
                          ", 'RUNNING', 'RUNNING', 'grown')"));
  other.exec(absl::StrCat("DELETE FROM gpu_reservations WHERE instance_id = '", gone, "'"));
  other.exec(absl::StrCat("UPDATE instances SET state = 'DELETED' WHERE id = '", gone, "'"));
  other.exec(absl::StrCat("INSERT INTO instance_events (instance_id, at, from_state, to_state, "
                          "reason) VALUES ('", gone, "', ", later,
                          ", 'RUNNING', 'DELETED', 'deleted')"));

  absl::StatusOr<std::vector<DownedNode>> downed;
  std::thread sweep(
      [&] { downed = agents.MarkSilentNodesDown(absl::Seconds(30), now_ + absl::Hours(1)); });
  // Commit only once the sweep waits for a lock the transaction holds.
  EXPECT_TRUE(sv::testing::WaitForLockWaiter(url_));
  other.commit();
  sweep.join();
  ASSERT_TRUE(downed.ok()) << downed.status();
  ASSERT_EQ(downed->size(), 1u);
  EXPECT_EQ((*downed)[0].node_id, x);
  EXPECT_EQ((*downed)[0].stopped_instance_ids, std::vector<std::string>{grow});
  EXPECT_EQ(State(gone), "DELETED");
  EXPECT_EQ(State(grow), "STOPPED");
  EXPECT_TRUE(NodesOf(grow).empty()) << "a STOPPED instance kept the GPUs it grew onto";
  EXPECT_TRUE(Query(absl::StrCat("SELECT (SELECT at FROM instance_events WHERE instance_id = '",
                                 grow, "' AND to_state = 'STOPPED') >= (SELECT at FROM "
                                 "instance_events WHERE instance_id = '",
                                 grow, "' AND reason = 'grown')"))[0][0]
                  .as<bool>())
      << "the stop sorts before the resize: billing sees the grown instance run on";
}

// Goal: a confirmation of an instance no node was told of yet (SCHEDULED:
// an earlier run's process still listed by the node's heartbeat) does not
// make it RUNNING; once the node is told, its confirmation does.
TEST_F(StartConfirmBatchTest, ConfirmationsBeforeTheNodeIsToldDoNotStartIt) {
  Open(1);
  AgentStore agents(*db_);
  const std::string id = Create("early", 1);
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  ASSERT_EQ(State(id), "SCHEDULED");
  const std::string node = NodesOf(id)[0];
  auto early = agents.ConfirmStartedBatch({{node, {id}, now_ + absl::Seconds(1)}});
  ASSERT_EQ(early.size(), 1u);
  ASSERT_TRUE(early[0].ok()) << early[0].status();
  ASSERT_TRUE((*early[0])[0].ok()) << (*early[0])[0].status();
  EXPECT_FALSE(*(*early[0])[0]) << "confirmed as running";
  EXPECT_EQ(State(id), "SCHEDULED");
  ASSERT_TRUE(agents.DesiredForNode(node, now_ + absl::Seconds(2)).ok());
  ASSERT_EQ(State(id), "STARTING");
  auto told = agents.ConfirmStartedBatch({{node, {id}, now_ + absl::Seconds(3)}});
  ASSERT_TRUE(told[0].ok()) << told[0].status();
  EXPECT_EQ(State(id), "RUNNING");
}

// An operator's cordon or drain outlives the node going down. Down was
// written over it and a registration made the node ready: a node drained
// for repair and powered off took placements as soon as it booted. And a
// down node can be cordoned, drained or uncordoned for its return (that
// was NODE_DOWN).
TEST_F(StartConfirmBatchTest, ACordonOrDrainOutlivesTheNodeGoingDown) {
  Open(3);
  AgentStore agents(*db_);
  SchedulingStore scheduling(*db_);
  auto state_of = [&](const std::string& node) {
    return Query(absl::StrCat("SELECT state || '/' || coalesce(state_when_back, '-') FROM "
                              "nodes WHERE name = '", node, "'"))[0][0]
        .as<std::string>();
  };
  auto back = [&](const std::string& node, absl::Time at) {
    NodeRecord record{"", node, "z1", "p1", "leaf-0", "RTX 4090", 8, NodeState::kReady, true};
    ASSERT_TRUE(agents.RegisterNode(record, at).ok());
  };
  ASSERT_TRUE(scheduling.ChangeNode("node-0", NodeAction::kCordon).ok());
  ASSERT_TRUE(scheduling.ChangeNode("node-1", NodeAction::kDrain).ok());
  const absl::Time later = now_ + absl::Hours(1);
  auto downed = agents.MarkSilentNodesDown(absl::Seconds(30), later);
  ASSERT_TRUE(downed.ok()) << downed.status();
  ASSERT_EQ(downed->size(), 3u);
  EXPECT_EQ(state_of("node-0"), "down/cordoned");
  EXPECT_EQ(state_of("node-1"), "down/draining");
  EXPECT_EQ(state_of("node-2"), "down/-");
  auto listed = scheduling.ListNodes("", 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ((*listed)[0].state_when_back, NodeState::kCordoned);

  // While down: node-2 cordoned, node-0 uncordoned, for their return.
  auto cordoned = scheduling.ChangeNode("node-2", NodeAction::kCordon);
  ASSERT_TRUE(cordoned.ok()) << cordoned.status();
  EXPECT_EQ(cordoned->node.node.state, NodeState::kDown);
  EXPECT_EQ(cordoned->node.state_when_back, NodeState::kCordoned);
  ASSERT_TRUE(scheduling.ChangeNode("node-0", NodeAction::kUncordon).ok());
  EXPECT_EQ(state_of("node-0"), "down/-");

  for (const char* node : {"node-0", "node-1", "node-2"}) back(node, later);
  EXPECT_EQ(state_of("node-0"), "ready/-");
  EXPECT_EQ(state_of("node-1"), "draining/-");
  EXPECT_EQ(state_of("node-2"), "cordoned/-");
  // A node back on its own is ready; a later down keeps no stale intent.
  auto again = agents.MarkSilentNodesDown(absl::Seconds(30), later + absl::Hours(1));
  ASSERT_TRUE(again.ok()) << again.status();
  back("node-0", later + absl::Hours(1));
  EXPECT_EQ(state_of("node-0"), "ready/-");
}

// Goal: an exit report of an earlier run (the agent says which) does not
// end the instance's current run; one of the current run does.
TEST_F(StartConfirmBatchTest, AnEarlierRunsExitDoesNotEndTheCurrentRun) {
  Open(1);
  AgentStore agents(*db_);
  const std::string id = Create("rerun", 1);
  PlaceAndTell(agents, 1);
  const std::string node = NodesOf(id)[0];
  auto run_of = [&] {
    return Query(absl::StrCat("SELECT queue_seq FROM instances WHERE id = '", id, "'"))[0][0]
        .as<int64_t>();
  };
  ASSERT_TRUE(agents.ConfirmStarted(node, id, now_ + absl::Seconds(1)).ok());
  const int64_t first = run_of();
  // Stopped and started again on the same node.
  now_ += absl::Minutes(1);
  ASSERT_TRUE(store_->StopInstance(tenant_, id, "stopped by the user", now_).ok());
  ASSERT_TRUE(store_->StartInstance(tenant_, id, now_).ok());
  PlaceAndTell(agents, 1);
  ASSERT_EQ(NodesOf(id), std::vector<std::string>{node});
  ASSERT_TRUE(agents.ConfirmStarted(node, id, now_ + absl::Seconds(1)).ok());
  ASSERT_EQ(State(id), "RUNNING");
  const int64_t second = run_of();
  ASSERT_NE(first, second);
  absl::Status stale =
      agents.ReportEnded(node, id, true, "old process", now_ + absl::Seconds(2), first);
  EXPECT_EQ(sv::ReasonOf(stale), "STALE_REPORT") << stale;
  EXPECT_EQ(State(id), "RUNNING");
  ASSERT_TRUE(
      agents.ReportEnded(node, id, true, "this run", now_ + absl::Seconds(3), second).ok());
  EXPECT_EQ(State(id), "FAILED");
}

// Goal: a node's death waits for a queue pass that read the node as ready,
// and stops what that pass placed there. (Until 2026-12-07 the sweep did
// not take the placement lock: the pass's placement committed after it, on
// a node no longer asked for anything, and stayed SCHEDULED for ever,
// holding GPUs and the tenant's quota.)
TEST_F(StartConfirmBatchTest, NodeDeathStopsWhatAPassPlacedMeanwhile) {
  Open(1);
  AgentStore agents(*db_);
  const std::string first = Create("first", 1);
  PlaceAndTell(agents, 1);
  const std::string x = NodesOf(first)[0];
  const std::string late = Create("late", 1);
  ASSERT_EQ(State(late), "PENDING");

  // A pass: the placement lock, then the placement on x.
  pqxx::connection c(url_);
  pqxx::work pass(c);
  pass.exec("SELECT pg_advisory_xact_lock(" + std::to_string(0x5356'0002) + ")");
  pass.exec(absl::StrCat("INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, "
                         "reserved_at) VALUES ('", x, "', 7, '", late, "', now())"));
  pass.exec(absl::StrCat("UPDATE instances SET state = 'SCHEDULED' WHERE id = '", late, "'"));

  absl::StatusOr<std::vector<DownedNode>> downed;
  std::thread sweep(
      [&] { downed = agents.MarkSilentNodesDown(absl::Seconds(30), now_ + absl::Hours(1)); });
  EXPECT_TRUE(sv::testing::WaitForLockWaiter(url_)) << "the sweep did not wait for the pass";
  pass.commit();
  sweep.join();
  ASSERT_TRUE(downed.ok()) << downed.status();
  ASSERT_EQ(downed->size(), 1u);
  EXPECT_EQ(State(late), "STOPPED");
  EXPECT_TRUE(NodesOf(late).empty()) << "the pass's placement survived the node's death";
}

// Goal: a stop or delete whose time was taken before it got the
// instance's lock (it waited for its batch or the lock while the start was
// confirmed) ends the RUNNING interval at its start, not before it, so the
// interval is empty instead of left open and billed (migration 0118).
TEST_F(StartConfirmBatchTest, AStopStampedBeforeTheStartEndsTheIntervalAtTheStart) {
  Open(1);
  AgentStore agents(*db_);
  const std::string stopped = Create("stopped", 1);
  const std::string deleted = Create("deleted", 1);
  PlaceAndTell(agents, 1);
  const std::string node = NodesOf(stopped)[0];
  auto started =
      agents.ConfirmStartedBatch({{node, {stopped, deleted}, now_ + absl::Seconds(30)}});
  ASSERT_TRUE(started[0].ok()) << started[0].status();
  ASSERT_EQ(State(stopped), "RUNNING");
  ASSERT_TRUE(store_->StopInstance(tenant_, stopped, "stopped by the user",
                                   now_ + absl::Seconds(10))
                  .ok());
  ASSERT_TRUE(store_->DeleteInstance(tenant_, deleted, now_ + absl::Seconds(10)).ok());
  for (const std::string& id : {stopped, deleted}) {
    auto row = Query(absl::StrCat(
        "SELECT extract(epoch FROM at)::bigint, to_state FROM instance_events WHERE "
        "instance_id = '", id, "' AND from_state = 'RUNNING'"));
    ASSERT_EQ(row.size(), 1u) << id;
    EXPECT_EQ(row[0][0].as<int64_t>(), absl::ToUnixSeconds(now_) + 30) << row[0][1].c_str();
  }
}

// Goal: growing an instance is held to the create's credit gate under the
// tenant's lock (the API's check runs before and without it, so
// concurrent resizes each passed): a tenant with no credit cannot grow,
// and the refusal writes nothing.
TEST_F(StartConfirmBatchTest, GrowingIsHeldToTheCreditGateInItsTransaction) {
  Open(3);
  AgentStore agents(*db_);
  const std::string grow = Create("grow", 8);
  PlaceAndTell(agents, 3);
  auto started = agents.ConfirmStartedBatch({{NodesOf(grow)[0], {grow}, now_}});
  ASSERT_TRUE(started[0].ok()) << started[0].status();
  ASSERT_EQ(State(grow), "RUNNING");
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  CreateGate gate;
  gate.credit_minutes = 10;  // The tenant has no credit at all.
  std::optional<CreateRefusal> refusal;
  auto refused = scheduling.Resize(tenant_, grow, 16, now_, gate, &refusal);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->reason, "INSUFFICIENT_CREDIT");
  EXPECT_GT(refusal->used, 0);
  EXPECT_EQ(NodesOf(grow).size(), 1u);
  // Shrinking back or no gate (tests, no billing) is not held.
  auto grown = scheduling.Resize(tenant_, grow, 16, now_);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(NodesOf(grow).size(), 2u);
  auto shrunk = scheduling.Resize(tenant_, grow, 8, now_, gate, &refusal);
  EXPECT_TRUE(shrunk.ok()) << shrunk.status();
}

TEST_F(StartConfirmBatchTest, DesiredSetsOfSeveralNodesInOneTransaction) {
  Open(3);
  AgentStore agents(*db_);
  const std::string gang = Create("gang", 16);
  const std::string plain = Create("plain", 1);
  const std::string mounted = Create("mounted", 2);
  Query("INSERT INTO library_items (name, kind, size_bytes, source, created_at) VALUES "
        "('weights-test', 'model', 1, 'test', now())");
  Query(absl::StrCat("INSERT INTO instance_library_mounts (instance_id, name) VALUES ('",
                     mounted, "', 'weights-test')"));
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  const std::vector<std::string> gang_nodes = NodesOf(gang);
  ASSERT_EQ(gang_nodes.size(), 2u);
  ASSERT_EQ(NodesOf(plain), NodesOf(mounted));
  const std::string third = NodesOf(plain)[0];

  auto sets = agents.DesiredForNodes({{gang_nodes[0], now_ + absl::Seconds(1)},
                                      {"node-nosuch", now_ + absl::Seconds(1)},
                                      {third, now_ + absl::Seconds(2)},
                                      {gang_nodes[1], now_ + absl::Seconds(1)}});
  ASSERT_EQ(sets.size(), 4u);
  ASSERT_FALSE(sets[1].ok());
  EXPECT_EQ(sv::ReasonOf(sets[1].status()), "NODE_DOWN");
  EXPECT_EQ(sets[1].status().code(), absl::StatusCode::kFailedPrecondition);
  for (int i : {0, 3}) {
    ASSERT_TRUE(sets[i].ok()) << sets[i].status();
    ASSERT_EQ(sets[i]->size(), 1u);
    EXPECT_EQ((*sets[i])[0].instance_id, gang);
    EXPECT_EQ((*sets[i])[0].gpu_indices, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_TRUE((*sets[i])[0].starting);
    EXPECT_TRUE((*sets[i])[0].mounts.empty());
  }
  ASSERT_TRUE(sets[2].ok()) << sets[2].status();
  ASSERT_EQ(sets[2]->size(), 2u);
  std::map<std::string, AgentAssignment> on_third;
  for (const auto& a : *sets[2]) on_third[a.instance_id] = a;
  ASSERT_EQ(on_third.count(plain), 1u);
  ASSERT_EQ(on_third.count(mounted), 1u);
  EXPECT_TRUE(on_third[plain].mounts.empty());
  ASSERT_EQ(on_third[mounted].mounts.size(), 1u);
  EXPECT_EQ(on_third[mounted].mounts[0].target, "/public/weights-test");
  EXPECT_EQ(on_third[mounted].gpu_indices.size(), 2u);
  // One STARTING event each, as of the batch's latest request.
  for (const auto& id : {gang, plain, mounted}) {
    EXPECT_EQ(State(id), "STARTING") << id;
    auto events = Query(absl::StrCat(
        "SELECT extract(epoch FROM at)::bigint FROM instance_events WHERE instance_id = '", id,
        "' AND to_state = 'STARTING'"));
    ASSERT_EQ(events.size(), 1u) << id;
    EXPECT_EQ(events[0][0].as<int64_t>(), absl::ToUnixSeconds(now_) + 2) << id;
  }
  // Read again alone, later: the same set, nothing written.
  auto again = agents.DesiredForNode(gang_nodes[0], now_ + absl::Seconds(9));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ((*again)[0].instance_id, gang);
  EXPECT_EQ(Events(gang, "STARTING"), 1);
}

// 24 nodes read their sets at once, then report at once, twice each,
// through the group commits: 8 gangs of two nodes and 64 1-GPU instances.
// Each node is told exactly its instances, and every instance starts and
// runs with one event each; every answer says so.
TEST_F(StartConfirmBatchTest, ManyNodesAtOnceThroughTheGroupCommit) {
  constexpr int kNodes = 24;
  Open(kNodes);
  AgentStore agents(*db_);
  agents.SetConfirmBatchLanes(4);
  agents.SetDesiredBatchLanes(4);
  std::vector<std::string> ids;
  for (int g = 0; g < 8; ++g) ids.push_back(Create(absl::StrCat("gang-", g), 16));
  for (int s = 0; s < 64; ++s) ids.push_back(Create(absl::StrCat("small-", s), 1));
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  std::map<std::string, std::vector<std::string>> by_node;
  for (const auto& row : Query("SELECT DISTINCT node_id, instance_id FROM gpu_reservations "
                               "ORDER BY instance_id")) {
    by_node[row[0].as<std::string>()].push_back(row[1].as<std::string>());
  }
  ASSERT_EQ(by_node.size(), static_cast<size_t>(kNodes));
  std::mutex mutex;
  // Every node reads its set at once: each gets exactly its instances.
  std::map<std::string, std::vector<std::string>> told;
  {
    std::vector<std::thread> readers;
    for (const auto& [node, held] : by_node) {
      readers.emplace_back([&, node = node] {
        auto set = agents.DesiredForNode(node, now_);
        std::lock_guard<std::mutex> lock(mutex);
        if (!set.ok()) {
          ADD_FAILURE() << node << ": " << set.status();
          return;
        }
        for (const auto& a : *set) told[node].push_back(a.instance_id);
      });
    }
    for (auto& t : readers) t.join();
  }
  EXPECT_EQ(told, by_node);
  for (const auto& id : ids) {
    EXPECT_EQ(State(id), "STARTING") << id;
    EXPECT_EQ(Events(id, "STARTING"), 1) << id;
  }
  int answers = 0, running_answers = 0, failures = 0;
  std::vector<std::thread> threads;
  for (const auto& [node, held] : by_node) {
    threads.emplace_back([&, node = node, held = held] {
      for (int round = 0; round < 2; ++round) {
        auto results = agents.ConfirmStartedMany(node, held, now_ + absl::Seconds(1 + round));
        std::lock_guard<std::mutex> lock(mutex);
        if (!results.ok()) {
          ++failures;
          continue;
        }
        for (const auto& r : *results) {
          ++answers;
          if (r.ok() && *r) ++running_answers;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  // Each round: 16 gang nodes with one gang each, 8 nodes with 8 smalls.
  EXPECT_EQ(answers, 2 * (16 + 64));
  // A gang node's first report may come before its partner's: false then.
  EXPECT_GE(running_answers, 2 * (16 + 64) - 8);
  for (const auto& id : ids) {
    EXPECT_EQ(State(id), "RUNNING") << id;
    EXPECT_EQ(Events(id, "RUNNING"), 1) << id;
  }
}

}  // namespace
}  // namespace sv::store
