// The scheduler wired into svd, end to end: a real svd on a real PostgreSQL,
// driven through gRPC and svctl. Queue position and reason, a gang that a
// stream of small instances cannot starve, quotas, resize and cordon/drain.

#include <gtest/gtest.h>

#include <map>
#include <pqxx/pqxx>
#include <set>
#include <chrono>
#include <thread>

#include "api/errors.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using v1::Instance;

class SchedulerApiTest : public ::testing::Test {
 protected:
  void StartSvd(int nodes, int leaves, std::vector<std::string> extra_args = {}) {
    database_url_ = CreateTestDatabase();
    svd_ = std::make_unique<SvdProcess>(
        SvdOptions{database_url_, nodes, leaves, std::move(extra_args)});
    ASSERT_TRUE(svd_->Start());
    token_ = CreateTenant(*svd_, "sched");
    ASSERT_FALSE(token_.empty());
    stub_ = v1::InstanceService::NewStub(svd_->channel());
    admin_ = v1::SchedulerAdminService::NewStub(svd_->channel());
  }

  void TearDown() override {
    stub_.reset();
    admin_.reset();
    svd_.reset();
  }

  std::string TenantId(const std::string& token) {
    v1::AccountService::Stub account(svd_->channel());
    v1::Account out;
    EXPECT_TRUE(account.GetCurrentAccount(Context(token).get(), {}, &out).ok());
    return out.tenant_id();
  }

  grpc::Status Create(int gpus, Instance* out, const std::string& request_id = "") {
    v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(gpus);
    request.set_request_id(request_id);
    return stub_->CreateInstance(Context(token_).get(), request, out);
  }

  // The instance as the test's tenant (or the tenant of `token`) sees it.
  Instance Get(const std::string& id, const std::string& token = "") {
    v1::GetInstanceRequest request;
    request.set_id(id);
    Instance out;
    grpc::Status s =
        stub_->GetInstance(Context(token.empty() ? token_ : token).get(), request, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  // The instance's queue position once the scheduling loop has written one
  // (0 after 10 s). A create answers the position as of its commit, which
  // the loop may not have reached yet on a loaded machine.
  int PositionOf(const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      const int position = Get(id).queue_position();
      if (position > 0 || std::chrono::steady_clock::now() >= deadline) return position;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  void Delete(const std::string& id) {
    v1::DeleteInstanceRequest request;
    request.set_id(id);
    Instance out;
    ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), request, &out).ok());
  }

  grpc::Status Resize(const std::string& id, int gpus, v1::ResizeInstanceResponse* out) {
    v1::ResizeInstanceRequest request;
    request.set_id(id);
    request.set_gpu_count(gpus);
    return stub_->ResizeInstance(Context(token_).get(), request, out);
  }

  // Polls until the instance reaches `state` or 20 s pass.
  Instance WaitFor(const std::string& id, v1::InstanceState state,
                   const std::string& token = "") {
    Instance i;
    for (int tries = 0; tries < 400; ++tries) {
      i = Get(id, token);
      if (i.state() == state) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return i;
  }

  // The test's tenant, with a GPU quota of 0, queues `n` 1-GPU instances
  // that cannot be placed; returns their ids.
  std::vector<std::string> QueueAtQuota(int n) {
    v1::SetTenantQuotaRequest set;
    set.mutable_quota()->set_tenant_id(TenantId(token_));
    set.mutable_quota()->set_gpus_in_use_max(0);
    set.mutable_quota()->set_pending_count_max(100);
    v1::TenantQuota quota;
    EXPECT_TRUE(admin_->SetTenantQuota(Context(svd_->admin_key()).get(), set, &quota).ok());
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      Instance out;
      EXPECT_TRUE(Create(1, &out).ok());
      ids.push_back(out.id());
    }
    return ids;
  }

  Instance CreateRunning(int gpus) {
    Instance i;
    grpc::Status s = Create(gpus, &i);
    EXPECT_TRUE(s.ok()) << s.error_message();
    i = WaitFor(i.id(), v1::RUNNING);
    EXPECT_EQ(i.state(), v1::RUNNING) << i.state_reason();
    return i;
  }

