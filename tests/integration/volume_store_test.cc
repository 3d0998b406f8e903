// Volume attachments and moves against a real PostgreSQL, at the store
// (store::VolumeStore) with no agent, so that a move stays pending and a
// stop can be held mid-transaction. See docs/storage.md.
#include <gtest/gtest.h>

#include <pqxx/pqxx>
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
#include "store/volume_store.h"
#include "tests/integration/harness.h"

namespace sv::store {
namespace {

class VolumeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = sv::testing::CreateMigratedDatabase(&url_, 8);
    ASSERT_NE(db_, nullptr);
    store_ = std::make_unique<Store>(*db_);
    ASSERT_TRUE(sv::testing::AddSimulatedNodes(*store_, 2, 1, now_).ok());
    // As their agents register them: they say which instances they run.
    sv::testing::ExecSql(url_, "UPDATE nodes SET fences_mounts = true");
    auto tenant = store_->CreateTenant(
        {"acme", "ops@acme.example", Role::kMember, "key-acme", "salt-acme",
         std::string(64, 'a')},
        now_);
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    tenant_ = tenant->tenant.id;
    volumes_ = std::make_unique<VolumeStore>(*db_);
  }

  // Instances of 8 GPUs, placed and confirmed RUNNING on their nodes.
  std::vector<std::string> Run(const std::vector<std::string>& names) {
    std::vector<std::string> ids;
    for (const std::string& name : names) {
      auto created = store_->CreateInstance(tenant_, {name, 8, "RTX 4090", "ubuntu"},
                                            "r-" + name, "f-" + name, now_);
      EXPECT_TRUE(created.ok()) << created.status();
      ids.push_back(created.ok() ? created->id : "");
    }
    control::Scheduling scheduling(*db_, control::SchedulingOptions{});
    EXPECT_TRUE(scheduling.RunPass(now_).ok());
    AgentStore agents(*db_);
    for (const std::string& id : ids) {
      const std::string node = Query(absl::StrCat(
          "SELECT node_id FROM gpu_reservations WHERE instance_id = '", id, "' LIMIT 1"))[0][0]
                                   .as<std::string>();
      EXPECT_TRUE(agents.DesiredForNode(node, now_).ok());  // Told, then confirmed.
      auto confirmed = agents.ConfirmStartedBatch({{node, {id}, now_}});
      EXPECT_TRUE(confirmed[0].ok()) << confirmed[0].status();
    }
    for (const std::string& id : ids) EXPECT_EQ(State(id), "RUNNING");
    return ids;
  }

  std::string NewVolume(const std::string& name, bool read_many) {
    VolumeSpec spec{name, 10, VolumeKind::kNetwork, read_many, ""};
    auto created = volumes_->Create(tenant_, spec, "v-" + name, "f-" + name, now_);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->record.id : "";
  }

  // A read-many node-local volume on no node yet, attached read-only at
  // /mnt/shared to new waiting 8-GPU instances named `names` (their ids
  // go to `ids`). Returns the volume's id.
  std::string SharedLocalVolume(const std::vector<std::string>& names,
                                std::vector<std::string>* ids) {
    VolumeSpec spec{"shared-local", 10, VolumeKind::kNodeLocal, true, ""};
    auto local = volumes_->Create(tenant_, spec, "v-shared-local", "f-shared-local", now_);
    EXPECT_TRUE(local.ok()) << local.status();
    if (!local.ok()) return "";
    for (const std::string& name : names) {
      auto created = store_->CreateInstance(tenant_, {name, 8, "RTX 4090", "ubuntu"},
                                            "r-" + name, "f-" + name, now_);
      EXPECT_TRUE(created.ok()) << created.status();
      if (!created.ok()) continue;
      ids->push_back(created->id);
      EXPECT_TRUE(
          volumes_->Attach(tenant_, local->record.id, created->id, true, "/mnt/shared", now_)
              .ok());
    }
    return local->record.id;
  }

  pqxx::result Query(const std::string& sql) {
    pqxx::connection c(url_);
    pqxx::nontransaction n(c);
    return n.exec(sql);
  }

  std::string NodeOf(const std::string& instance) {
    return Query(absl::StrCat("SELECT node_id FROM gpu_reservations WHERE instance_id = '",
                              instance, "' LIMIT 1"))[0][0]
        .as<std::string>();
  }

