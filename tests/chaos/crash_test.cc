// Crash: svd is killed with SIGKILL at random moments (at least 20 times)
// while clients create and delete instances and billing works through a
// backlog of history. Clients retry with the same request_id. Afterwards
// every acknowledged create exists, no GPU is double-booked, every RUNNING
// minute is charged exactly once, and the ledger auditor passes.
//
// Long form: SV_CHAOS_KILLS (default 20), SV_CHAOS_CLIENTS (8),
// SV_CHAOS_HISTORY_INSTANCES (40).

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/chaos/chaos_util.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

TEST(CrashTest, KillNineAtRandomLosesNothingAndDoublesNothing) {
  const int kills = chaos::EnvInt("SV_CHAOS_KILLS", 20);
  const int clients = chaos::EnvInt("SV_CHAOS_CLIENTS", 8);
  const int history = chaos::EnvInt("SV_CHAOS_HISTORY_INSTANCES", 40);
  const std::string url = CreateTestDatabase();
  ASSERT_TRUE(chaos::SeedBillingHistory(url, history, 20));

  SvdOptions options{url, 8, 2,
                     {"--billing-interval-ms", "100", "--billing-lag-ms", "0",
                      "--trial-amount-micros", "1000000000", "--rate-limit-key-rps", "0",
                      "--rate-limit-tenant-rps", "0", "--leader-lease-ms", "1500",
                      "--leader-renew-ms", "300"}};
  options.keep_port_on_restart = true;
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  std::vector<std::string> tokens;
  for (int t = 0; t < 4; ++t) {
    tokens.push_back(CreateTenant(svd, absl::StrCat("crash-", t)));
    ASSERT_FALSE(tokens.back().empty());
  }
  const std::string endpoint = svd.endpoint();

  chaos::LoadOptions load_options;
  load_options.tenant_tokens = tokens;
  load_options.clients = clients;
  load_options.creates_per_client = 0;  // Until the kills are over.
  chaos::Load load(load_options, [&](int) { return endpoint; });
  load.Start();

  std::mt19937 random(20261130);
  const int64_t cursor_before = chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor");
  for (int k = 0; k < kills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + random() % 900));
    svd.Kill();
    ASSERT_TRUE(svd.Start()) << "restart " << k;
  }
  // Give the clients a moment against a live svd, then end the load.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  load.Stop();
  // Progress during the kills depends on how often a restarted svd led
  // before the next kill (the dead one's lease must lapse first); it is
  // printed, and the backlog must be finished below either way.
  const int64_t cursor_after = chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor");
  std::printf("crash test: billing cursor moved %lld minutes during the kills\n",
              static_cast<long long>(cursor_after - cursor_before));
  // Billing finishes the backlog on the last svd; then it stops cleanly.
  const int64_t now_minute = absl::ToUnixSeconds(absl::Now()) / 60;
  for (int i = 0; i < 600; ++i) {
    if (chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor") >= now_minute) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor"), now_minute)
      << "billing did not finish its backlog after the kills";
  EXPECT_EQ(svd.Stop(), 0);

  const auto acknowledged = load.acknowledged();
  const auto codes = load.final_codes();
  std::string code_text;
  for (const auto& [code, n] : codes) code_text += absl::StrCat(code, "=", n, " ");
  std::printf("crash test: %d kills, %zu acknowledged creates, %d attempts, codes: %s\n",
              kills, acknowledged.size(), load.attempts(), code_text.c_str());
  EXPECT_GT(acknowledged.size(), 0u);
  EXPECT_EQ(load.unanswered(), 0) << "calls still failing after 60 s of retries";
  EXPECT_EQ(codes.count("INTERNAL"), 0u) << code_text;
  const std::vector<std::string> failures = chaos::CheckInvariants(url, acknowledged);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
}

}  // namespace
}  // namespace sv::testing