  grpc::Status NodeAction(const std::string& verb, const std::string& name,
                          v1::DrainNodeResponse* out, const std::string& token = "") {
    auto context = Context(token.empty() ? svd_->admin_key() : token);
    if (verb == "cordon") {
      v1::CordonNodeRequest request;
      request.set_name(name);
      return admin_->CordonNode(context.get(), request, out->mutable_node());
    }
    if (verb == "uncordon") {
      v1::UncordonNodeRequest request;
      request.set_name(name);
      return admin_->UncordonNode(context.get(), request, out->mutable_node());
    }
    v1::DrainNodeRequest request;
    request.set_name(name);
    return admin_->DrainNode(context.get(), request, out);
  }

  RunResult Svctl(std::vector<std::string> args, bool admin = false) {
    args.insert(args.begin(), SvctlPath());
    return RunCapture(args, {"SVCTL_ENDPOINT=" + svd_->endpoint(),
                             (admin ? "SVCTL_ADMIN_TOKEN=" : "SVCTL_TOKEN=") +
                                 (admin ? svd_->admin_key() : token_),
                             "HOME=" + ::testing::TempDir(), "XDG_CONFIG_HOME="});
  }

  std::set<std::string> NodesOf(const Instance& i) {
    std::set<std::string> nodes;
    for (const auto& p : i.placement()) nodes.insert(p.node_name());
    return nodes;
  }

  std::string database_url_;
  std::unique_ptr<SvdProcess> svd_;
  std::string token_;
  std::unique_ptr<v1::InstanceService::Stub> stub_;
  std::unique_ptr<v1::SchedulerAdminService::Stub> admin_;
};

// A 32-GPU gang waits for a busy node; small instances submitted after it
// must not take the nodes it waits for. Positions and reasons are visible
// through the API and svctl, and the gang runs first once capacity frees.
TEST_F(SchedulerApiTest, GangIsNotStarvedAndQueueIsVisible) {
  StartSvd(4, 1);
  Instance blocker = CreateRunning(8);
  Instance gang;
  ASSERT_TRUE(Create(32, &gang).ok());
  EXPECT_EQ(gang.state(), v1::PENDING);
  EXPECT_EQ(PositionOf(gang.id()), 1);
  EXPECT_FALSE(gang.state_reason().empty());
  std::vector<std::string> smalls;
  for (int i = 0; i < 4; ++i) {
    Instance small;
    ASSERT_TRUE(Create(1, &small).ok());
    EXPECT_EQ(small.state(), v1::PENDING) << "a small instance overtook the gang";
    EXPECT_EQ(PositionOf(small.id()), 2 + i);
    smalls.push_back(small.id());
  }
  v1::ListInstancesResponse list;
  ASSERT_TRUE(stub_->ListInstances(Context(token_).get(), {}, &list).ok());
  int listed_pending = 0;
  for (const auto& i : list.instances()) {
    if (i.state() == v1::PENDING) {
      EXPECT_GT(i.queue_position(), 0);
      ++listed_pending;
    }
  }
  EXPECT_EQ(listed_pending, 5);

  RunResult shown = Svctl({"get", smalls[0]});
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("position 2"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find(Get(smalls[0]).state_reason()), std::string::npos) << shown.out;

  Delete(blocker.id());
  gang = WaitFor(gang.id(), v1::RUNNING);
  ASSERT_EQ(gang.state(), v1::RUNNING) << gang.state_reason();
  EXPECT_EQ(NodesOf(gang).size(), 4u);
  EXPECT_EQ(gang.queue_position(), 0);
  for (const auto& id : smalls) EXPECT_EQ(Get(id).state(), v1::PENDING);

  Delete(gang.id());
  for (const auto& id : smalls) EXPECT_EQ(WaitFor(id, v1::RUNNING).state(), v1::RUNNING);
}

