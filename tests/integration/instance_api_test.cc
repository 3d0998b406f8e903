// The instance API end to end: a real svd on a real PostgreSQL, driven
// through the generated gRPC client.

#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "api/errors.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/sla.grpc.pb.h"
#include "sv/v1/volume.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using v1::Instance;
using v1::InstanceService;

class InstanceApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    database_url_ = CreateTestDatabase();
    svd_ = std::make_unique<SvdProcess>(SvdOptions{database_url_, 16, 2, {}});
    ASSERT_TRUE(svd_->Start());
    token_ = CreateTenant(*svd_, "alpha");
    ASSERT_FALSE(token_.empty());
    stub_ = InstanceService::NewStub(svd_->channel());
  }

  void TearDown() override {
    stub_.reset();
    svd_.reset();
  }

  grpc::Status Create(int gpus, Instance* out, const std::string& request_id = "",
                      const std::string& name = "", const std::string& token = "") {
    v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(gpus);
    request.mutable_instance()->set_name(name);
    request.set_request_id(request_id);
    return stub_->CreateInstance(Context(token.empty() ? token_ : token).get(), request, out);
  }

  grpc::Status Get(const std::string& id, Instance* out, const std::string& token = "") {
    v1::GetInstanceRequest request;
    request.set_id(id);
    return stub_->GetInstance(Context(token.empty() ? token_ : token).get(), request, out);
  }

  std::vector<Instance> ListAll(const std::string& token, int page_size) {
    std::vector<Instance> all;
    v1::ListInstancesRequest request;
    request.set_page_size(page_size);
    for (int page = 0; page < 1000; ++page) {
      v1::ListInstancesResponse response;
      grpc::Status s = stub_->ListInstances(Context(token).get(), request, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      all.insert(all.end(), response.instances().begin(), response.instances().end());
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    return all;
  }

  // Polls until the instance reaches `state` or 20 s pass.
  Instance WaitFor(const std::string& id, v1::InstanceState state) {
    Instance i;
    for (int tries = 0; tries < 400; ++tries) {
      EXPECT_TRUE(Get(id, &i).ok());
      if (i.state() == state) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return i;
  }

  std::string database_url_;
  std::unique_ptr<SvdProcess> svd_;
  std::string token_;
  std::unique_ptr<InstanceService::Stub> stub_;
};

int PlacedGpus(const Instance& i) {
  int n = 0;
  for (const auto& p : i.placement()) n += p.gpu_indices_size();
  return n;
}

TEST_F(InstanceApiTest, CreateGetListDeleteRoundTrip) {
  Instance created;
  ASSERT_TRUE(Create(8, &created, "req-1", "train-1").ok());
  EXPECT_EQ(created.name(), "train-1");
  EXPECT_EQ(created.gpu_model(), "RTX 4090");
  // A create places at once only when no scheduling pass of this svd is
  // running (else the next pass places it, seen on a loaded machine), so
  // the placement is checked once the instance runs.
  Instance running = WaitFor(created.id(), v1::RUNNING);
  EXPECT_EQ(running.state(), v1::RUNNING);
  EXPECT_FALSE(running.state_reason().empty());
  EXPECT_EQ(PlacedGpus(running), 8);
  ASSERT_EQ(running.placement_size(), 1);

  auto listed = ListAll(token_, 0);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id(), created.id());

  v1::DeleteInstanceRequest del;
  del.set_id(created.id());
  Instance deleted;
  ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), del, &deleted).ok());
  EXPECT_EQ(deleted.state(), v1::DELETED);
  EXPECT_EQ(deleted.placement_size(), 0);
  EXPECT_TRUE(ListAll(token_, 0).empty());
  // Deleting again is harmless and answers the same.
  ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), del, &deleted).ok());
  EXPECT_EQ(deleted.state(), v1::DELETED);
}

