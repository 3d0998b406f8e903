// Limits a create must honour exactly: the tenant's pending quota under a
// burst of concurrent creates, and a gang's limit on leaf switches.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
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

TEST(CreateLimitsTest, PendingQuotaHoldsUnderConcurrentCreates) {
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 1, 1, {}});
  ASSERT_TRUE(svd.Start());
  std::string token = CreateTenant(svd, "bursty");
  auto stub = v1::InstanceService::NewStub(svd.channel());
  v1::Account me;
  ASSERT_TRUE(v1::AccountService::NewStub(svd.channel())
                  ->GetCurrentAccount(Context(token).get(), {}, &me)
                  .ok());
  v1::SetTenantQuotaRequest quota;
  quota.mutable_quota()->set_tenant_id(me.tenant_id());
  quota.mutable_quota()->set_gpus_in_use_max(1024);
  quota.mutable_quota()->set_pending_count_max(3);
  v1::TenantQuota set;
  grpc::Status s = v1::SchedulerAdminService::NewStub(svd.channel())
                       ->SetTenantQuota(Context(svd.admin_key()).get(), quota, &set);
  ASSERT_TRUE(s.ok()) << s.error_message();

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
    v1::Account me;
    ASSERT_TRUE(v1::AccountService::NewStub(svd.channel())
                    ->GetCurrentAccount(Context(tokens.back()).get(), {}, &me)
                    .ok());
    v1::SetTenantQuotaRequest quota;
    quota.mutable_quota()->set_tenant_id(me.tenant_id());
    quota.mutable_quota()->set_gpus_in_use_max(1024);
    quota.mutable_quota()->set_pending_count_max(kQuota);
    v1::TenantQuota set;
    ASSERT_TRUE(v1::SchedulerAdminService::NewStub(svd.channel())
                    ->SetTenantQuota(Context(svd.admin_key()).get(), quota, &set)
                    .ok());
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