  std::string NameOf(const std::string& node) {
    return Query(absl::StrCat("SELECT name FROM nodes WHERE id = '", node, "'"))[0][0]
        .as<std::string>();
  }

  // The node as its agent registers it.
  NodeRecord NodeRecordOf(const std::string& node) {
    auto row = Query(absl::StrCat("SELECT name, zone, pod, leaf_switch, gpu_model, gpu_count "
                                  "FROM nodes WHERE id = '", node, "'"))[0];
    NodeRecord r;
    r.name = row[0].as<std::string>();
    r.zone = row[1].as<std::string>();
    r.pod = row[2].as<std::string>();
    r.leaf_switch = row[3].as<std::string>();
    r.gpu_model = row[4].as<std::string>();
    r.gpu_count = row[5].as<int>();
    r.simulated = true;
    r.fences_mounts = true;
    return r;
  }

  std::string StateReason(const std::string& id) {
    return Query(absl::StrCat("SELECT state_reason FROM instances WHERE id = '", id, "'"))[0][0]
        .as<std::string>();
  }

  std::string State(const std::string& id) {
    return Query(absl::StrCat("SELECT state FROM instances WHERE id = '", id, "'"))[0][0]
        .as<std::string>();
  }

  // The instance's attachment of the volume: "state read_only path", or "".
  std::string AttachmentOf(const std::string& volume, const std::string& instance) {
    auto rows = Query(absl::StrCat(
        "SELECT state || ' ' || read_only || ' ' || mount_path FROM volume_attachments "
        "WHERE volume_id = '", volume, "' AND instance_id = '", instance, "'"));
    return rows.empty() ? "" : rows[0][0].as<std::string>();
  }

  std::string url_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
  std::unique_ptr<Database> db_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<VolumeStore> volumes_;
  std::string tenant_;
};

// Goal: a pending move holds its place on the target: the path it will
// take and a slot of the 16 are refused to attaches meanwhile (they used to
// be taken, and the move then vanished when it completed, leaving the
// volume attached to nothing); and a moved read-only attachment stays
// read-only (it became a writer).
TEST_F(VolumeStoreTest, PendingMovesHoldTheirPathAndKeepReadOnly) {
  const std::vector<std::string> ids = Run({"a", "b"});
  const std::string a = ids[0], b = ids[1];
  const std::string work = NewVolume("work", false);
  const std::string shared = NewVolume("shared", true);
  const std::string other = NewVolume("other", false);
  ASSERT_TRUE(volumes_->Attach(tenant_, work, a, false, "/mnt/data", now_).ok());
  ASSERT_TRUE(volumes_->Attach(tenant_, shared, a, true, "/mnt/ro", now_).ok());

  // a runs, so both moves wait for its agent to unmount.
  ASSERT_TRUE(volumes_->Move(tenant_, work, b, "/mnt/data", now_).ok());
  ASSERT_TRUE(volumes_->Move(tenant_, shared, b, "/mnt/ro", now_).ok());
  EXPECT_EQ(AttachmentOf(work, a).rfind("detaching", 0), 0u) << AttachmentOf(work, a);
  auto taken = volumes_->Attach(tenant_, other, b, false, "/mnt/data", now_);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition) << taken.status();
  EXPECT_EQ(sv::ReasonOf(taken.status()), "MOUNT_PATH_IN_USE");
  // Nor may a path nest in one of them, or hold one, or name it with a
  // trailing slash: the agent mounts each path on its own, so the inner
  // volume was hidden by the outer one or unmounted with it.
  for (const char* nested : {"/mnt/data/inner", "/mnt", "/mnt/data/"}) {
    auto refused = volumes_->Attach(tenant_, other, b, false, nested, now_);
    EXPECT_EQ(sv::ReasonOf(refused.status()), "MOUNT_PATH_IN_USE") << nested << refused.status();
  }
  auto control = volumes_->Attach(tenant_, other, b, false, std::string("/mnt/o\0x", 8), now_);
  EXPECT_EQ(sv::ReasonOf(control.status()), "INVALID_MOUNT_PATH") << control.status();
  EXPECT_TRUE(volumes_->Attach(tenant_, other, b, false, "/mnt/other", now_).ok());
  EXPECT_TRUE(volumes_->Attach(tenant_, NewVolume("side", false), b, false, "/mnt/data-2", now_)
                  .ok())
      << "a sibling whose name starts alike does not nest";

  // a stops: its detaches wait for its node to say a runs there no more
  // (migration 0124), then settle, and the moves complete.
  const std::string node_a = NodeOf(a);
  ASSERT_TRUE(store_->StopInstance(tenant_, a, "stopped by the user", now_).ok());
  EXPECT_EQ(AttachmentOf(work, a).rfind("detaching", 0), 0u) << AttachmentOf(work, a);
  ASSERT_TRUE(AgentStore(*db_).Heartbeat(node_a, now_, std::vector<std::string>{}).ok());
  EXPECT_EQ(AttachmentOf(work, b), "attaching false /mnt/data");
  EXPECT_EQ(AttachmentOf(shared, b), "attaching true /mnt/ro");
  EXPECT_EQ(AttachmentOf(work, a), "");
}

