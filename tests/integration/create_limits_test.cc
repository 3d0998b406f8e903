// Limits a create must honour exactly: the tenant's pending quota under a
// burst of concurrent creates, the instance limit through churn and
// restarts (the bounds of migration 0092), and a gang's limit on leaf
// switches.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "api/errors.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

grpc::Status Create(v1::InstanceService::Stub& stub, const std::string& token, int gpus,
                    int max_leaves, v1::Instance* out) {
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(gpus);
  request.mutable_instance()->set_max_leaves(max_leaves);
  return stub.CreateInstance(Context(token).get(), request, out);
}

// Sets the tenant's quota (as an operator); returns the tenant's id, empty
// on failure.
std::string SetQuota(SvdProcess& svd, const std::string& token, int pending_count_max,
                     int instances_max = 0) {
  v1::Account me;
  if (!v1::AccountService::NewStub(svd.channel())
           ->GetCurrentAccount(Context(token).get(), {}, &me)
           .ok()) {
    return "";
  }
  v1::SetTenantQuotaRequest quota;
  quota.mutable_quota()->set_tenant_id(me.tenant_id());
  quota.mutable_quota()->set_gpus_in_use_max(1024);
  quota.mutable_quota()->set_pending_count_max(pending_count_max);
  quota.mutable_quota()->set_instances_max(instances_max);
  v1::TenantQuota set;
  grpc::Status s = v1::SchedulerAdminService::NewStub(svd.channel())
                       ->SetTenantQuota(Context(svd.admin_key()).get(), quota, &set);
  return s.ok() ? me.tenant_id() : "";
}

