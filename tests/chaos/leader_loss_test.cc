// Leader loss: three svd replicas on one database. The leader is killed
// with SIGKILL while it bills a backlog and clients create instances
// through the other two; another replica must lead within 10 s, and
// nothing may be placed twice or charged twice. Then the new leader is
// stopped gracefully and hands over at once.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tests/chaos/chaos_util.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json Status(SvdProcess& svd) {
  httplib::Client client("127.0.0.1", svd.http_port());
  client.set_connection_timeout(1);
  auto res = client.Get("/statusz");
  if (!res || res->status != 200) return nlohmann::json::object();
  return nlohmann::json::parse(res->body, nullptr, false);
}

bool Leads(SvdProcess& svd) {
  nlohmann::json s = Status(svd);
  return s.is_object() && s.value("leader", false);
}

// Waits until one of `replicas` leads; returns its index or -1.
int AwaitLeader(const std::vector<SvdProcess*>& replicas, absl::Duration within) {
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(within);
  while (Clock::now() < deadline) {
    for (size_t i = 0; i < replicas.size(); ++i) {
      if (Leads(*replicas[i])) return static_cast<int>(i);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

TEST(LeaderLossTest, AnotherReplicaLeadsWithinTenSecondsAndNothingIsDoubled) {
  const int history = chaos::EnvInt("SV_CHAOS_HISTORY_INSTANCES", 60);
  const std::string url = CreateTestDatabase();
  ASSERT_TRUE(chaos::SeedBillingHistory(url, history, 24));
  const std::vector<std::string> common = {
      "--billing-interval-ms", "100", "--billing-lag-ms", "0", "--leader-lease-ms", "3000",
      "--leader-renew-ms", "500", "--rate-limit-key-rps", "0", "--rate-limit-tenant-rps", "0",
      "--trial-amount-micros", "1000000000"};
  SvdProcess a(SvdOptions{url, 0, 1, common});
  ASSERT_TRUE(a.Start());
  // The port file can come before the first campaign; a lone replica must
  // lead within one renew interval or so.
  ASSERT_EQ(AwaitLeader({&a}, absl::Seconds(5)), 0)
      << "the first replica should lead soon after its start";
  const int64_t first_epoch = Status(a).value("epoch", 0);
  SvdProcess b(SvdOptions{url, 8, 2, common});  // b runs the simulated agents.
  SvdProcess c(SvdOptions{url, 0, 1, common});
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(c.Start());
  EXPECT_FALSE(Leads(b));
  EXPECT_FALSE(Leads(c));

  std::vector<std::string> tokens;
  for (int t = 0; t < 3; ++t) tokens.push_back(CreateTenant(b, absl::StrCat("ll-", t)));
  const std::vector<std::string> endpoints = {b.endpoint(), c.endpoint()};
  chaos::LoadOptions load_options;
  load_options.tenant_tokens = tokens;
  load_options.clients = 6;
  load_options.creates_per_client = 0;
  chaos::Load load(load_options, [&](int i) { return endpoints[i % 2]; });
  load.Start();

  // Kill the leader while it bills.
  const int64_t cursor0 = chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor");
  for (int i = 0; i < 200; ++i) {
    if (chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor") > cursor0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  a.Kill();
  const auto killed_at = Clock::now();
  std::vector<SvdProcess*> survivors = {&b, &c};
  const int leader = AwaitLeader(survivors, absl::Seconds(15));
  const double takeover_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  ASSERT_GE(leader, 0) << "no replica took over";
  std::printf("leader loss: replica %c leads %.2f s after the kill\n", leader == 0 ? 'b' : 'c',
              takeover_s);
  EXPECT_LE(takeover_s, 10.0);
  const int64_t second_epoch = Status(*survivors[leader]).value("epoch", 0);
  EXPECT_GT(second_epoch, first_epoch);
  EXPECT_FALSE(Leads(*survivors[1 - leader])) << "two leaders";

  std::this_thread::sleep_for(std::chrono::seconds(2));
  load.Stop();
  const int64_t now_minute = absl::ToUnixSeconds(absl::Now()) / 60;
  for (int i = 0; i < 600; ++i) {
    if (chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor") >= now_minute) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(chaos::QueryInt(url, "SELECT billed_before_minute FROM billing_cursor"), now_minute)
      << "the new leader did not finish the billing backlog";

  // A graceful stop hands the lease over at once, well before it expires.
  const auto stopping_at = Clock::now();
  EXPECT_EQ(survivors[leader]->Stop(), 0);
  SvdProcess* last = survivors[1 - leader];
  ASSERT_EQ(AwaitLeader({last}, absl::Seconds(10)), 0);
  const double handover_s = std::chrono::duration<double>(Clock::now() - stopping_at).count();
  std::printf("leader loss: graceful handover in %.2f s\n", handover_s);
  EXPECT_LT(handover_s, 3.0) << "the lease was not handed back";
  EXPECT_EQ(last->Stop(), 0);

  const auto acknowledged = load.acknowledged();
  std::printf("leader loss: %zu acknowledged creates\n", acknowledged.size());
  EXPECT_GT(acknowledged.size(), 0u);
  EXPECT_EQ(load.unanswered(), 0);
  const auto failures = chaos::CheckInvariants(url, acknowledged);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
}

}  // namespace
}  // namespace sv::testing