// The pending quota refuses creates at admission; the GPU quota keeps an
// instance waiting with a reason that says so. Only operators set quotas.
TEST_F(SchedulerApiTest, QuotasLimitPendingAndGpusInUse) {
  StartSvd(4, 1);
  const std::string tenant_id = TenantId(token_);
  v1::SetTenantQuotaRequest set;
  set.mutable_quota()->set_tenant_id(tenant_id);
  set.mutable_quota()->set_gpus_in_use_max(8);
  set.mutable_quota()->set_pending_count_max(1);
  v1::TenantQuota quota;
  grpc::Status denied = admin_->SetTenantQuota(Context(token_).get(), set, &quota);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // The central authorization table refuses it before the service runs.
  EXPECT_EQ(api::ReasonOf(denied), "PERMISSION_DENIED");
  ASSERT_TRUE(admin_->SetTenantQuota(Context(svd_->admin_key()).get(), set, &quota).ok());

  CreateRunning(8);
  Instance waiting;
  ASSERT_TRUE(Create(1, &waiting, "quota-1").ok());
  EXPECT_EQ(waiting.state(), v1::PENDING);
  EXPECT_NE(waiting.state_reason().find("quota"), std::string::npos) << waiting.state_reason();
  Instance refused;
  grpc::Status over = Create(1, &refused);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(over), "QUOTA_EXCEEDED");
  Instance retried;  // a retry of the accepted create still gets its answer
  ASSERT_TRUE(Create(1, &retried, "quota-1").ok());
  EXPECT_EQ(retried.id(), waiting.id());

  set.mutable_quota()->set_gpus_in_use_max(16);
  ASSERT_TRUE(admin_->SetTenantQuota(Context(svd_->admin_key()).get(), set, &quota).ok());
  EXPECT_EQ(WaitFor(waiting.id(), v1::RUNNING).state(), v1::RUNNING);

  set.mutable_quota()->set_gpus_in_use_max(-1);
  grpc::Status invalid = admin_->SetTenantQuota(Context(svd_->admin_key()).get(), set, &quota);
  EXPECT_EQ(api::ReasonOf(invalid), "INVALID_QUOTA");
  set.mutable_quota()->set_gpus_in_use_max(8);
  set.mutable_quota()->set_tenant_id("ten_nobody");
  grpc::Status unknown = admin_->SetTenantQuota(Context(svd_->admin_key()).get(), set, &quota);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(unknown), "TENANT_NOT_FOUND");

  v1::GetTenantQuotaRequest get;
  get.set_tenant_id("ten_nobody");
  EXPECT_EQ(api::ReasonOf(admin_->GetTenantQuota(Context(svd_->admin_key()).get(), get, &quota)),
            "TENANT_NOT_FOUND");
  RunResult cli = Svctl({"admin", "quota", "get", tenant_id}, true);
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("\"gpus_in_use_max\": 16"), std::string::npos) << cli.out;
}

// 8 -> 64 -> 128 -> 8 keeps the id and records each resize; growing stays
// on the instance's leaf while it can; short capacity fails cleanly.
// A tenant whose waiting instances fill the pass's head (--queue-max, 4
// here) and cannot be placed (its GPU quota is spent) must not hide the
// other tenants' requests: the pass also reads the first few of each tenant
// missing from the head (migration 0121). Until 2026-12-07 a tenant at its
// quota with 1,000 queued jobs stopped placement for everyone.
TEST_F(SchedulerApiTest, ATenantAtItsQuotaDoesNotHideTheQueueFromOthers) {
  StartSvd(2, 1, {"--queue-max", "4"});
  const std::vector<std::string> blocked = QueueAtQuota(6);
  const std::string other = CreateTenant(*svd_, "other");
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(8);
  Instance theirs;
  ASSERT_TRUE(stub_->CreateInstance(Context(other).get(), request, &theirs).ok());
  theirs = WaitFor(theirs.id(), v1::RUNNING, other);
  EXPECT_EQ(theirs.state(), v1::RUNNING) << theirs.state_reason();
  for (const std::string& id : blocked) {
    const Instance mine = Get(id);
    EXPECT_EQ(mine.state(), v1::PENDING);
  }
  EXPECT_NE(Get(blocked.front()).state_reason().find("quota"), std::string::npos)
      << Get(blocked.front()).state_reason();
}

