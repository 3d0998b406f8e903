// Load: creates from many tenants over many concurrent clients against a
// fleet that holds only part of them. Every request gets an answer, no GPU
// is double-booked, and every accepted instance is placed or waits in the
// queue with a reason.
//
// CI runs a short form; the full form is
//   SV_LOAD_CREATES=10000 SV_LOAD_TENANTS=100 SV_LOAD_CLIENTS=200 load_test

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/chaos/chaos_util.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

TEST(LoadTest, EveryCreateIsAnsweredAndPlacedOrQueuedWithAReason) {
  const int creates = chaos::EnvInt("SV_LOAD_CREATES", 600);
  const int tenants = chaos::EnvInt("SV_LOAD_TENANTS", 10);
  const int clients = chaos::EnvInt("SV_LOAD_CLIENTS", 30);
  const int nodes = chaos::EnvInt("SV_LOAD_NODES", 16);  // 128 GPUs: only part fits.
  const std::string url = CreateTestDatabase();
  SvdProcess svd(SvdOptions{url, nodes, 4,
                            {"--rate-limit-key-rps", "0", "--rate-limit-tenant-rps", "0",
                             "--db-connections", "32", "--trial-amount-micros",
                             "1000000000"}});
  ASSERT_TRUE(svd.Start());
  std::vector<std::string> tokens;
  for (int t = 0; t < tenants; ++t) {
    tokens.push_back(CreateTenant(svd, absl::StrCat("load-", t)));
    ASSERT_FALSE(tokens.back().empty());
  }
  chaos::LoadOptions options;
  options.tenant_tokens = tokens;
  options.clients = clients;
  options.creates_per_client = (creates + clients - 1) / clients;
  options.delete_share = 0;
  options.retry_for = absl::Seconds(120);
  const std::string endpoint = svd.endpoint();
  chaos::Load load(options, [&](int) { return endpoint; });
  const auto started = std::chrono::steady_clock::now();
  load.Start();
  load.Wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  std::vector<double> latencies = load.create_latencies_ms();
  std::sort(latencies.begin(), latencies.end());
  const auto at = [&](double q) {
    return latencies.empty() ? 0 : latencies[std::min(latencies.size() - 1,
                                                      static_cast<size_t>(q * latencies.size()))];
  };
  const auto acknowledged = load.acknowledged();
  std::string code_text;
  for (const auto& [code, n] : load.final_codes()) code_text += absl::StrCat(code, "=", n, " ");
  std::printf("load: %zu creates from %d tenants over %d clients in %.1f s (%.0f/s); "
              "p50 %.1f ms, p99 %.1f ms; codes: %s\n",
              latencies.size(), tenants, clients, seconds, latencies.size() / seconds,
              at(0.5), at(0.99), code_text.c_str());
  EXPECT_EQ(static_cast<int>(latencies.size()), options.creates_per_client * clients);
  EXPECT_EQ(load.unanswered(), 0) << "requests without an answer";
  const auto codes = load.final_codes();
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == "OK" || code == "RESOURCE_EXHAUSTED") << code << " x" << n;
  }

  // Every accepted instance is placed (holding its GPUs) or queued with a
  // reason; some must wait, since the fleet is smaller than the demand.
  pqxx::connection db(url);
  pqxx::work txn(db);
  int placed = 0, queued = 0, other = 0;
  for (const auto& row : txn.exec(
           "SELECT state, state_reason FROM instances WHERE name LIKE 'load-%'")) {
    const std::string state = row[0].as<std::string>();
    if (state == "PENDING") {
      ++queued;
      EXPECT_FALSE(row[1].as<std::string>().empty()) << "queued without a reason";
    } else if (state == "SCHEDULED" || state == "STARTING" || state == "RUNNING") {
      ++placed;
    } else {
      ++other;
    }
  }
  txn.commit();
  std::printf("load: %d placed, %d queued with a reason, %d other\n", placed, queued, other);
  EXPECT_EQ(placed + queued, static_cast<int>(acknowledged.size()));
  EXPECT_EQ(other, 0);
  EXPECT_GT(placed, 0);
  EXPECT_GT(queued, 0) << "the fleet was meant to hold only part of the demand";
  const auto failures = chaos::CheckInvariants(url, acknowledged);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  EXPECT_EQ(svd.Stop(), 0);
}

}  // namespace
}  // namespace sv::testing
