// What an operator reads from a replica: /statusz names the leader, the
// reliability metrics (scheduler queue and decisions, billing lag, leader,
// database) are present and pass `promtool check metrics`, and
// --log-format json writes one JSON object per line, naming the tenant and
// the request_id on the lines of a request.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

TEST(OpsTest, StatusMetricsAndJsonLogs) {
  const std::string url = CreateTestDatabase();
  SvdProcess svd(SvdOptions{url, 2, 1, {"--log-format", "json"}});
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "ops");
  auto stub = v1::InstanceService::NewStub(svd.channel());
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(2);
  request.set_request_id("ops-request-1");
  v1::Instance created;
  ASSERT_TRUE(stub->CreateInstance(Context(token).get(), request, &created).ok());

  httplib::Client http("127.0.0.1", svd.http_port());
  // The replica takes the lease and places the instance on its loops' own
  // time, which a loaded machine may put after the create returned: wait
  // (bounded) for both before reading what they show.
  std::string statusz;
  ASSERT_TRUE(WaitFor([&] {
    auto status = http.Get("/statusz");
    if (!status || status->status != 200) return false;
    statusz = status->body;
    auto metrics = http.Get("/metrics");
    return nlohmann::json::parse(statusz, nullptr, false).value("leader", false) && metrics &&
           metrics->body.find("sv_scheduler_decisions_total{decision=\"placed\"} 1\n") !=
               std::string::npos;
  })) << statusz;
  nlohmann::json s = nlohmann::json::parse(statusz);
  EXPECT_TRUE(s["leader"].get<bool>()) << statusz;
  EXPECT_GE(s["epoch"].get<int64_t>(), 1);
  EXPECT_EQ(s["holder"], s["replica"]);

  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics && metrics->status == 200);
  for (const char* name :
       {"\nsv_leader 1\n", "\nsv_scheduler_queue_length ", "\nsv_billing_lag_seconds ",
        "\nsv_db_up 1\n", "sv_scheduler_decisions_total{decision=\"placed\"} 1\n",
        "\nsv_leader_lease_remaining_seconds "}) {
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
  }
  if (std::filesystem::exists("/usr/bin/promtool")) {
    const std::string path = ::testing::TempDir() + "/ops_metrics.txt";
    std::ofstream(path) << metrics->body;
    RunResult check =
        RunCapture({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + path}, {});
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
  EXPECT_EQ(svd.Stop(), 0);

  std::ifstream log(svd.log_path());
  std::string line;
  int lines = 0, with_request = 0;
  while (std::getline(log, line)) {
    if (line.empty() || line[0] != '{') continue;  // The test cluster's own lines.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_TRUE(j.contains("time") && j.contains("level") && j.contains("msg")) << line;
    ++lines;
    if (j.value("request_id", "") == "ops-request-1") {
      ++with_request;
      EXPECT_EQ(j.value("tenant", ""), created.tenant_id()) << line;
      EXPECT_EQ(j.value("method", ""), "/sv.v1.InstanceService/CreateInstance");
    }
  }
  EXPECT_GT(lines, 5);
  EXPECT_GE(with_request, 1) << "no log line names the create's request_id";
}

// The value of an unlabelled gauge in a /metrics body (NaN when absent).
double Gauge(const std::string& body, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = body.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::stod(body.substr(at + key.size()));
}

// Goal: under --fake-clock-start the queue age and the billing lag are
// measured on svd's clock, which wrote created_at and moves the billing
// cursor, not on PostgreSQL's (three days later here).
TEST(OpsTest, QueueAgeAndBillingLagUseSvdsClock) {
  const std::string start =
      absl::FormatTime(absl::RFC3339_sec, absl::Now() - absl::Hours(72), absl::UTCTimeZone());
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 0, 1,
                            {"--fake-clock-start", start, "--billing-interval-ms", "200"}});
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "ops-clock");
  auto stub = v1::InstanceService::NewStub(svd.channel());
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(1);
  v1::Instance created;
  ASSERT_TRUE(stub->CreateInstance(Context(token).get(), request, &created).ok());
  ASSERT_EQ(created.state(), v1::PENDING);  // No nodes: it waits.

  httplib::Client http("127.0.0.1", svd.http_port());
  double lag = -1;
  std::string body;
  // The first billing runs catch up from the cursor's start; wait for that.
  for (int i = 0; i < 100 && !(lag >= 0 && lag < 600); ++i) {
    auto metrics = http.Get("/metrics");
    ASSERT_TRUE(metrics && metrics->status == 200);
    body = metrics->body;
    lag = Gauge(body, "sv_billing_lag_seconds");
    if (!(lag >= 0 && lag < 600)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double age = Gauge(body, "sv_scheduler_queue_oldest_seconds");
  EXPECT_GE(age, 0) << body;
  EXPECT_LT(age, 600) << "queue age measured on another clock";
  EXPECT_GE(lag, 0) << "billing never ran";
  EXPECT_LT(lag, 600) << "billing lag measured on another clock";
  EXPECT_EQ(svd.Stop(), 0);
}

}  // namespace
}  // namespace sv::testing