// The same, for a tenant that has a row in the full head: its 128-GPU gang
// can never fit this fleet, and the rest of the head is a tenant at its
// quota. Rows of tenants already in the head were not added, so the gang's
// owner's later 1-GPU request was never read, never placed, while the
// fleet sat idle (migration 0123: every tenant's first rows past the head).
TEST_F(SchedulerApiTest, ATenantWithARowInTheHeadIsNotHiddenBehindIt) {
  StartSvd(2, 1, {"--queue-max", "4"});
  const std::string owner = CreateTenant(*svd_, "gang-owner");
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(128);
  Instance gang;
  ASSERT_TRUE(stub_->CreateInstance(Context(owner).get(), request, &gang).ok());
  QueueAtQuota(6);
  request.mutable_instance()->set_gpu_count(1);
  Instance later;
  ASSERT_TRUE(stub_->CreateInstance(Context(owner).get(), request, &later).ok());
  later = WaitFor(later.id(), v1::RUNNING, owner);
  EXPECT_EQ(later.state(), v1::RUNNING) << later.state_reason();
  EXPECT_EQ(Get(gang.id(), owner).state(), v1::PENDING);
}

TEST_F(SchedulerApiTest, ResizeGrowsAndShrinksInPlace) {
  StartSvd(16, 2);
  Instance gang = CreateRunning(8);
  const std::string first_node = *NodesOf(gang).begin();
  const std::string leaf = gang.placement(0).leaf_switch();

  v1::ResizeInstanceResponse resized;
  ASSERT_TRUE(Resize(gang.id(), 64, &resized).ok());
  EXPECT_EQ(resized.previous_gpu_count(), 8);
  EXPECT_EQ(resized.instance().id(), gang.id());
  EXPECT_EQ(resized.instance().gpu_count(), 64);
  EXPECT_EQ(resized.instance().state(), v1::RUNNING);
  EXPECT_EQ(NodesOf(resized.instance()).size(), 8u);
  EXPECT_TRUE(NodesOf(resized.instance()).count(first_node));
  for (const auto& p : resized.instance().placement()) EXPECT_EQ(p.leaf_switch(), leaf);

  ASSERT_TRUE(Resize(gang.id(), 128, &resized).ok());
  EXPECT_EQ(NodesOf(resized.instance()).size(), 16u);
  ASSERT_TRUE(Resize(gang.id(), 8, &resized).ok());
  EXPECT_EQ(resized.previous_gpu_count(), 128);
  EXPECT_EQ(NodesOf(resized.instance()).size(), 1u);

  Instance other = CreateRunning(8);
  grpc::Status short_of = Resize(gang.id(), 128, &resized);
  EXPECT_EQ(short_of.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(short_of), "INSUFFICIENT_CAPACITY");
  EXPECT_EQ(Get(gang.id()).gpu_count(), 8);  // nothing changed

  EXPECT_EQ(api::ReasonOf(Resize(gang.id(), 12, &resized)), "INVALID_GPU_COUNT");
  Instance small = CreateRunning(4);
  grpc::Status partial = Resize(small.id(), 16, &resized);
  EXPECT_EQ(partial.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(partial), "NOT_WHOLE_NODES");
  Delete(other.id());
  grpc::Status deleted = Resize(other.id(), 16, &resized);
  EXPECT_EQ(api::ReasonOf(deleted), "INSTANCE_NOT_RUNNING");
  EXPECT_EQ(api::ReasonOf(Resize("ins_doesnotexist", 16, &resized)), "INSTANCE_NOT_FOUND");

  RunResult cli = Svctl({"resize", gang.id(), "--gpus", "16"});
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("resized from 8 to 16 GPUs"), std::string::npos) << cli.out;

  pqxx::connection db(database_url_);
  pqxx::work txn(db);
  auto events = txn.exec_params(
      "SELECT reason FROM instance_events WHERE instance_id = $1 AND reason LIKE 'resized%' "
      "ORDER BY id",
      gang.id());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0][0].as<std::string>(), "resized from 8 to 64 GPUs");
  EXPECT_EQ(events[3][0].as<std::string>(), "resized from 8 to 16 GPUs");
  EXPECT_EQ(txn.exec_params1("SELECT count(*) FROM gpu_reservations WHERE instance_id = $1",
                             gang.id())[0].as<int>(), 16);
}

