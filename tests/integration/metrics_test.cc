// svd's HTTP side: Prometheus metrics that promtool accepts, and the
// liveness and readiness probes.

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <fstream>

#include "sv/v1/account.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

TEST(MetricsTest, MetricsCountCallsAndPassPromtool) {
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 2, 1, {}});
  ASSERT_TRUE(svd.Start());
  ASSERT_GT(svd.http_port(), 0);
  std::string token = CreateTenant(svd, "watched");
  auto stub = v1::AccountService::NewStub(svd.channel());
  v1::Account account;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stub->GetCurrentAccount(Context(token).get(), {}, &account).ok());
  }
  EXPECT_FALSE(stub->GetCurrentAccount(Context("nope").get(), {}, &account).ok());
  stub.reset();

  httplib::Client http("127.0.0.1", svd.http_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::string& body = res->body;
  EXPECT_NE(body.find("sv_grpc_requests_total{method=\"/sv.v1.AccountService/"
                      "GetCurrentAccount\",code=\"OK\"} 3"),
            std::string::npos)
      << body.substr(0, 2000);
  EXPECT_NE(body.find("sv_grpc_requests_total{method=\"/sv.v1.AccountService/"
                      "GetCurrentAccount\",code=\"UNAUTHENTICATED\"} 1"),
            std::string::npos);
  EXPECT_NE(body.find("sv_grpc_request_duration_seconds_count"), std::string::npos);
  EXPECT_NE(body.find("sv_db_pool_connections_max"), std::string::npos);

  // promtool (Debian's prometheus package, installed by deploy/setup.sh)
  // must accept the exposition as it is.
  const std::string path = ::testing::TempDir() + "sv-metrics.txt";
  std::ofstream(path) << body;
  // promtool reads stdin; run it through a shell for the redirect.
  RunResult check = RunCapture({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + path}, {});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  std::remove(path.c_str());
}

TEST(MetricsTest, LivenessAndReadiness) {
  SvdProcess svd(SvdOptions{CreateTestDatabase(), 1, 1, {}});
  ASSERT_TRUE(svd.Start());
  httplib::Client http("127.0.0.1", svd.http_port());
  auto live = http.Get("/healthz");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  auto ready = http.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  auto missing = http.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

}  // namespace
}  // namespace sv::testing
