// Port mapping under concurrency: many creates that declare ports race on
// few nodes; every declared port gets a node port from the node's range,
// no (node, port) is ever handed out twice, and ports are released when
// the instance stops. See docs/marketplace.md ("Port mapping").

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

bool WaitFor(const std::function<bool()>& done, int seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// Goal: 64 concurrent 1-GPU creates with 3 ports each on 8 nodes get 192
// distinct node ports, unique per node in the database and in the URLs,
// each in the node's range; stopping an instance frees its ports and a new
// instance may reuse them.
TEST(PortsConcurrencyTest, ConcurrentCreatesNeverCollide) {
  int instances_total = 64;
  if (const char* n = std::getenv("SV_PORTS_TEST_INSTANCES")) instances_total = std::atoi(n);
  SvdOptions options{CreateTestDatabase(), 8, 2, {}};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "ports");
  std::vector<std::string> ids(instances_total);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::InstanceService::NewStub(svd.channel());
      for (int i = t; i < instances_total; i += 16) {
        v1::CreateInstanceRequest request;
        request.mutable_instance()->set_gpu_count(1);
        for (int port : {7860, 8501, 8000}) {
          request.mutable_instance()->add_ports()->set_container_port(port);
        }
        request.set_request_id("ports-" + std::to_string(i));
        v1::Instance out;
        grpc::Status status = stub->CreateInstance(Context(token).get(), request, &out);
        if (!status.ok()) {
          ++failures;
          continue;
        }
        ids[i] = out.id();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);

  auto stub = v1::InstanceService::NewStub(svd.channel());
  auto get = [&](const std::string& id) {
    v1::GetInstanceRequest request;
    request.set_id(id);
    v1::Instance out;
    stub->GetInstance(Context(token).get(), request, &out);
    return out;
  };
  std::set<std::string> urls;
  for (const std::string& id : ids) {
    v1::Instance instance;
    ASSERT_TRUE(WaitFor([&] {
      instance = get(id);
      if (instance.state() != v1::RUNNING || instance.ports_size() != 3) return false;
      for (const auto& p : instance.ports()) {
        if (p.url().empty()) return false;
      }
      return true;
    })) << id << " " << instance.ShortDebugString();
    for (const auto& p : instance.ports()) {
      EXPECT_GE(p.node_port(), 30000);
      EXPECT_LE(p.node_port(), 32767);
      urls.insert(instance.placement(0).node_id() + " " + p.url());
    }
  }
  EXPECT_EQ(urls.size(), static_cast<size_t>(3 * instances_total));

  pqxx::connection db(options.database_url);
  auto scalar = [&](const std::string& sql) {
    pqxx::work txn(db);
    return txn.exec1(sql)[0].as<int64_t>();
  };
  EXPECT_EQ(scalar("SELECT count(*) FROM node_port_bindings"), 3 * instances_total);
  EXPECT_EQ(scalar("SELECT count(*) FROM (SELECT node_id, node_port FROM node_port_bindings "
                   "GROUP BY 1, 2 HAVING count(*) > 1) d"),
            0);
  // Every binding is on a node that holds the instance's GPUs.
  EXPECT_EQ(scalar("SELECT count(*) FROM node_port_bindings b WHERE NOT EXISTS (SELECT 1 FROM "
                   "gpu_reservations r WHERE r.instance_id = b.instance_id "
                   "AND r.node_id = b.node_id)"),
            0);

  // Stopping releases the instance's ports at once.
  v1::StopInstanceRequest stop;
  stop.set_id(ids[0]);
  v1::Instance stopped;
  ASSERT_TRUE(stub->StopInstance(Context(token).get(), stop, &stopped).ok());
  EXPECT_EQ(scalar("SELECT count(*) FROM node_port_bindings"), 3 * instances_total - 3);
  v1::Instance after = get(ids[0]);
  for (const auto& p : after.ports()) EXPECT_TRUE(p.url().empty());
}

}  // namespace
}  // namespace sv::testing