// A gang created to span at most one leaf switch stays on one: growing it
// past its leaf is refused and changes nothing; within it, it grows.
TEST_F(SchedulerApiTest, ResizeKeepsAGangWithinItsLeafLimit) {
  StartSvd(16, 2);
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(48);
  request.mutable_instance()->set_max_leaves(1);
  Instance gang;
  grpc::Status created = stub_->CreateInstance(Context(token_).get(), request, &gang);
  ASSERT_TRUE(created.ok()) << created.error_message();
  gang = WaitFor(gang.id(), v1::RUNNING);
  ASSERT_EQ(gang.state(), v1::RUNNING) << gang.state_reason();
  const std::string leaf = gang.placement(0).leaf_switch();

  v1::ResizeInstanceResponse resized;
  ASSERT_TRUE(Resize(gang.id(), 64, &resized).ok());
  for (const auto& p : resized.instance().placement()) EXPECT_EQ(p.leaf_switch(), leaf);
  grpc::Status past = Resize(gang.id(), 72, &resized);
  EXPECT_EQ(past.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(past), "INSUFFICIENT_CAPACITY");
  EXPECT_NE(past.error_message().find("at most 1 leaf switches"), std::string::npos)
      << past.error_message();
  const Instance after = Get(gang.id());
  EXPECT_EQ(after.gpu_count(), 64);
  EXPECT_EQ(after.max_leaves(), 1);
  for (const auto& p : after.placement()) EXPECT_EQ(p.leaf_switch(), leaf);
}