// Goal: a detach that races a stop of its instance waits for the stop and
// sees it: the attachment waits for the node the instance left (not for a
// mount report the stopped instance's agent would never send, which kept
// the volume from being deleted or attached elsewhere for ever) and is
// dropped at the node's next heartbeat.
TEST_F(VolumeStoreTest, ADetachRacingAStopSeesTheStop) {
  const std::string a = Run({"a"})[0];
  const std::string node = NodeOf(a);
  const std::string work = NewVolume("work", false);
  ASSERT_TRUE(volumes_->Attach(tenant_, work, a, false, "/mnt/data", now_).ok());

  // A stop holds the instance's row, as StopInstance does.
  pqxx::connection c(url_);
  pqxx::work stop(c);
  stop.exec(absl::StrCat("SELECT 1 FROM instances WHERE id = '", a, "' FOR UPDATE"));
  stop.exec(absl::StrCat("DELETE FROM gpu_reservations WHERE instance_id = '", a, "'"));
  stop.exec(absl::StrCat("UPDATE instances SET state = 'STOPPED' WHERE id = '", a, "'"));

  absl::StatusOr<VolumeRecord> detached;
  std::thread detach([&] { detached = volumes_->Detach(tenant_, work, a, now_); });
  EXPECT_TRUE(sv::testing::WaitForLockWaiter(url_));
  stop.commit();
  detach.join();
  ASSERT_TRUE(detached.ok()) << detached.status();
  EXPECT_EQ(AttachmentOf(work, a), "detaching false /mnt/data");
  ASSERT_TRUE(AgentStore(*db_).Heartbeat(node, now_, std::vector<std::string>{}).ok());
  EXPECT_EQ(AttachmentOf(work, a), "");
}

