// The simulated fleet of svd --sim-nodes under a fault script: simulated
// agents speak the real protocol, and scripted faults reach the lifecycle
// (node death) and the stored telemetry (throttling, XIDs, slow storage).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <pqxx/pqxx>
#include <thread>

#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

bool WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// Goal: a scripted node death stops the instance on that node with the
// reason, while the other node's instance keeps running and its telemetry
// shows the scripted throttling, XIDs and slow storage.
TEST(AgentFleetTest, FaultScriptReachesLifecycleAndTelemetry) {
  const std::string script_path =
      (std::filesystem::temp_directory_path() / ("sv-faults-" + std::to_string(getpid())))
          .string();
  {
    std::ofstream script(script_path);
    script << "6s sim-node-000 die\n"
           << "0s sim-node-001 thermal-throttle gpu=0\n"
           << "0s sim-node-001 slow-storage bytes_per_s=500000000\n";
    for (int s = 2; s <= 12; ++s) script << s << "s sim-node-001 xid gpu=0\n";
  }
  SvdOptions options{CreateTestDatabase(), 2, 1, {}};
  options.extra_args = {"--sim-faults", script_path,
                        "--node-heartbeat-timeout-ms", "2000",
                        "--agent-heartbeat-interval-ms", "200",
                        "--agent-telemetry-interval-ms", "200"};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "alpha");
  auto stub = v1::InstanceService::NewStub(svd.channel());
  auto get = [&](const std::string& id) {
    v1::GetInstanceRequest request;
    request.set_id(id);
    v1::Instance out;
    EXPECT_TRUE(stub->GetInstance(Context(token).get(), request, &out).ok());
    return out;
  };
  std::map<std::string, std::string> instance_on;  // node name -> instance id
  for (int i = 0; i < 2; ++i) {
    v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(8);
    v1::Instance out;
    ASSERT_TRUE(stub->CreateInstance(Context(token).get(), request, &out).ok());
    ASSERT_EQ(out.placement_size(), 1);
    instance_on[out.placement(0).node_name()] = out.id();
  }
  ASSERT_EQ(instance_on.size(), 2u);
  const std::string dead = instance_on["sim-node-000"];
  const std::string alive = instance_on["sim-node-001"];

  ASSERT_TRUE(WaitFor([&] { return get(dead).state() == v1::STOPPED; }));
  EXPECT_NE(get(dead).state_reason().find("sim-node-000 missed heartbeats"), std::string::npos)
      << get(dead).state_reason();
  EXPECT_EQ(get(alive).state(), v1::RUNNING);

  pqxx::connection db(options.database_url);
  auto telemetry = [&] {
    pqxx::work txn(db);
    return txn.exec1(
        "SELECT COALESCE(sum(gpu_samples), 0), COALESCE(sum(gpu_samples_healthy), 0), "
        "COALESCE(sum(xid_errors), 0), min(storage_min_bytes_per_s), "
        "COALESCE(sum(latency_counts[3]), 0) FROM instance_telemetry_minutes "
        "WHERE instance_id = " + txn.quote(alive));
  };
  ASSERT_TRUE(WaitFor([&] { return telemetry()[2].as<int64_t>() > 0; }));
  auto row = telemetry();
  const int64_t samples = row[0].as<int64_t>();
  const int64_t healthy = row[1].as<int64_t>();
  EXPECT_GT(samples, 0);
  EXPECT_EQ(samples % 8, 0) << "every batch reports all 8 GPUs";
  // GPU 0 is throttled in every sample and the others are healthy, except
  // in the samples that carried an XID.
  EXPECT_LE(healthy, samples / 8 * 7);
  EXPECT_GT(healthy, 0);
  // Probe durations are whole microseconds, hence the rounding.
  EXPECT_NEAR(row[3].as<double>(), 500e6, 0.5e6);
  EXPECT_GT(row[4].as<int64_t>(), 0) << "latency histograms are merged";
  std::filesystem::remove(script_path);
}

}  // namespace
}  // namespace sv::testing