TEST(CreateLimitsTest, PendingQuotaHoldsUnderConcurrentCreates) {
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 1, 1, {}});
  ASSERT_TRUE(svd.Start());
  std::string token = CreateTenant(svd, "bursty");
  auto stub = v1::InstanceService::NewStub(svd.channel());
  ASSERT_FALSE(SetQuota(svd, token, 3).empty());

  v1::Instance filler;
  ASSERT_TRUE(Create(*stub, token, 8, 0, &filler).ok());  // The only node is now full.
  std::atomic<int> accepted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 20; ++t) {
    threads.emplace_back([&] {
      v1::Instance i;
      grpc::Status r = Create(*stub, token, 8, 0, &i);
      if (r.ok()) {
        ++accepted;
        EXPECT_EQ(i.state(), v1::PENDING);
      } else {
        ++refused;
        EXPECT_EQ(r.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
        EXPECT_EQ(api::ReasonOf(r), "QUOTA_EXCEEDED") << r.error_message();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(accepted.load(), 3);
  EXPECT_EQ(refused.load(), 17);
  stub.reset();
}

// The same through svd for several tenants at once: their creates are
// group-committed together (store/create_batch.h), and still each tenant's
// quota admits exactly its quota, and two calls with one request_id get
// one instance.
TEST(CreateLimitsTest, PendingQuotasOfSeveralTenantsHoldUnderConcurrentCreates) {
  constexpr int kTenants = 3;
  constexpr int kCallsPerTenant = 12;
  constexpr int kQuota = 3;
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 1, 1, {}});
  ASSERT_TRUE(svd.Start());
  auto stub = v1::InstanceService::NewStub(svd.channel());
  std::vector<std::string> tokens;
  for (int t = 0; t < kTenants; ++t) {
    tokens.push_back(CreateTenant(svd, "crowd-" + std::to_string(t)));
    ASSERT_FALSE(SetQuota(svd, tokens.back(), kQuota).empty());
  }
  v1::Instance filler;
  ASSERT_TRUE(Create(*stub, tokens[0], 8, 0, &filler).ok());  // The only node is now full.
  std::mutex mutex;
  std::vector<std::map<std::string, std::set<std::string>>> ids(kTenants);  // rid -> ids.
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kTenants; ++t) {
    for (int c = 0; c < kCallsPerTenant; ++c) {
      threads.emplace_back([&, t, c] {
        v1::CreateInstanceRequest request;
        request.mutable_instance()->set_gpu_count(8);
        request.set_request_id("r" + std::to_string(c / 2));  // Pairs share one.
        v1::Instance i;
        grpc::Status r = stub->CreateInstance(Context(tokens[t]).get(), request, &i);
        std::lock_guard<std::mutex> lock(mutex);
        if (r.ok()) {
          ids[t][request.request_id()].insert(i.id());
        } else {
          ++refused;
          EXPECT_EQ(api::ReasonOf(r), "QUOTA_EXCEEDED") << r.error_message();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kTenants; ++t) {
    std::set<std::string> distinct;
    for (const auto& [rid, got] : ids[t]) {
      EXPECT_EQ(got.size(), 1u) << "two instances for one request_id " << rid;
      distinct.insert(got.begin(), got.end());
    }
    EXPECT_EQ(distinct.size(), static_cast<size_t>(kQuota)) << "tenant " << t;
  }
  EXPECT_GE(refused.load(), kTenants * (kCallsPerTenant / 2 - kQuota));
  stub.reset();
}

// The instance limit is judged against upper bounds of the tenant's counts
// (migration 0092): creates raise them, deletes leave them high, and a
// batch that might not fit counts exactly. So after churn far past the
// limit creates still get in, and a start that brings a stopped instance
// back raises the bounds, so the next create is counted, not waved through.
// A start is itself held to the limit.
TEST(CreateLimitsTest, InstanceLimitHoldsThroughChurnAndRestarts) {
  const std::string url = CreateTestDatabase();
  SvdProcess svd(SvdOptions{url, 1, 1, {}});
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "churner");
  auto stub = v1::InstanceService::NewStub(svd.channel());
  const std::string tenant_id = SetQuota(svd, token, 1000, /*instances_max=*/3);
  ASSERT_FALSE(tenant_id.empty());
  pqxx::connection db(url);
  // The bounds never fall below the true counts.
  auto check_bounds = [&](const std::string& when) {
    pqxx::work txn(db);
    pqxx::row r = txn.exec_params1(
        "SELECT count(*) FILTER (WHERE state NOT IN ('STOPPED', 'DELETED', 'FAILED')), "
        "count(*) FILTER (WHERE state = 'PENDING'), "
        "(SELECT unfinished FROM tenant_instance_bounds WHERE tenant_id = $1), "
        "(SELECT pending FROM tenant_instance_bounds WHERE tenant_id = $1) "
        "FROM instances WHERE tenant_id = $1",
        tenant_id);
    if (r[2].is_null()) return;  // Not known yet: the next create counts.
    EXPECT_GE(r[2].as<int64_t>(), r[0].as<int64_t>()) << when;
    EXPECT_GE(r[3].as<int64_t>(), r[1].as<int64_t>()) << when;
  };
  auto create = [&](v1::Instance* out) { return Create(*stub, token, 1, 0, out); };
  auto expect_limit = [&](const std::string& when) {
    v1::Instance extra;
    grpc::Status r = create(&extra);
    EXPECT_EQ(r.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << when;
    EXPECT_EQ(api::ReasonOf(r), "INSTANCE_LIMIT_REACHED") << when << ": " << r.error_message();
  };

  // Churn: 3 in, the 4th refused, all 3 deleted; eight rounds, 24 creates
  // against a limit of 3.
  for (int round = 0; round < 8; ++round) {
    const std::string when = "round " + std::to_string(round);
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i) {
      v1::Instance in;
      grpc::Status r = create(&in);
      ASSERT_TRUE(r.ok()) << when << ": " << r.error_message();
      ids.push_back(in.id());
      check_bounds(when);
    }
    expect_limit(when);
    for (const std::string& id : ids) {
      v1::DeleteInstanceRequest del;
      del.set_id(id);
      v1::Instance deleted;
      ASSERT_TRUE(stub->DeleteInstance(Context(token).get(), del, &deleted).ok()) << when;
    }
    check_bounds(when + ", deleted");
  }

  // Three stopped; one created (counted: 0 unfinished); two of the stopped
  // started again, which makes 3 unfinished: the next create is refused.
  std::vector<std::string> stopped;
  for (int i = 0; i < 3; ++i) {
    v1::Instance in;
    ASSERT_TRUE(create(&in).ok());
    stopped.push_back(in.id());
  }
  for (const std::string& id : stopped) {
    v1::StopInstanceRequest stop;
    stop.set_id(id);
    v1::Instance out;
    grpc::Status r = stub->StopInstance(Context(token).get(), stop, &out);
    ASSERT_TRUE(r.ok()) << r.error_message();
  }
  v1::Instance fresh;
  ASSERT_TRUE(create(&fresh).ok());
  check_bounds("after the stops");
  for (int i = 0; i < 2; ++i) {
    v1::StartInstanceRequest start;
    start.set_id(stopped[i]);
    v1::Instance out;
    grpc::Status r = stub->StartInstance(Context(token).get(), start, &out);
    ASSERT_TRUE(r.ok()) << r.error_message();
    check_bounds("after a start");
  }
  expect_limit("after the starts");
  // A start is held to the same limit: the third stopped one stays
  // stopped.
  v1::StartInstanceRequest start;
  start.set_id(stopped[2]);
  v1::Instance out;
  grpc::Status r = stub->StartInstance(Context(token).get(), start, &out);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(r), "INSTANCE_LIMIT_REACHED") << r.error_message();
  v1::GetInstanceRequest get;
  get.set_id(stopped[2]);
  ASSERT_TRUE(stub->GetInstance(Context(token).get(), get, &out).ok());
  EXPECT_EQ(out.state(), v1::STOPPED);
  stub.reset();
}

TEST(CreateLimitsTest, GangHonoursItsLeafLimit) {
  // Four nodes, two per leaf switch.
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 4, 2, {}});
  ASSERT_TRUE(svd.Start());
  std::string token = CreateTenant(svd, "picky");
  auto stub = v1::InstanceService::NewStub(svd.channel());

  v1::Instance bad;
  grpc::Status small = Create(*stub, token, 8, 1, &bad);
  EXPECT_EQ(small.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(small), "INVALID_MAX_LEAVES");
  EXPECT_EQ(api::ReasonOf(Create(*stub, token, 16, 17, &bad)), "INVALID_MAX_LEAVES");

  v1::Instance one_leaf;
  ASSERT_TRUE(Create(*stub, token, 32, 1, &one_leaf).ok());
  EXPECT_EQ(one_leaf.max_leaves(), 1);
  EXPECT_EQ(one_leaf.state(), v1::PENDING);  // 4 nodes never fit under one leaf of 2.
  EXPECT_FALSE(one_leaf.state_reason().empty());

  v1::DeleteInstanceRequest del;
  del.set_id(one_leaf.id());
  v1::Instance deleted;
  ASSERT_TRUE(stub->DeleteInstance(Context(token).get(), del, &deleted).ok());

  v1::Instance two_leaves;
  ASSERT_TRUE(Create(*stub, token, 32, 2, &two_leaves).ok());
  // A create places at once only when no scheduling pass is running in
  // this process; otherwise the next pass places it.
  for (int i = 0; i < 200 && two_leaves.placement_size() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v1::GetInstanceRequest get;
    get.set_id(two_leaves.id());
    ASSERT_TRUE(stub->GetInstance(Context(token).get(), get, &two_leaves).ok());
  }
  ASSERT_EQ(two_leaves.placement_size(), 4) << two_leaves.state_reason();
  std::set<std::string> leaves;
  for (const auto& p : two_leaves.placement()) leaves.insert(p.leaf_switch());
  EXPECT_EQ(leaves.size(), 2u);
  stub.reset();
}

}  // namespace
}  // namespace sv::testing