// Goal: a volume stays with a node its instance left until that node says
// the instance runs there no more. A node that went silent (cut off, not
// dead) had its instances stopped and their volumes let go at once: the
// tenant detached a volume and attached it for writing elsewhere while the
// old job still wrote to it. Now the attachment stays (a detach waits, a
// second attachment is refused), a start of the instance is held back, and
// the fence ends with a heartbeat whose complete lists lack the instance,
// or by an operator for a node that will not return.
TEST_F(VolumeStoreTest, AVolumeStaysFencedUntilTheNodeItLeftSaysSo) {
  const std::vector<std::string> ids = Run({"a", "b"});
  const std::string a = ids[0], b = ids[1];
  const std::string node_a = NodeOf(a), node_b = NodeOf(b);
  ASSERT_NE(node_a, node_b);
  const std::string work = NewVolume("work", false);
  const std::string data = NewVolume("data", false);
  const std::string logs = NewVolume("logs", false);
  ASSERT_TRUE(volumes_->Attach(tenant_, work, a, false, "/mnt/work", now_).ok());
  ASSERT_TRUE(volumes_->Attach(tenant_, data, a, false, "/mnt/data", now_).ok());
  ASSERT_TRUE(volumes_->Attach(tenant_, logs, b, false, "/mnt/logs", now_).ok());

  // Both nodes go silent: a and b are stopped as of their last heartbeat.
  AgentStore agents(*db_);
  auto downed = agents.MarkSilentNodesDown(absl::Seconds(30), now_ + absl::Minutes(5));
  ASSERT_TRUE(downed.ok()) << downed.status();
  ASSERT_EQ(State(a), "STOPPED");
  EXPECT_EQ(AttachmentOf(work, a), "attached false /mnt/work");

  // The tenant detaches and tries the volume elsewhere: the detach waits and
  // says for what; nothing else may attach it, and it cannot be deleted.
  auto detached = volumes_->Detach(tenant_, work, a, now_);
  ASSERT_TRUE(detached.ok()) << detached.status();
  ASSERT_EQ(detached->attachments.size(), 1u);
  EXPECT_EQ(detached->attachments[0].state, AttachmentState::kDetaching);
  EXPECT_NE(detached->attachments[0].reason.find(NameOf(node_a)), std::string::npos)
      << detached->attachments[0].reason;
  auto other = store_->CreateInstance(tenant_, {"other", 1, "RTX 4090", "ubuntu"}, "r-other",
                                      "f-other", now_);
  ASSERT_TRUE(other.ok()) << other.status();
  auto second = volumes_->Attach(tenant_, work, other->id, false, "/mnt/work", now_);
  EXPECT_EQ(sv::ReasonOf(second.status()), "VOLUME_IN_USE") << second.status();
  EXPECT_EQ(sv::ReasonOf(volumes_->Delete(tenant_, work, now_).status()), "VOLUME_ATTACHED");
  ASSERT_TRUE(store_->DeleteInstance(tenant_, other->id, now_).ok());

  // a is started again with `data` still attached: it waits, though node b
  // is back and free, for as long as node a has not answered.
  ASSERT_TRUE(agents.RegisterNode(NodeRecordOf(node_b), now_).ok());
  ASSERT_TRUE(store_->StartInstance(tenant_, a, now_).ok());
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(a), "PENDING");
  EXPECT_NE(StateReason(a).find("waiting for its volume: volume " + data), std::string::npos)
      << StateReason(a);

  // Node a's agent registers again, on one connection and then another (a
  // second replica). A heartbeat that still lists a (its old process runs
  // on), one from an agent whose lists are not complete, one of another
  // node, and one left queued on the connection the agent moved on from end
  // nothing.
  NodeRecord first = NodeRecordOf(node_a), again = NodeRecordOf(node_a);
  first.connection_id = "conn-first";
  again.connection_id = "conn-second";
  ASSERT_TRUE(agents.RegisterNode(first, now_).ok());
  ASSERT_TRUE(agents.RegisterNode(again, now_).ok());
  ASSERT_TRUE(agents.Heartbeat(node_a, now_, std::vector<std::string>{a}, "conn-second").ok());
  ASSERT_TRUE(agents.Heartbeat(node_a, now_, std::nullopt, "conn-second").ok());
  ASSERT_TRUE(agents.Heartbeat(node_b, now_, std::vector<std::string>{}).ok());
  ASSERT_TRUE(agents.Heartbeat(node_a, now_, std::vector<std::string>{}, "conn-first").ok());
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(a), "PENDING");
  EXPECT_EQ(AttachmentOf(work, a), "detaching false /mnt/work");

  // Its process gone, the node says so: the detach completes and a is placed.
  ASSERT_TRUE(agents.Heartbeat(node_a, now_, std::vector<std::string>{}, "conn-second").ok());
  EXPECT_EQ(AttachmentOf(work, a), "");
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(a), "SCHEDULED");
  EXPECT_TRUE(volumes_->Delete(tenant_, work, now_).ok());

  // b's node is back, but b's own node (node_b here) answered for b already;
  // the operator's override is for a node that stays down: fence one by
  // hand and let the operator vouch for it.
  ASSERT_TRUE(store_->DeleteInstance(tenant_, b, now_).ok());
  EXPECT_EQ(AttachmentOf(logs, b), "") << "node b's heartbeat ended b's fence";
  SchedulingStore admin(*db_);
  int released = -1;
  EXPECT_EQ(sv::ReasonOf(admin.ForgetNodeMounts(NameOf(node_b), now_, &released).status()),
            "NODE_NOT_DOWN");
  EXPECT_EQ(sv::ReasonOf(admin.ForgetNodeMounts("no-such-node", now_, &released).status()),
            "NODE_NOT_FOUND");
  Query(absl::StrCat("UPDATE nodes SET state = 'down' WHERE id = '", node_b, "'"));
  const std::string kept = NewVolume("kept", false);
  auto c = store_->CreateInstance(tenant_, {"c", 1, "RTX 4090", "ubuntu"}, "r-c", "f-c", now_);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(volumes_->Attach(tenant_, kept, c->id, false, "/mnt/kept", now_).ok());
  Query(absl::StrCat("UPDATE volume_attachments SET fenced_nodes = '{", node_b,
                     "}' WHERE volume_id = '", kept, "'"));
  ASSERT_TRUE(store_->DeleteInstance(tenant_, c->id, now_).ok());
  EXPECT_EQ(AttachmentOf(kept, c->id), "detaching false /mnt/kept");
  auto forgot = admin.ForgetNodeMounts(NameOf(node_b), now_, &released);
  ASSERT_TRUE(forgot.ok()) << forgot.status();
  EXPECT_EQ(released, 1);
  EXPECT_EQ(AttachmentOf(kept, c->id), "");
  EXPECT_TRUE(volumes_->Delete(tenant_, kept, now_).ok());
}