TEST_F(InstanceApiTest, ListPagesThroughEveryInstanceOnce) {
  std::set<std::string> ids;
  for (int i = 0; i < 7; ++i) {
    Instance created;
    ASSERT_TRUE(Create(1, &created).ok());
    ids.insert(created.id());
  }
  v1::ListInstancesRequest request;
  request.set_page_size(3);
  std::vector<int> page_sizes;
  std::set<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    v1::ListInstancesResponse response;
    ASSERT_TRUE(stub_->ListInstances(Context(token_).get(), request, &response).ok());
    page_sizes.push_back(response.instances_size());
    for (const auto& i : response.instances()) EXPECT_TRUE(seen.insert(i.id()).second);
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  EXPECT_EQ(page_sizes, (std::vector<int>{3, 3, 1}));
  EXPECT_EQ(seen, ids);

  request.set_page_token("not-a-token");
  v1::ListInstancesResponse response;
  grpc::Status bad = stub_->ListInstances(Context(token_).get(), request, &response);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(bad), "INVALID_PAGE_TOKEN");
  // A token of the right shape whose time PostgreSQL cannot take (a forged
  // one) was INTERNAL / DATABASE_ERROR (22009), an error log on demand.
  for (const char* micros : {"-70000000000000000", "-9223372036854775807", "300000000000000000"}) {
    request.set_page_token(
        absl::WebSafeBase64Escape(absl::StrCat("v1|0|", micros, "|ins-aaaaaaaaaaaaaa")));
    bad = stub_->ListInstances(Context(token_).get(), request, &response);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << micros;
    EXPECT_EQ(api::ReasonOf(bad), "INVALID_PAGE_TOKEN") << bad.error_message();
  }
  request.set_page_token("");
  request.set_page_size(-1);
  EXPECT_EQ(stub_->ListInstances(Context(token_).get(), request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // The same for the other lists' forged tokens: bytes that are not text
  // where an id goes, a time past year 9999 (both were INTERNAL).
  v1::VolumeService::Stub volumes(svd_->channel());
  for (const std::string& forged :
       {std::string("v1|0|0|\xff"), std::string("v1|0|0|vol-aaaaaaaaaaaaaa\n"),
        std::string("v1|0|300000000000000000|vol-aaaaaaaaaaaaaa")}) {
    v1::ListVolumesRequest list;
    list.set_page_token(absl::WebSafeBase64Escape(forged));
    v1::ListVolumesResponse listed;
    grpc::Status refused = volumes.ListVolumes(Context(token_).get(), list, &listed);
    EXPECT_EQ(api::ReasonOf(refused), "INVALID_PAGE_TOKEN") << refused.error_message();
  }
  v1::SlaService::Stub sla(svd_->channel());
  v1::ListSlaWindowsRequest windows;
  windows.set_instance_id(*ids.begin());
  windows.set_page_token("9223372036854770400");  // A whole hour, in the year 292 billion.
  v1::ListSlaWindowsResponse listed_windows;
  grpc::Status refused = sla.ListSlaWindows(Context(token_).get(), windows, &listed_windows);
  EXPECT_EQ(api::ReasonOf(refused), "INVALID_PAGE_TOKEN") << refused.error_message();
}

TEST_F(InstanceApiTest, RetryWithSameRequestIdReturnsTheSameInstance) {
  Instance first, second;
  ASSERT_TRUE(Create(4, &first, "retry-me", "web").ok());
  ASSERT_TRUE(Create(4, &second, "retry-me", "web").ok());
  EXPECT_EQ(first.id(), second.id());
  EXPECT_EQ(ListAll(token_, 0).size(), 1u);

  Instance third;
  grpc::Status reused = Create(8, &third, "retry-me", "web");
  EXPECT_EQ(reused.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(api::ReasonOf(reused), "REQUEST_ID_REUSED");
  EXPECT_NE(reused.error_message().find(first.id()), std::string::npos);
  EXPECT_EQ(ListAll(token_, 0).size(), 1u);

  // Request ids are per tenant: another tenant may use the same one.
  std::string other = CreateTenant(*svd_, "beta");
  Instance theirs;
  ASSERT_TRUE(Create(4, &theirs, "retry-me", "web", other).ok());
  EXPECT_NE(theirs.id(), first.id());
}

TEST_F(InstanceApiTest, ConcurrentRetriesOfOneRequestCreateOneInstance) {
  std::vector<std::thread> threads;
  std::vector<std::string> ids(16);
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      Instance i;
      grpc::Status s = Create(2, &i, "same-request");
      EXPECT_TRUE(s.ok()) << s.error_message();
      ids[t] = i.id();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
  EXPECT_EQ(ListAll(token_, 0).size(), 1u);
}

// Checks that no (node, GPU) is held by two instances and that every placed
// instance holds exactly its GPU count.
void ExpectNoDoubleBooking(const std::vector<Instance>& instances, int* placed_gpus) {
  std::set<std::pair<std::string, int>> taken;
  *placed_gpus = 0;
  for (const auto& i : instances) {
    if (i.state() == v1::PENDING) {
      EXPECT_EQ(i.placement_size(), 0);
      EXPECT_FALSE(i.state_reason().empty());
      continue;
    }
    EXPECT_EQ(PlacedGpus(i), i.gpu_count()) << i.id();
    if (i.gpu_count() <= 8) {
      EXPECT_EQ(i.placement_size(), 1) << i.id();
    } else {
      EXPECT_EQ(i.placement_size(), i.gpu_count() / 8) << i.id();
    }
    for (const auto& p : i.placement()) {
      for (int g : p.gpu_indices()) {
        EXPECT_TRUE(taken.insert({p.node_id(), g}).second)
            << "GPU " << p.node_name() << "/" << g << " booked twice";
      }
    }
    *placed_gpus += i.gpu_count();
  }
}

TEST_F(InstanceApiTest, TwoHundredConcurrentCreatesNeverDoubleBookAGpu) {
  constexpr int kThreads = 20, kPerThread = 10;
  const int sizes[] = {1, 2, 4, 8, 1, 2, 16, 1, 4, 8};
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        Instance i;
        grpc::Status s = Create(sizes[(t + k) % 10], &i);
        if (!s.ok()) {
          ++failures;
          ADD_FAILURE() << s.error_message();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto all = ListAll(token_, 500);
  ASSERT_EQ(all.size(), 200u);
  int placed = 0;
  ExpectNoDoubleBooking(all, &placed);
  EXPECT_LE(placed, 16 * 8);
  // The fleet fills up: demand (about 960 GPUs) is far above 128.
  EXPECT_GE(placed, 100);
}

TEST_F(InstanceApiTest, TwoServersOnOneDatabaseNeverDoubleBook) {
  SvdProcess second(SvdOptions{database_url_, 16, 2, {}});
  ASSERT_TRUE(second.Start());
  auto stub2 = InstanceService::NewStub(second.channel());
  struct Release {
    std::unique_ptr<InstanceService::Stub>& stub;
    ~Release() { stub.reset(); }
  } release{stub2};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 10; ++k) {
        v1::CreateInstanceRequest request;
        request.mutable_instance()->set_gpu_count((k % 3 == 0) ? 8 : 2);
        Instance i;
        auto& stub = (t % 2 == 0) ? stub_ : stub2;
        grpc::Status s = stub->CreateInstance(Context(token_).get(), request, &i);
        EXPECT_TRUE(s.ok()) << s.error_message();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto all = ListAll(token_, 500);
  ASSERT_EQ(all.size(), 80u);
  int placed = 0;
  ExpectNoDoubleBooking(all, &placed);
  EXPECT_LE(placed, 128);
}

TEST_F(InstanceApiTest, TenantsCannotSeeOrDeleteEachOthersInstances) {
  Instance mine;
  ASSERT_TRUE(Create(1, &mine).ok());
  std::string other = CreateTenant(*svd_, "beta");

  Instance got;
  grpc::Status s = Get(mine.id(), &got, other);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(s), "INSTANCE_NOT_FOUND");

  v1::DeleteInstanceRequest del;
  del.set_id(mine.id());
  Instance deleted;
  EXPECT_EQ(stub_->DeleteInstance(Context(other).get(), del, &deleted).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(ListAll(other, 0).empty());
  ASSERT_TRUE(Get(mine.id(), &got).ok());
  EXPECT_NE(got.state(), v1::DELETED);

  v1::AccountService::Stub accounts(svd_->channel());
  v1::Account me, them;
  ASSERT_TRUE(accounts.GetCurrentAccount(Context(token_).get(), {}, &me).ok());
  ASSERT_TRUE(accounts.GetCurrentAccount(Context(other).get(), {}, &them).ok());
  EXPECT_EQ(me.tenant_name(), "alpha");
  EXPECT_EQ(them.tenant_name(), "beta");
  EXPECT_EQ(me.role(), v1::MEMBER);
}

TEST_F(InstanceApiTest, BadInputIsRejectedWithAReasonAndWritesNothing) {
  for (int gpus : {0, 9, 12, 129, -8}) {
    Instance i;
    grpc::Status s = Create(gpus, &i);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << gpus;
    EXPECT_EQ(api::ReasonOf(s), "INVALID_GPU_COUNT") << gpus;
    EXPECT_NE(s.error_message().find("gpu_count"), std::string::npos);
  }
  Instance i;
  grpc::Status long_name = Create(1, &i, "", std::string(64, 'a'));
  EXPECT_EQ(long_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(long_name), "INVALID_NAME");
  EXPECT_EQ(Create(1, &i, "", "Bad_Name").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Create(1, &i, std::string(129, 'r')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::CreateInstanceRequest bad_model;
  bad_model.mutable_instance()->set_gpu_count(1);
  bad_model.mutable_instance()->set_gpu_model("H100");
  grpc::Status model = stub_->CreateInstance(Context(token_).get(), bad_model, &i);
  EXPECT_EQ(api::ReasonOf(model), "UNKNOWN_GPU_MODEL");

  v1::CreateInstanceRequest ok;
  ok.mutable_instance()->set_gpu_count(1);
  grpc::ClientContext no_key;
  grpc::Status missing = stub_->CreateInstance(&no_key, ok, &i);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(missing), "MISSING_CREDENTIALS");

  std::string wrong = token_;
  wrong.back() = wrong.back() == 'a' ? 'b' : 'a';
  grpc::Status bad_key = stub_->CreateInstance(Context(wrong).get(), ok, &i);
  EXPECT_EQ(bad_key.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(bad_key), "API_KEY_UNKNOWN");
  EXPECT_EQ(stub_->CreateInstance(Context("garbage").get(), ok, &i).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  Instance got;
  EXPECT_EQ(Get("ins-doesnotexist00", &got).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get("'; DROP TABLE instances; --", &got).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get("", &got).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // A member may not use the operator's API.
  v1::AdminService::Stub admin(svd_->channel());
  v1::CreateTenantRequest tenant;
  tenant.set_name("sneaky");
  tenant.set_owner_email("x@example.com");
  v1::CreateTenantResponse created;
  EXPECT_EQ(admin.CreateTenant(Context(token_).get(), tenant, &created).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  EXPECT_TRUE(ListAll(token_, 0).empty());
}

TEST_F(InstanceApiTest, PendingInstanceIsPlacedWhenCapacityFrees) {
  std::vector<std::string> full;
  for (int n = 0; n < 16; ++n) {
    Instance i;
    ASSERT_TRUE(Create(8, &i).ok());
    // Placed by the create's own try, or, when the loop's pass held the
    // placement lock at that moment, by the loop moments later.
    i = WaitFor(i.id(), v1::RUNNING);
    ASSERT_EQ(i.state(), v1::RUNNING);
    full.push_back(i.id());
  }
  Instance waiting;
  ASSERT_TRUE(Create(4, &waiting).ok());
  EXPECT_EQ(waiting.state(), v1::PENDING);
  // The reason comes from the latest placement pass; give the loop a moment
  // if the create's own pass lost a race to another.
  for (int tries = 0; tries < 100 && waiting.state_reason().find("capacity") == std::string::npos;
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(Get(waiting.id(), &waiting).ok());
  }
  EXPECT_NE(waiting.state_reason().find("waiting for capacity"), std::string::npos)
      << waiting.state_reason();

  Instance gang;
  ASSERT_TRUE(Create(16, &gang).ok());
  EXPECT_EQ(gang.state(), v1::PENDING);

  v1::DeleteInstanceRequest del;
  del.set_id(full[0]);
  Instance deleted;
  ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), del, &deleted).ok());
  Instance placed = WaitFor(waiting.id(), v1::RUNNING);
  EXPECT_EQ(placed.state(), v1::RUNNING);
  EXPECT_EQ(PlacedGpus(placed), 4);
  // Within one half of the node's eight GPUs.
  for (int g : placed.placement(0).gpu_indices()) {
    EXPECT_EQ(g / 4, placed.placement(0).gpu_indices(0) / 4);
  }
}

TEST_F(InstanceApiTest, GangTakesWholeNodesUnderOneLeafWhenItCan) {
  Instance gang;
  ASSERT_TRUE(Create(64, &gang).ok());
  // The create's own pass places it unless the loop's pass held the
  // placement lock at that moment; then the loop places it.
  gang = WaitFor(gang.id(), v1::RUNNING);
  ASSERT_EQ(gang.placement_size(), 8);
  std::set<std::string> leaves, nodes;
  for (const auto& p : gang.placement()) {
    leaves.insert(p.leaf_switch());
    nodes.insert(p.node_id());
    EXPECT_EQ(p.gpu_indices_size(), 8);
  }
  EXPECT_EQ(leaves.size(), 1u);
  EXPECT_EQ(nodes.size(), 8u);
  Instance big;
  ASSERT_TRUE(Create(128, &big).ok());
  EXPECT_EQ(big.state(), v1::PENDING);  // Only 64 GPUs are left.
}

TEST_F(InstanceApiTest, RestartKeepsEveryInstance) {
  std::set<std::string> before;
  for (int n = 0; n < 5; ++n) {
    Instance i;
    ASSERT_TRUE(Create(2, &i).ok());
    before.insert(i.id());
  }
  std::string running_id = *before.begin();
  WaitFor(running_id, v1::RUNNING);
  stub_.reset();
  EXPECT_EQ(svd_->Stop(), 0);
  ASSERT_TRUE(svd_->Start());
  stub_ = InstanceService::NewStub(svd_->channel());
  std::set<std::string> after;
  for (const auto& i : ListAll(token_, 2)) after.insert(i.id());
  EXPECT_EQ(after, before);
  Instance again;
  ASSERT_TRUE(Get(running_id, &again).ok());
  EXPECT_EQ(again.state(), v1::RUNNING);
  EXPECT_EQ(PlacedGpus(again), 2);
}

TEST_F(InstanceApiTest, HealthNeedsNoKeyAndReportsServing) {
  auto health = grpc::health::v1::Health::NewStub(svd_->channel());
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health->Check(Context("").get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(InstanceApiTest, SecondServerStartingAtOnceAppliesNoMigrationTwice) {
  std::string fresh = CreateTestDatabase();
  SvdProcess a(SvdOptions{fresh, 4, 1, {}}), b(SvdOptions{fresh, 4, 1, {}});
  bool a_ok = false, b_ok = false;
  std::thread ta([&] { a_ok = a.Start(); });
  std::thread tb([&] { b_ok = b.Start(); });
  ta.join();
  tb.join();
  EXPECT_TRUE(a_ok);
  EXPECT_TRUE(b_ok);
  pqxx::connection c(fresh);
  pqxx::nontransaction txn(c);
  auto r = txn.exec("SELECT count(*), count(DISTINCT version) FROM schema_migrations");
  EXPECT_EQ(r[0][0].as<int>(), r[0][1].as<int>());
  EXPECT_GE(r[0][0].as<int>(), 1);
  EXPECT_EQ(txn.exec("SELECT count(*) FROM nodes")[0][0].as<int>(), 4);
}

}  // namespace
}  // namespace sv::testing