// A cordoned node takes nothing new; drain names what must move; uncordon
// lets the queue in; the operator lists every tenant's instances by node,
// state and tenant. Only operators may do any of it.
TEST_F(SchedulerApiTest, CordonDrainUncordonAndList) {
  StartSvd(2, 1);
  v1::DrainNodeResponse out;
  ASSERT_TRUE(NodeAction("cordon", "sim-node-001", &out).ok());
  EXPECT_EQ(out.node().state(), v1::FLEET_NODE_CORDONED);

  Instance first = CreateRunning(8);
  EXPECT_EQ(*NodesOf(first).begin(), "sim-node-000");
  Instance second;
  ASSERT_TRUE(Create(8, &second).ok());
  EXPECT_EQ(second.state(), v1::PENDING);
  EXPECT_EQ(second.queue_position(), 1);

  v1::ListFleetNodesRequest list_request;
  list_request.set_page_size(1);
  v1::ListFleetNodesResponse page1, page2;
  ASSERT_TRUE(admin_->ListNodes(Context(svd_->admin_key()).get(), list_request, &page1).ok());
  ASSERT_EQ(page1.nodes_size(), 1);
  EXPECT_EQ(page1.nodes(0).name(), "sim-node-000");
  EXPECT_EQ(page1.nodes(0).free_gpu_count(), 0);
  EXPECT_EQ(page1.nodes(0).instance_count(), 1);
  list_request.set_page_token(page1.next_page_token());
  ASSERT_TRUE(admin_->ListNodes(Context(svd_->admin_key()).get(), list_request, &page2).ok());
  ASSERT_EQ(page2.nodes_size(), 1);
  EXPECT_EQ(page2.nodes(0).state(), v1::FLEET_NODE_CORDONED);
  EXPECT_EQ(page2.nodes(0).free_gpu_count(), 8);

  ASSERT_TRUE(NodeAction("drain", "sim-node-000", &out).ok());
  EXPECT_EQ(out.node().state(), v1::FLEET_NODE_DRAINING);
  ASSERT_EQ(out.instances_to_move_size(), 1);
  EXPECT_EQ(out.instances_to_move(0).instance_id(), first.id());
  EXPECT_EQ(out.instances_to_move(0).gpu_count(), 8);

  // The operator finds instances by node, state and tenant.
  auto fleet = [&](const std::string& node, v1::InstanceState state, const std::string& tenant,
                   std::vector<std::string>* ids, const std::string& key = "") {
    v1::ListFleetInstancesRequest request;
    request.set_node(node);
    request.set_state(state);
    request.set_tenant_id(tenant);
    request.set_page_size(1);  // Every page, one at a time.
    ids->clear();
    for (int page = 0; page < 10; ++page) {
      v1::ListFleetInstancesResponse response;
      grpc::Status status = admin_->ListFleetInstances(
          Context(key.empty() ? svd_->admin_key() : key).get(), request, &response);
      if (!status.ok()) return status;
      for (const auto& i : response.instances()) {
        ids->push_back(i.id());
        EXPECT_EQ(i.tenant_id(), first.tenant_id());
      }
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    return grpc::Status::OK;
  };
  std::vector<std::string> ids;
  ASSERT_TRUE(fleet("sim-node-000", v1::INSTANCE_STATE_UNSPECIFIED, "", &ids).ok());
  EXPECT_EQ(ids, std::vector<std::string>{first.id()});
  ASSERT_TRUE(fleet("", v1::PENDING, "", &ids).ok());
  EXPECT_EQ(ids, std::vector<std::string>{second.id()});
  ASSERT_TRUE(fleet("", v1::INSTANCE_STATE_UNSPECIFIED, first.tenant_id(), &ids).ok());
  EXPECT_EQ(ids, (std::vector<std::string>{first.id(), second.id()}));
  ASSERT_TRUE(fleet("sim-node-001", v1::INSTANCE_STATE_UNSPECIFIED, "", &ids).ok());
  EXPECT_TRUE(ids.empty());
  grpc::Status no_node = fleet("sim-node-999", v1::INSTANCE_STATE_UNSPECIFIED, "", &ids);
  EXPECT_EQ(no_node.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(no_node), "NODE_NOT_FOUND");
  grpc::Status no_tenant = fleet("", v1::INSTANCE_STATE_UNSPECIFIED, "ten-nope", &ids);
  EXPECT_EQ(api::ReasonOf(no_tenant), "TENANT_NOT_FOUND");
  grpc::Status not_operator = fleet("", v1::INSTANCE_STATE_UNSPECIFIED, "", &ids, token_);
  EXPECT_EQ(not_operator.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  RunResult on_node = Svctl({"admin", "instances", "--node", "sim-node-000"}, true);
  EXPECT_EQ(on_node.exit_code, 0) << on_node.err;
  EXPECT_NE(on_node.out.find(first.id()), std::string::npos) << on_node.out;
  EXPECT_NE(on_node.out.find(first.tenant_id()), std::string::npos) << on_node.out;
  EXPECT_EQ(on_node.out.find(second.id()), std::string::npos) << on_node.out;
  RunResult bad_state = Svctl({"admin", "instances", "--state", "asleep"}, true);
  EXPECT_NE(bad_state.exit_code, 0);
  EXPECT_NE(bad_state.err.find("--state must be"), std::string::npos) << bad_state.err;

  RunResult cli = Svctl({"admin", "nodes", "list"}, true);
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("draining"), std::string::npos) << cli.out;
  EXPECT_NE(cli.out.find("cordoned"), std::string::npos) << cli.out;

  RunResult uncordon = Svctl({"admin", "nodes", "uncordon", "sim-node-001"}, true);
  EXPECT_EQ(uncordon.exit_code, 0) << uncordon.err;
  second = WaitFor(second.id(), v1::RUNNING);
  ASSERT_EQ(second.state(), v1::RUNNING) << second.state_reason();
  EXPECT_EQ(*NodesOf(second).begin(), "sim-node-001");

  grpc::Status unknown = NodeAction("cordon", "sim-node-999", &out);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(unknown), "NODE_NOT_FOUND");
  grpc::Status member = NodeAction("drain", "sim-node-001", &out, token_);
  EXPECT_EQ(member.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  RunResult member_cli = Svctl({"admin", "nodes", "list"}, false);
  EXPECT_NE(member_cli.exit_code, 0);
}

// Only an operator can move an instance up the queue; the pass then places
// it first when capacity frees.
TEST_F(SchedulerApiTest, OperatorPriorityReordersTheQueue) {
  StartSvd(1, 1);
  Instance blocker = CreateRunning(8);
  Instance older, newer;
  ASSERT_TRUE(Create(8, &older).ok());
  ASSERT_TRUE(Create(8, &newer).ok());
  EXPECT_EQ(older.queue_position(), 1);
  EXPECT_EQ(newer.queue_position(), 2);

  v1::SetInstancePriorityRequest request;
  request.set_instance_id(newer.id());
  request.set_priority(10);
  v1::InstancePriority out;
  grpc::Status member = admin_->SetInstancePriority(Context(token_).get(), request, &out);
  EXPECT_EQ(member.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  request.set_priority(1001);
  grpc::Status invalid =
      admin_->SetInstancePriority(Context(svd_->admin_key()).get(), request, &out);
  EXPECT_EQ(api::ReasonOf(invalid), "INVALID_PRIORITY");
  RunResult cli = Svctl({"admin", "priority", newer.id(), "10"}, true);
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("\"priority\": 10"), std::string::npos) << cli.out;

  // The kick after the change runs a pass that rewrites the positions.
  for (int tries = 0; tries < 400 && Get(newer.id()).queue_position() != 1; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Get(newer.id()).queue_position(), 1);
  EXPECT_EQ(Get(older.id()).queue_position(), 2);
  Delete(blocker.id());
  EXPECT_EQ(WaitFor(newer.id(), v1::RUNNING).state(), v1::RUNNING);
  EXPECT_EQ(Get(older.id()).state(), v1::PENDING);
}

// Two nodes half used by 1-GPU instances and an 8-GPU instance waiting:
// nothing moves until the tenant makes the instances of one node movable;
// then one pass moves them to the other node, the waiting instance gets the
// emptied node, and the moved instances run again, each start and move in
// their events. No GPU is ever held twice.
TEST_F(SchedulerApiTest, MovableInstancesMakeRoomForAWaitingWholeNode) {
  StartSvd(2, 1, {"--move-running-min-s=0"});
  std::vector<Instance> small;
  for (int i = 0; i < 16; ++i) small.push_back(CreateRunning(1));
  // Free GPUs 4-7 of each node: 8 free GPUs, no whole node.
  std::map<std::string, std::vector<std::string>> kept;  // node -> instances
  std::string deleted;
  for (const Instance& i : small) {
    ASSERT_EQ(i.placement_size(), 1);
    if (i.placement(0).gpu_indices(0) >= 4) {
      Delete(i.id());
      deleted = i.id();
    } else {
      kept[i.placement(0).node_name()].push_back(i.id());
    }
  }
  ASSERT_EQ(kept.size(), 2u);
  ASSERT_EQ(kept["sim-node-001"].size(), 4u);
  // The agents' run number of each instance (queue_seq): a move is a new
  // run, so an agent never keeps a moved process on its old GPUs.
  auto run_of = [&](const std::string& id) {
    pqxx::connection c(database_url_);
    pqxx::nontransaction n(c);
    return n.exec_params1("SELECT queue_seq FROM instances WHERE id = $1", id)[0]
        .as<int64_t>();
  };
  std::map<std::string, int64_t> runs;
  for (const std::string& id : kept["sim-node-001"]) runs[id] = run_of(id);

  Instance big;
  ASSERT_TRUE(Create(8, &big).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // passes run each second
  big = Get(big.id());
  EXPECT_EQ(big.state(), v1::PENDING);
  EXPECT_NE(big.state_reason().find("waiting for capacity"), std::string::npos)
      << big.state_reason();

  // One by svctl (and its output), the rest by the API; setting it twice
  // changes nothing.
  const std::vector<std::string>& movers = kept["sim-node-001"];
  RunResult cli = Svctl({"movable", movers[0], "on"});
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("movable:"), std::string::npos) << cli.out;
  for (const std::string& id : movers) {
    v1::SetInstanceMovableRequest request;
    request.set_id(id);
    request.set_movable(true);
    Instance out;
    grpc::Status status = stub_->SetInstanceMovable(Context(token_).get(), request, &out);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(out.movable());
  }

  big = WaitFor(big.id(), v1::RUNNING);
  ASSERT_EQ(big.state(), v1::RUNNING) << big.state_reason();
  EXPECT_EQ(NodesOf(big), std::set<std::string>{"sim-node-001"});
  std::set<std::pair<std::string, int>> held;
  for (int gpu : big.placement(0).gpu_indices()) held.insert({"sim-node-001", gpu});
  for (const auto& [node, ids] : kept) {
    for (const std::string& id : ids) {
      Instance i = WaitFor(id, v1::RUNNING);
      ASSERT_EQ(i.state(), v1::RUNNING) << id << ": " << i.state_reason();
      EXPECT_EQ(NodesOf(i), std::set<std::string>{"sim-node-000"}) << id;
      for (int gpu : i.placement(0).gpu_indices()) {
        EXPECT_TRUE(held.insert({i.placement(0).node_name(), gpu}).second)
            << "GPU " << gpu << " held twice";
      }
    }
  }
  EXPECT_EQ(held.size(), 16u);
  for (const auto& [id, run] : runs) EXPECT_NE(run_of(id), run) << id << " moved in its run";

  RunResult events = Svctl({"events", movers[1]});
  ASSERT_EQ(events.exit_code, 0) << events.err;
  const size_t moved = events.out.find("moved from sim-node-001[");
  ASSERT_NE(moved, std::string::npos) << events.out;
  EXPECT_NE(events.out.find("to sim-node-000[", moved), std::string::npos) << events.out;
  EXPECT_NE(events.out.find("waiting 8-GPU instance"), std::string::npos) << events.out;
  EXPECT_EQ(events.out.find(big.id()), std::string::npos) << "names the waiting instance";
  // RUNNING -> SCHEDULED (the move), then STARTING -> RUNNING on the new node.
  EXPECT_NE(events.out.find("RUNNING", moved), std::string::npos) << events.out;

  pqxx::connection db(database_url_);
  pqxx::work txn(db);
  EXPECT_EQ(txn.exec1("SELECT count(*) FROM instance_events WHERE from_state = 'RUNNING' "
                      "AND to_state = 'SCHEDULED'")[0]
                .as<int>(),
            4);
  EXPECT_EQ(txn.exec1("SELECT count(*) FROM gpu_reservations")[0].as<int>(), 16);

  // Errors: an unknown id, another tenant's instance, a deleted one.
  v1::SetInstanceMovableRequest request;
  request.set_id("ins-doesnotexist00");
  request.set_movable(true);
  Instance out;
  grpc::Status unknown = stub_->SetInstanceMovable(Context(token_).get(), request, &out);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(unknown), "INSTANCE_NOT_FOUND");
  const std::string other = CreateTenant(*svd_, "other");
  request.set_id(movers[0]);
  grpc::Status foreign = stub_->SetInstanceMovable(Context(other).get(), request, &out);
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND);
  request.set_id(deleted);
  grpc::Status finished = stub_->SetInstanceMovable(Context(token_).get(), request, &out);
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(finished), "INSTANCE_FINISHED");
  // Nor does a deleted instance take an idle policy (it answered OK and
  // moved the time the instance shows as deleted).
  const std::string deleted_at =
      txn.exec1("SELECT updated_at::text FROM instances WHERE id = " + txn.quote(deleted))[0]
          .as<std::string>();
  txn.commit();
  v1::SetIdlePolicyRequest idle;
  idle.set_id(deleted);
  idle.set_idle_seconds(600);
  idle.set_utilization_pct(10);
  finished = stub_->SetIdlePolicy(Context(token_).get(), idle, &out);
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(finished), "INSTANCE_FINISHED");
  pqxx::work after(db);
  EXPECT_EQ(after.exec1("SELECT updated_at::text FROM instances WHERE id = " +
                        after.quote(deleted))[0]
                .as<std::string>(),
            deleted_at);
}

}  // namespace
}  // namespace sv::testing