// Goal: the API's delete (the batch, sv_delete_instances, which frees the
// GPUs and sets DELETED in one statement) fences as a stop does: its CTEs
// ran the state's trigger first, which dropped the attachment before the
// reservations' trigger could fence it. A node whose agent does not report
// complete lists keeps the old rule (it would never end a fence).
TEST_F(VolumeStoreTest, ABatchDeleteFencesAndANodeThatCannotSayKeepsTheOldRule) {
  const std::vector<std::string> ids = Run({"a", "b"});
  const std::string a = ids[0], b = ids[1];
  const std::string node_a = NodeOf(a), node_b = NodeOf(b);
  const std::string work = NewVolume("work", false);
  const std::string logs = NewVolume("logs", false);
  ASSERT_TRUE(volumes_->Attach(tenant_, work, a, false, "/mnt/work", now_).ok());
  ASSERT_TRUE(volumes_->Attach(tenant_, logs, b, false, "/mnt/logs", now_).ok());
  Query(absl::StrCat("UPDATE nodes SET fences_mounts = false WHERE id = '", node_b, "'"));

  auto deleted = store_->DeleteInstances({{tenant_, a, now_, std::nullopt},
                                          {tenant_, b, now_, std::nullopt}});
  ASSERT_EQ(deleted.size(), 2u);
  ASSERT_TRUE(deleted[0].ok()) << deleted[0].status();
  ASSERT_TRUE(deleted[1].ok()) << deleted[1].status();
  EXPECT_EQ(AttachmentOf(work, a), "detaching false /mnt/work");
  EXPECT_EQ(AttachmentOf(logs, b), "") << "node b's agent cannot say; nothing waits for it";
  ASSERT_TRUE(AgentStore(*db_).Heartbeat(node_a, now_, std::vector<std::string>{}).ok());
  EXPECT_EQ(AttachmentOf(work, a), "");
}

// Goal: starts held for their volumes do not take the queue head's rows.
// A pass reads a bounded head; held rows are not decided on, so a dead
// node's instances started again (hundreds) kept every later request
// unread, and unplaced on a free fleet, until the node returned.
TEST_F(VolumeStoreTest, StartsHeldForTheirVolumesLeaveTheQueueHeadToOthers) {
  const std::string node_a = Query("SELECT id FROM nodes ORDER BY name LIMIT 1")[0][0]
                                 .as<std::string>();
  // More held than the head holds, with the rows a pass reads past it for
  // each waiting tenant (migration 0123).
  std::vector<std::string> held;
  for (int i = 0; i < 10; ++i) {
    const std::string name = absl::StrCat("held-", i);
    auto created = store_->CreateInstance(tenant_, {name, 1, "RTX 4090", "ubuntu"}, "r-" + name,
                                          "f-" + name, now_);
    ASSERT_TRUE(created.ok()) << created.status();
    const std::string volume = NewVolume(name, false);
    ASSERT_TRUE(volumes_->Attach(tenant_, volume, created->id, false, "/mnt/data", now_).ok());
    held.push_back(created->id);
  }
  // As left by a node that went silent under them.
  Query(absl::StrCat("UPDATE volume_attachments SET fenced_nodes = '{", node_a, "}'"));
  auto later = store_->CreateInstance(tenant_, {"later", 8, "RTX 4090", "ubuntu"}, "r-later",
                                      "f-later", now_);
  ASSERT_TRUE(later.ok()) << later.status();

  control::SchedulingOptions options;
  options.queue_max = 1;
  control::Scheduling scheduling(*db_, options);
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(later->id), "SCHEDULED") << StateReason(later->id);
  for (const std::string& id : held) {
    EXPECT_EQ(State(id), "PENDING");
    EXPECT_NE(StateReason(id).find("waiting for its volume"), std::string::npos)
        << StateReason(id);
  }
}

// Goal: a node-local volume attached to a waiting instance while a queue
// pass is deciding (after the pass read the queue, so without its pin)
// keeps the instance off the other nodes: the pass's write reads the
// attachment under the row's lock and leaves it PENDING for the next pass.
// It used to be placed away from its data.
TEST_F(VolumeStoreTest, AnAttachDuringAPassKeepsTheInstanceOnTheVolumesNode) {
  const std::string full = Run({"full"})[0];
  const std::string node = Query(absl::StrCat(
      "SELECT node_id FROM gpu_reservations WHERE instance_id = '", full, "' LIMIT 1"))[0][0]
                               .as<std::string>();
  VolumeSpec spec{"local", 10, VolumeKind::kNodeLocal, false, node};
  auto local = volumes_->Create(tenant_, spec, "v-local", "f-local", now_);
  ASSERT_TRUE(local.ok()) << local.status();
  auto waiting = store_->CreateInstance(tenant_, {"waiting", 1, "RTX 4090", "ubuntu"},
                                        "r-waiting", "f-waiting", now_);
  ASSERT_TRUE(waiting.ok()) << waiting.status();

  SchedulingStore scheduling(*db_);
  auto pass = scheduling.RunQueuePass(
      [&](const FleetView& view) {
        // The volume's node is full, so the pass places the instance on the
        // other one; the attach commits meanwhile.
        auto attached = volumes_->Attach(tenant_, local->record.id, waiting->id, false,
                                         "/mnt/local", now_);
        EXPECT_TRUE(attached.ok()) << attached.status();
        return control::DecideQueue(view, control::SchedulingOptions{});
      },
      100, now_);
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_EQ(State(waiting->id), "PENDING");
  EXPECT_TRUE(Query(absl::StrCat("SELECT 1 FROM gpu_reservations WHERE instance_id = '",
                                 waiting->id, "'"))
                  .empty());
}

// Goal: a node-local volume with no node yet, attached read-only to two
// waiting instances, keeps them on one node: the pass that places the first
// binds the volume to its node, and the second, which fits only on the
// other node, waits. Both used to be placed, on two nodes, and the second
// ran without its data.
TEST_F(VolumeStoreTest, AnUnboundNodeLocalVolumeKeepsItsInstancesOnOneNode) {
  std::vector<std::string> ids;
  const std::string local = SharedLocalVolume({"p1", "p2"}, &ids);
  ASSERT_EQ(ids.size(), 2u);
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(ids[0]), "SCHEDULED");
  EXPECT_EQ(State(ids[1]), "PENDING");
  EXPECT_NE(StateReason(ids[1]).find("is node-local and on no node yet"), std::string::npos)
      << StateReason(ids[1]);
  EXPECT_EQ(Query(absl::StrCat("SELECT node_id FROM volumes WHERE id = '", local,
                               "'"))[0][0]
                .as<std::string>(),
            NodeOf(ids[0]));
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(ids[1]), "PENDING") << StateReason(ids[1]);
  // A bind the pass skipped (another transaction held the volume's row)
  // leaves the volume on no node with the first already placed: the second
  // still follows it, and is not placed on the other node.
  Query(absl::StrCat("UPDATE volumes SET node_id = NULL WHERE id = '", local, "'"));
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  EXPECT_EQ(State(ids[1]), "PENDING");
  EXPECT_NE(StateReason(ids[1]).find("the node instance " + ids[0] + " is placed on first"),
            std::string::npos)
      << StateReason(ids[1]);
}

// Goal: two waiting instances of one node-local volume on no node yet are
// not decided on in one pass. They could be placed on two nodes; the pass
// then left the second out when it wrote, and when it had moved instances
// to make room for it, it was rolled back (MOVE_RACED), the same on every
// pass: nothing was placed for anyone.
TEST_F(VolumeStoreTest, SharersOfAnUnboundNodeLocalVolumeDoNotStallThePass) {
  ASSERT_TRUE(sv::testing::AddSimulatedNodes(*store_, 3, 1, now_).ok());
  sv::testing::ExecSql(url_, "UPDATE nodes SET fences_mounts = true");
  // Halves of node-0 and node-1, movable and running for an hour; node-2
  // is free.
  std::vector<std::string> smalls;
  for (const char* name : {"m1", "m2", "m3", "m4"}) {
    auto created = store_->CreateInstance(tenant_, {name, 4, "RTX 4090", "ubuntu"},
                                          absl::StrCat("r-", name), absl::StrCat("f-", name),
                                          now_);
    ASSERT_TRUE(created.ok()) << created.status();
    smalls.push_back(created->id);
  }
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  ASSERT_TRUE(scheduling.RunPass(now_).ok());
  ASSERT_EQ(NodeOf(smalls[0]), NodeOf(smalls[1]));
  ASSERT_EQ(NodeOf(smalls[2]), NodeOf(smalls[3]));
  ASSERT_TRUE(store_->DeleteInstance(tenant_, smalls[1], now_).ok());
  ASSERT_TRUE(store_->DeleteInstance(tenant_, smalls[3], now_).ok());
  sv::testing::ExecSql(url_, absl::StrCat(
      "UPDATE instances SET state = 'RUNNING', movable = true, "
      "running_since = to_timestamp(", absl::ToUnixSeconds(now_ - absl::Hours(1)), ") "
      "WHERE id IN ('", smalls[0], "', '", smalls[2], "')"));

  std::vector<std::string> ids;
  const std::string local = SharedLocalVolume({"first", "second"}, &ids);
  ASSERT_EQ(ids.size(), 2u);
  auto pass = scheduling.RunPass(now_);
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_EQ(State(ids[0]), "SCHEDULED") << StateReason(ids[0]);
  EXPECT_EQ(State(ids[1]), "PENDING");
  EXPECT_NE(StateReason(ids[1]).find("waiting for its volume: volume " + local +
                                     " is node-local and on no node yet"),
            std::string::npos)
      << StateReason(ids[1]);
  pass = scheduling.RunPass(now_);
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_EQ(State(ids[1]), "PENDING") << "its volume's node is full";
}

// Goal: an instance that a node-local volume is moving to is not grown
// into a gang: the move completes without a placement check, and the
// volume was left attaching for ever on an instance spanning two nodes.
TEST_F(VolumeStoreTest, AnInstanceANodeLocalVolumeMovesToIsNotGrownIntoAGang) {
  const std::string x = Run({"x"})[0];
  VolumeSpec spec{"local", 10, VolumeKind::kNodeLocal, false, NodeOf(x)};
  auto local = volumes_->Create(tenant_, spec, "v-local", "f-local", now_);
  ASSERT_TRUE(local.ok()) << local.status();
  // As a move waiting for its old instance's node to unmount it leaves it.
  Query(absl::StrCat("UPDATE volumes SET move_to_instance_id = '", x,
                     "', move_mount_path = '/mnt/local' WHERE id = '", local->record.id, "'"));
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  auto grown = scheduling.Resize(tenant_, x, 16, now_);
  EXPECT_EQ(sv::ReasonOf(grown.status()), "VOLUME_NODE_MISMATCH") << grown.status();
  Query(absl::StrCat("UPDATE volumes SET move_to_instance_id = NULL, move_mount_path = NULL "
                     "WHERE id = '", local->record.id, "'"));
  grown = scheduling.Resize(tenant_, x, 16, now_);
  EXPECT_TRUE(grown.ok()) << grown.status();
}

}  // namespace
}  // namespace sv::store
