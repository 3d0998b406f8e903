// Billing against a real PostgreSQL, driven by a fake clock: simulated days
// run in seconds. Each test states its goal and checks money to the
// micro-yuan, against an independent simple model where one is needed.
#include <algorithm>
#include <map>
#include <future>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "billing/billing.h"
#include "billing/sla_refunds.h"
#include "common/money.h"
#include "common/status.h"
#include "control/scheduling.h"
#include "gtest/gtest.h"
#include "metrics/metrics.h"
#include "store/dashboard_store.h"
#include "store/security_store.h"
#include "store/sla_store.h"
#include "store/volume_store.h"
#include "tests/integration/harness.h"

namespace sv::billing {
namespace {

constexpr int64_t kPrice = 33'000;  // RTX 4090, micro-yuan per GPU-minute.

class BillingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = sv::testing::CreateMigratedDatabase(nullptr, 16);
    ASSERT_NE(db_, nullptr);
    store_ = std::make_unique<store::Store>(*db_);
    scheduling_ = std::make_unique<control::Scheduling>(*db_, control::SchedulingOptions{});
    ASSERT_TRUE(sv::testing::AddSimulatedNodes(*store_, 16, 2, clock_.Now()).ok());
  }

  Billing MakeBilling(BillingOptions options = {}) {
    options.metering_lag = absl::ZeroDuration();
    options.first_run_lookback = absl::Hours(24 * 365);
    return Billing(*db_, *store_, clock_, options);
  }

  // A tenant with one member user; returns {tenant id, user id}.
  std::pair<std::string, std::string> NewTenant(const std::string& name) {
    auto created = store_->CreateTenant(
        {name, name + "@example.com", store::Role::kMember, "key-" + name,
         "salt-" + name, std::string(64, 'a')},
        clock_.Now());
    EXPECT_TRUE(created.ok()) << created.status();
    return {created->tenant.id, created->user_id};
  }

  // Creates an instance and takes it to RUNNING at the clock's time.
  std::string Run(const std::string& tenant, int gpus) {
    store::InstanceSpec spec{absl::StrCat("i", ++counter_), gpus, "RTX 4090", "ubuntu"};
    auto created = store_->CreateInstance(tenant, spec, absl::StrCat("r", counter_),
                                          absl::StrCat("f", counter_), clock_.Now());
    EXPECT_TRUE(created.ok()) << created.status();
    EXPECT_TRUE(scheduling_->RunPass(clock_.Now()).ok());
    EXPECT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
    EXPECT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
    auto got = store_->GetInstance(tenant, created->id);
    EXPECT_EQ(got->state, store::InstanceState::kRunning);
    return created->id;
  }

  // A network volume of the tenant, created at the clock's time.
  void NetworkVolume(const std::string& id, const std::string& tenant, int gib) {
    ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
                     txn.exec_params(
                         "INSERT INTO volumes (id, tenant_id, name, size_gib, kind, "
                         "request_id, request_fingerprint, created_at, updated_at) VALUES "
                         "($1, $2, $1, $3, 'network', $1, 'f', $4::timestamptz, "
                         "$4::timestamptz)",
                         id, tenant, gib,
                         absl::FormatTime(absl::RFC3339_full, clock_.Now(),
                                          absl::UTCTimeZone()));
                     return absl::OkStatus();
                   }).ok());
  }

  void Stop(const std::string& tenant, const std::string& id) {
    ASSERT_TRUE(store_->StopInstance(tenant, id, "stopped by the user", clock_.Now()).ok());
  }

  // When the instance's last STOPPED event says it stopped.
  absl::Time StoppedAt(const std::string& id) {
    absl::Time at = absl::InfinitePast();
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      auto rows = txn.exec_params(
          "SELECT (extract(epoch from max(at)) * 1000000)::bigint FROM instance_events "
          "WHERE instance_id = $1 AND to_state = 'STOPPED'",
          id);
      if (!rows[0][0].is_null()) at = absl::FromUnixMicros(rows[0][0].as<int64_t>());
      return absl::OkStatus();
    }).ok());
    return at;
  }

  // Rows of `table` for the instance.
  int64_t CountFor(const std::string& table, const std::string& id) {
    int64_t n = 0;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      n = txn.exec_params("SELECT count(*) FROM " + table + " WHERE instance_id = $1", id)[0][0]
              .as<int64_t>();
      return absl::OkStatus();
    }).ok());
    return n;
  }

  // What the SLA judge takes as the instance's rent, over the hours from
  // the one holding `from_minute` to the one holding `to_minute`: the sum
  // of the hours' rents and trial parts, and the minutes charged. Read
  // both as the judge does (ReadRents) and as the open hour's view does
  // (RentOf); the two must agree.
  struct SlaRentSeen {
    int64_t rent = 0;
    int64_t trial = 0;
    std::vector<int64_t> minutes;
  };
  SlaRentSeen SlaRentOver(const std::string& id, int64_t from_minute, int64_t to_minute) {
    SlaRentSeen seen;
    store::SlaStore sla(*db_);
    for (int64_t hour = from_minute / 60 * 60; hour <= to_minute; hour += 60) {
      const absl::Time start = absl::FromUnixSeconds(hour * 60);
      std::optional<store::SlaRent> judged;
      EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
        judged.reset();
        for (auto& r : store::SlaStore::ReadRents(txn, start)) {
          if (r.instance_id == id) judged = r;
        }
        return absl::OkStatus();
      }).ok());
      auto open = sla.RentOf(id, start);
      EXPECT_TRUE(open.ok()) << open.status();
      EXPECT_EQ(judged.has_value(), open.ok() && open->has_value()) << "hour " << hour;
      if (!judged) continue;
      if (open.ok() && open->has_value()) {
        EXPECT_EQ((*open)->rent_micros, judged->rent_micros) << "hour " << hour;
        EXPECT_EQ((*open)->trial_rent_micros, judged->trial_rent_micros) << "hour " << hour;
        EXPECT_EQ((*open)->charged_minutes & ((uint64_t{1} << 60) - 1),
                  judged->charged_minutes & ((uint64_t{1} << 60) - 1)) << "hour " << hour;
        EXPECT_EQ((*open)->first_minute, judged->first_minute);
        EXPECT_EQ((*open)->last_minute, judged->last_minute);
      }
      seen.rent += judged->rent_micros;
      seen.trial += judged->trial_rent_micros;
      std::vector<int64_t> of_hour;
      for (int m = 0; m < 60; ++m) {
        if (judged->charged_minutes >> m & 1) of_hour.push_back(hour + m);
      }
      EXPECT_FALSE(of_hour.empty()) << "hour " << hour;
      if (of_hour.empty()) continue;
      EXPECT_EQ(judged->first_minute, of_hour.front()) << "hour " << hour;
      EXPECT_EQ(judged->last_minute, of_hour.back()) << "hour " << hour;
      seen.minutes.insert(seen.minutes.end(), of_hour.begin(), of_hour.end());
    }
    return seen;
  }

  static std::vector<int64_t> MinutesRange(int64_t from, int64_t to) {
    std::vector<int64_t> out;
    for (int64_t m = from; m <= to; ++m) out.push_back(m);
    return out;
  }

  // An event of `id` at `at` (Unix seconds) older than the instance's
  // latest, as a late report records it: the trigger that keeps live
  // writers' ends after their starts would move it. With `resize_to`, a
  // resize from `resize_from` GPUs at the same time.
  void InsertLateEvent(const std::string& id, int64_t at, const std::string& from,
                       const std::string& to, const std::string& reason, int resize_from = 0,
                       int resize_to = 0) {
    ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
      txn.exec("ALTER TABLE instance_events DISABLE TRIGGER "
               "instance_events_running_end_not_before_start");
      txn.exec_params(
          "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) VALUES "
          "($1, to_timestamp($2), $3, $4, $5)",
          id, at, from, to, reason);
      if (resize_to > 0) {
        txn.exec_params(
            "INSERT INTO instance_resizes (instance_id, at, from_gpu_count, to_gpu_count) "
            "VALUES ($1, to_timestamp($2), $3, $4)",
            id, at, resize_from, resize_to);
      }
      txn.exec("ALTER TABLE instance_events ENABLE TRIGGER "
               "instance_events_running_end_not_before_start");
      return absl::OkStatus();
    }).ok());
  }

  void ExpectAuditClean(Billing& billing) {
    auto failures = billing.Audit();
    ASSERT_TRUE(failures.ok()) << failures.status();
    for (const auto& f : *failures) ADD_FAILURE() << f;
  }

  // Starts on a minute boundary plus 20 s, so partial minutes show.
  FakeClock clock_{absl::FromUnixSeconds(1'790'000'000 / 60 * 60 + 20)};
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<control::Scheduling> scheduling_;
  int counter_ = 0;
};

// The independent model: a list of intervals per instance, the started-
// minute rule, prices by minute start, trial first, no capping needed.
struct ModelInstance {
  std::string tenant;
  int gpus = 0;
  std::vector<std::pair<absl::Time, absl::Time>> runs;
};

int64_t ModelPrice(const std::vector<std::pair<absl::Time, int64_t>>& prices, int64_t minute) {
  int64_t price = 0;
  for (const auto& [from, p] : prices) {
    if (absl::FromUnixSeconds(minute * 60) >= from) price = p;
  }
  return price;
}

// 30 simulated days of four tenants whose instances start and stop at random
// seconds, with a price change on day 10 and billing runs every 6 hours:
// every wallet and the platform revenue agree with the model exactly.
TEST_F(BillingTest, ThirtyDaysAgreeWithModel) {
  BillingOptions options;
  options.trial_validity = absl::Hours(24 * 60);
  Billing billing = MakeBilling(options);
  const absl::Time t0 = clock_.Now();
  std::vector<std::pair<absl::Time, int64_t>> prices = {{absl::UnixEpoch(), kPrice}};
  const absl::Time change = t0 + absl::Hours(24 * 10) + absl::Seconds(30);
  ASSERT_TRUE(billing.SetGpuPrice("RTX 4090", 40'000, change, clock_.Now()).ok());
  prices.push_back({change, 40'000});

  std::vector<std::string> tenants;
  for (int i = 0; i < 4; ++i) {
    auto [tenant, user] = NewTenant(absl::StrCat("model", i));
    tenants.push_back(tenant);
    ASSERT_TRUE(billing.TopUp(tenant, absl::StrCat("pay-", i), 100'000 * kMicrosPerYuan,
                              clock_.Now()).ok());
  }
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());  // Grants the trials.

  // Each tenant has two lanes; a lane runs one instance at a time.
  std::mt19937 random(42);
  struct Action { absl::Time at; int tenant; int lane; };
  std::vector<Action> actions;
  for (int t = 0; t < 4; ++t) {
    for (int lane = 0; lane < 2; ++lane) {
      absl::Time at = t0 + absl::Seconds(random() % 3600);
      while (at < t0 + absl::Hours(24 * 30)) {
        actions.push_back({at, t, lane});
        at += absl::Seconds(60 + random() % (3 * 24 * 3600));
      }
    }
  }
  std::sort(actions.begin(), actions.end(), [](const Action& a, const Action& b) {
    return a.at < b.at;
  });
  std::map<std::pair<int, int>, std::string> running;
  std::map<std::string, ModelInstance> model;
  absl::Time next_run = t0 + absl::Hours(6);
  for (const Action& a : actions) {
    while (next_run <= a.at) {
      clock_.Set(next_run);
      ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
      next_run += absl::Hours(6);
    }
    clock_.Set(a.at);
    auto key = std::make_pair(a.tenant, a.lane);
    auto it = running.find(key);
    if (it == running.end()) {
      const int gpus = 1 + random() % 8;
      std::string id = Run(tenants[a.tenant], gpus);
      model[id] = {tenants[a.tenant], gpus, {{a.at, absl::InfiniteFuture()}}};
      running[key] = id;
    } else {
      Stop(tenants[a.tenant], it->second);
      model[it->second].runs.back().second = a.at;
      running.erase(it);
    }
  }
  const absl::Time end = t0 + absl::Hours(24 * 30);
  clock_.Set(end);
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  const int64_t billed_before = MinuteOf(end);

  // The model: charge per instance-minute, trial first.
  std::map<std::string, int64_t> charged;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> per_tenant;  // minute, gross
  for (const auto& [id, inst] : model) {
    for (const auto& [from, to] : inst.runs) {
      const int64_t first = MinuteOf(from);
      int64_t last = billed_before - 1;
      if (to != absl::InfiniteFuture()) {
        last = std::min(last, (absl::ToUnixMicros(to) - 1) / 60'000'000);
      }
      for (int64_t m = first; m <= last; ++m) {
        per_tenant[inst.tenant].push_back({m, inst.gpus * ModelPrice(prices, m)});
      }
    }
  }
  int64_t revenue = 0;
  for (const std::string& tenant : tenants) {
    int64_t trial = 10 * kMicrosPerYuan, paid = 100'000 * kMicrosPerYuan;
    for (const auto& [m, gross] : per_tenant[tenant]) {
      const int64_t from_trial = std::min(trial, gross);
      trial -= from_trial;
      paid -= gross - from_trial;
      revenue += gross;
    }
    auto balance = billing.GetBalance(tenant, clock_.Now());
    ASSERT_TRUE(balance.ok());
    EXPECT_EQ(balance->trial_micros, trial) << tenant;
    EXPECT_EQ(balance->paid_micros, paid) << tenant;
  }
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->platform_revenue_balance_micros, revenue);
  EXPECT_GT(revenue, 0);
  ExpectAuditClean(billing);
}

// Eight concurrent first requests of one user grant the trial once.
TEST_F(BillingTest, TrialGrantedOnceUnderConcurrency) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("trialrace");
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, user = user] {
      if (!billing.EnsureTrialGrant(user, clock_.Now()).ok()) ++failures;
    });
  }
  threads.emplace_back([&] {
    if (!billing.GrantMissingTrials(clock_.Now()).ok()) ++failures;
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto balance = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(balance->trial_micros, 10 * kMicrosPerYuan);
  ASSERT_TRUE(balance->trial_expires_at.has_value());
  EXPECT_EQ(*balance->trial_expires_at, clock_.Now() + absl::Hours(24 * 30));
  auto transfers = billing.ListTransfers(tenant, {});
  ASSERT_EQ(transfers->size(), 1u);
  EXPECT_EQ((*transfers)[0].idempotency_key, "trial:" + user);
  ExpectAuditClean(billing);
}

// One trial per tenant: members an owner adds, at once or later, removed
// and replaced, add no trial credit (each used to add 10 CNY to the
// tenant's one trial wallet: free GPU time for the asking). Each gets a
// row of amount 0, so nothing asks again; the owner's grant and its expiry
// are what the balance shows.
TEST_F(BillingTest, AddedMembersAddNoTrialCredit) {
  Billing billing = MakeBilling();
  auto [tenant, owner] = NewTenant("team");
  store::SecurityStore security(*db_);
  std::vector<std::string> members;
  auto add = [&](int i) {
    auto member = security.AddMember(
        tenant, absl::StrCat("m", i, "@team.example"), store::TenantRole::kMember,
        {absl::StrCat("key-team-", i), "", "", "salt", std::string(64, 'b'), "initial"},
        clock_.Now());
    EXPECT_TRUE(member.ok()) << member.status();
    members.push_back(member->user_id);
  };
  add(0);
  // The owner and a member granted at the same moment: one of them gets it.
  std::vector<std::thread> threads;
  for (const std::string& u : {owner, members[0]}) {
    threads.emplace_back([&, u] { EXPECT_TRUE(billing.EnsureTrialGrant(u, clock_.Now()).ok()); });
  }
  for (auto& t : threads) t.join();
  clock_.Advance(absl::Hours(1));
  for (int i = 1; i < 6; ++i) add(i);
  ASSERT_TRUE(security.RemoveMember(tenant, members[5], clock_.Now()).ok());
  add(6);
  for (const auto& m : members) ASSERT_TRUE(billing.EnsureTrialGrant(m, clock_.Now()).ok());
  ASSERT_TRUE(billing.GrantMissingTrials(clock_.Now()).ok());
  auto balance = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(balance->trial_micros, 10 * kMicrosPerYuan);
  ASSERT_TRUE(balance->trial_expires_at.has_value());
  EXPECT_EQ(*balance->trial_expires_at, clock_.Now() - absl::Hours(1) + absl::Hours(24 * 30));
  auto grants = billing.ListTransfers(tenant, {.kind = "trial_grant"});
  ASSERT_EQ(grants->size(), 1u);
  int64_t rows = 0, granted = 0;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    auto r = txn.exec_params1(
        "SELECT count(*), sum(amount_micros)::bigint FROM trial_grants WHERE tenant_id = $1",
        tenant);
    rows = r[0].as<int64_t>();
    granted = r[1].as<int64_t>();
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(rows, 1 + 7);  // The owner and every member, once each.
  EXPECT_EQ(granted, 10 * kMicrosPerYuan);
  ExpectAuditClean(billing);
}

// Trial credit goes first; when both run out the instance is charged only
// what was left (shortfall recorded) and a new create is refused with
// INSUFFICIENT_CREDIT. Metering was two hours behind here (one run after
// two hours), so the instance ran on unpaid until that run stopped it:
// each of those minutes is a shortfall, and the instance's record says it
// held its GPUs until then.
TEST_F(BillingTest, TrialFirstThenStopsAtTheRightMinute) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("runsout");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-1", 1 * kMicrosPerYuan, clock_.Now()).ok());
  const int64_t m0 = MinuteOf(clock_.Now());
  const std::string id = Run(tenant, 8);  // 264,000 per minute; 11 CNY lasts 41.67 min.
  clock_.Advance(absl::Hours(2));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();

  auto balance = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(balance->trial_micros, 0);
  EXPECT_EQ(balance->paid_micros, 0);
  auto transfers = billing.ListTransfers(tenant, {.kind = "charge", .limit = 1000});
  int64_t from_trial = 0, from_paid = 0, last_minute = 0;
  for (const auto& t : *transfers) {
    (t.from_kind == "trial_wallet" ? from_trial : from_paid) += t.amount_micros;
    last_minute = std::max(last_minute, *t.usage_minute);
    // Paid credit is touched only from the minute the trial ran out.
    if (t.from_kind == "paid_wallet") {
      EXPECT_GE(*t.usage_minute, m0 + 37);
    }
    if (t.from_kind == "trial_wallet") {
      EXPECT_LE(*t.usage_minute, m0 + 37);
    }
  }
  EXPECT_EQ(from_trial, 10 * kMicrosPerYuan);
  EXPECT_EQ(from_paid, 1 * kMicrosPerYuan);
  EXPECT_EQ(last_minute, m0 + 41);  // 41 full minutes, then 176,000 of 264,000.
  auto instance = store_->GetInstance(tenant, id);
  EXPECT_EQ(instance->state, store::InstanceState::kStopped);
  EXPECT_EQ(instance->state_reason, "credit exhausted");
  const absl::Time stopped_at = StoppedAt(id);
  EXPECT_EQ(stopped_at, clock_.Now());
  // 88,000 of minute 41, then all of every minute billed since.
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  EXPECT_EQ(summary->shortfall_micros,
            88'000 + (*result->billed_before_minute - (m0 + 42)) * 264'000);
  int exhausted_notices = 0;
  for (const auto& n : balance->notices) {
    if (n.kind != "credit_exhausted") continue;
    ++exhausted_notices;
    EXPECT_NE(n.message.find("uncollected: 0.088 CNY so far"), std::string::npos) << n.message;
    EXPECT_NE(n.message.find("instance " + id + " is stopped"), std::string::npos) << n.message;
    EXPECT_EQ(n.instance_id, id);
  }
  EXPECT_EQ(exhausted_notices, 1);
  absl::Status refused = billing.CheckCreditForCreate(tenant, 1, "RTX 4090", clock_.Now());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), "INSUFFICIENT_CREDIT");
  // Another hour of metering charges nothing more; the minutes up to the
  // stop become shortfall, without a second stop or notice.
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  EXPECT_EQ(billing.ListTransfers(tenant, {.kind = "charge", .limit = 1000})->size(),
            transfers->size());
  const int64_t last_run_minute = MinuteOf(stopped_at - absl::Microseconds(1));
  summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  EXPECT_EQ(summary->shortfall_micros, 88'000 + (last_run_minute - (m0 + 41)) * 264'000);
  EXPECT_EQ(CountFor("billing_shortfalls", id), last_run_minute - (m0 + 41) + 1);
  EXPECT_EQ(CountFor("billing_stops", id), 1);
  balance = billing.GetBalance(tenant, clock_.Now());
  exhausted_notices = 0;
  for (const auto& n : balance->notices) exhausted_notices += n.kind == "credit_exhausted";
  EXPECT_EQ(exhausted_notices, 1);
  ExpectAuditClean(billing);

  // Topped up and running again, the stop no longer asks for a top-up.
  ASSERT_TRUE(billing.TopUp(tenant, "pay-again", 50 * kMicrosPerYuan, clock_.Now()).ok());
  ASSERT_TRUE(store_->StartInstance(tenant, id, clock_.Now()).ok());
  ASSERT_TRUE(scheduling_->RunPass(clock_.Now()).ok());
  ASSERT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
  ASSERT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
  ASSERT_EQ(store_->GetInstance(tenant, id)->state, store::InstanceState::kRunning);
  clock_.Advance(absl::Seconds(1));
  balance = billing.GetBalance(tenant, clock_.Now());
  for (const auto& n : balance->notices) EXPECT_NE(n.kind, "credit_exhausted") << n.message;
}

// With the loop running every minute, credit runs out in minute 41: the
// run that bills minute 40 (a little after minute 41 starts) finds that
// what is left cannot pay minute 41 and stops the instance at once, ahead
// of metering. It ran unpaid for part of minute 41 only, which metering
// records as a shortfall when it bills that minute.
TEST_F(BillingTest, StopsWithinAMinuteOfRunningOut) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("everyminute");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());  // 10 CNY
  ASSERT_TRUE(billing.TopUp(tenant, "pay-em", 1 * kMicrosPerYuan, clock_.Now()).ok());
  const int64_t m0 = MinuteOf(clock_.Now());  // Started 20 s into m0.
  const std::string id = Run(tenant, 8);      // 264,000 per minute: 41 minutes and 176,000.
  int64_t stops_reported = 0;
  for (int k = 0; k < 50; ++k) {
    clock_.Advance(absl::Minutes(1));
    auto result = billing.RunOnce(clock_.Now());
    ASSERT_TRUE(result.ok()) << result.status();
    stops_reported += result->stopped_instances;
  }
  EXPECT_EQ(stops_reported, 1);  // What the loop logs as "N stops".
  const absl::Time stopped_at = StoppedAt(id);
  ASSERT_NE(stopped_at, absl::InfinitePast());
  // The run at m0+41 + 20 s billed minute 40 (MakeBilling sets no lag) and
  // stopped the instance then.
  EXPECT_EQ(stopped_at, MinuteStart(m0 + 41) + absl::Seconds(20));
  auto transfers = billing.ListTransfers(tenant, {.kind = "charge", .limit = 1000});
  int64_t charged = 0, last_minute = 0;
  for (const auto& t : *transfers) {
    charged += t.amount_micros;
    last_minute = std::max(last_minute, *t.usage_minute);
  }
  EXPECT_EQ(charged, 11 * kMicrosPerYuan);
  EXPECT_EQ(last_minute, m0 + 41);
  // Shortfall: the rest of minute 41.
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  EXPECT_EQ(summary->shortfall_micros, 88'000);
  EXPECT_EQ(CountFor("billing_shortfalls", id), 1);
  // The operator's dashboard shows it as unpaid, in the day it was used.
  store::DashboardStore dashboard(*db_);
  auto points = dashboard.RevenueSeries(MinuteStart(m0), clock_.Now(), false);
  ASSERT_TRUE(points.ok()) << points.status();
  int64_t unpaid = 0;
  for (const auto& p : *points) unpaid += p.shortfall_micros;
  EXPECT_EQ(unpaid, 88'000);
  // Stopped ahead of metering: no stop for metering to apply, one notice.
  EXPECT_EQ(CountFor("billing_stops", id), 0);
  auto balance = billing.GetBalance(tenant, clock_.Now());
  int exhausted_notices = 0;
  for (const auto& n : balance->notices) {
    if (n.kind != "credit_exhausted") continue;
    ++exhausted_notices;
    EXPECT_NE(n.message.find("credit ran out in minute"), std::string::npos) << n.message;
    EXPECT_NE(n.message.find("instance " + id + " is stopped"), std::string::npos) << n.message;
  }
  EXPECT_EQ(exhausted_notices, 1);
  ExpectAuditClean(billing);
}

// As svd runs it: the loop every 5 s and metering 60 s behind (the node
// heartbeat timeout's margin). Metering finds minute 41 short only after
// minute 42 ends, and stopped the instance then, 2 minutes and 616,000
// micro-yuan late. The instance stops in the loop's first turn in minute
// 41, and only that minute's unpaid 88,000 is lost.
TEST_F(BillingTest, StopsAsCreditRunsOutDespiteTheMeteringLag) {
  BillingOptions options;
  options.first_run_lookback = absl::Hours(24 * 365);
  ASSERT_EQ(options.metering_lag, absl::Seconds(60));
  Billing billing(*db_, *store_, clock_, options);
  auto [tenant, user] = NewTenant("lagged");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());  // 10 CNY
  ASSERT_TRUE(billing.TopUp(tenant, "pay-lag", 1 * kMicrosPerYuan, clock_.Now()).ok());
  // The loop's turns fall 2 s into each minute.
  clock_.Advance(MinuteStart(MinuteOf(clock_.Now()) + 1) + absl::Seconds(2) - clock_.Now());
  const int64_t m0 = MinuteOf(clock_.Now());
  const std::string id = Run(tenant, 8);  // 264,000 per minute: 41 minutes and 176,000.
  const absl::Time end = MinuteStart(m0 + 46);
  while (clock_.Now() < end) {
    clock_.Advance(absl::Seconds(5));
    ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  }
  EXPECT_EQ(StoppedAt(id), MinuteStart(m0 + 41) + absl::Seconds(2));
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  EXPECT_EQ(summary->shortfall_micros, 88'000);
  auto transfers = billing.ListTransfers(tenant, {.kind = "charge", .limit = 1000});
  int64_t charged = 0;
  for (const auto& t : *transfers) charged += t.amount_micros;
  EXPECT_EQ(charged, 11 * kMicrosPerYuan);
  auto instance = store_->GetInstance(tenant, id);
  EXPECT_EQ(instance->state_reason, "credit exhausted");
  ExpectAuditClean(billing);
}

// A tenant whose credit covers its instances is never stopped ahead of
// metering, however far metering is behind: two instances with credit for
// exactly 30 minutes of both (the trial and a top-up) run all 30 minutes,
// unbilled.
TEST_F(BillingTest, FundedInstancesAreNotStoppedAheadOfMetering) {
  BillingOptions options;
  options.first_run_lookback = absl::Hours(24 * 365);
  options.metering_lag = absl::Minutes(30);
  Billing billing(*db_, *store_, clock_, options);
  auto [tenant, user] = NewTenant("funded");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());  // 10 CNY
  ASSERT_TRUE(billing.TopUp(tenant, "pay-f", 2 * 30 * 8 * 33'000 - 10 * kMicrosPerYuan,
                            clock_.Now()).ok());
  const int64_t m0 = MinuteOf(clock_.Now());
  const std::string a = Run(tenant, 8);
  const std::string b = Run(tenant, 8);
  while (clock_.Now() + absl::Seconds(30) < MinuteStart(m0 + 30)) {
    clock_.Advance(absl::Seconds(30));
    auto result = billing.RunOnce(clock_.Now());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->stopped_instances, 0) << absl::FormatTime(clock_.Now());
  }
  EXPECT_EQ(store_->GetInstance(tenant, a)->state, store::InstanceState::kRunning);
  EXPECT_EQ(store_->GetInstance(tenant, b)->state, store::InstanceState::kRunning);
  // Minute 30 cannot be paid: both stop in its first turn.
  clock_.Advance(absl::Seconds(30));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->stopped_instances, 2);
}

// A stop that was recorded but never applied (the process died between the
// batch's commit and StopInstance) is applied by the next run before it
// bills any later minute, and a run that records no stop leaves none
// pending. The instance stops when the stop is applied: it ran until then,
// so the minutes up to it are billed (here the tenant can pay them).
TEST_F(BillingTest, UnappliedStopIsAppliedBeforeLaterMinutes) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("pendingstop");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-ps", 100 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 1);
  const int64_t m0 = MinuteOf(clock_.Now());
  clock_.Advance(absl::Minutes(5));
  ASSERT_TRUE(billing.BillMinutesBefore(m0 + 4, clock_.Now()).ok());
  // As the batch of minute m0 + 3 would have recorded it: stop at its end.
  const int64_t stop_minute = m0 + 4;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params("INSERT INTO billing_stops (instance_id, tenant_id, stop_at) "
                    "VALUES ($1, $2, to_timestamp($3::bigint * 60))",
                    id, tenant, stop_minute);
    return absl::OkStatus();
  }).ok());
  clock_.Advance(absl::Minutes(10));
  auto billed = billing.BillMinutesBefore(MinuteOf(clock_.Now()), clock_.Now());
  ASSERT_TRUE(billed.ok()) << billed.status();
  auto instance = store_->GetInstance(tenant, id);
  EXPECT_EQ(instance->state, store::InstanceState::kStopped);
  EXPECT_EQ(instance->state_reason, "credit exhausted");
  EXPECT_EQ(StoppedAt(id), clock_.Now());
  auto charges = billing.ListTransfers(tenant, {.kind = "charge", .limit = 1000});
  ASSERT_TRUE(charges.ok());
  int64_t last_minute = 0;
  for (const auto& t : *charges) last_minute = std::max(last_minute, *t.usage_minute);
  const int64_t now_minute = MinuteOf(clock_.Now());
  EXPECT_EQ(last_minute, now_minute - 1);
  EXPECT_EQ(charges->size(), static_cast<size_t>(now_minute - m0));
  // The minute the stop fell in is the last one charged.
  clock_.Advance(absl::Minutes(1));
  ASSERT_TRUE(billing.BillMinutesBefore(MinuteOf(clock_.Now()), clock_.Now()).ok());
  charges = billing.ListTransfers(tenant, {.kind = "charge", .limit = 1000});
  EXPECT_EQ(charges->size(), static_cast<size_t>(now_minute - m0 + 1));
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    EXPECT_EQ(txn.exec("SELECT count(*) FROM billing_stops WHERE NOT applied")[0][0]
                  .as<int64_t>(), 0);
    return absl::OkStatus();
  }).ok());
  ExpectAuditClean(billing);
}

// A low balance warns before it runs out.
TEST_F(BillingTest, WarnsBeforeCreditRunsOut) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("lowcredit");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  Run(tenant, 8);  // 10 CNY lasts about 37 minutes; the warning is at 30.
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_FALSE(balance->notices.empty());
  EXPECT_EQ(balance->notices[0].kind, "low_credit");
  EXPECT_NE(balance->notices[0].message.find("at 0.264 CNY per minute"), std::string::npos)
      << balance->notices[0].message;
  EXPECT_GT(balance->available_micros, 0);
  // The warning shown tells the minutes left at the running cost of now,
  // once, though the row keeps the figures it was written with and a later
  // row repeats it.
  clock_.Advance(absl::Minutes(2));
  Run(tenant, 1);
  balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok());
  ASSERT_FALSE(balance->notices.empty());
  EXPECT_EQ(balance->notices[0].message,
            absl::StrCat("credit for about ", balance->available_micros / 297'000,
                         " more minutes at 0.297 CNY per minute; top up to keep instances "
                         "running and volumes paid for"));
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params("INSERT INTO billing_notices (tenant_id, kind, message, at) "
                    "VALUES ($1, 'low_credit', 'credit for about 25 more minutes', $2)",
                    tenant, store::SqlTime(clock_.Now()));
    return absl::OkStatus();
  }).ok());
  balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok());
  int low_credit = 0;
  for (const auto& n : balance->notices) low_credit += n.kind == "low_credit";
  EXPECT_EQ(low_credit, 1);
  EXPECT_NE(balance->notices[0].message.find("at 0.297 CNY per minute"), std::string::npos)
      << balance->notices[0].message;
  // Once a top-up covers the warning's minutes, the balance stops asking
  // for one.
  ASSERT_TRUE(billing.TopUp(tenant, "after-warning", 100 * kMicrosPerYuan, clock_.Now()).ok());
  balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok());
  for (const auto& n : balance->notices) EXPECT_NE(n.kind, "low_credit") << n.message;
}

// Volumes cost money with no instance running: their storage counts in the
// running cost, warns before the credit runs out, and going unpaid is
// noticed once (it stops nothing). Until 2026-12-04 a tenant with only a
// 64 TiB volume saw a running cost of 0, was never warned and was never
// told its storage went unpaid.
TEST_F(BillingTest, VolumesWarnAndAreNoticedWhenUnpaid) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("hoarder");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  // 65,536 GiB at 400 micro-yuan per GiB-hour, 26.2 CNY an hour, and a
  // small one: the 10 CNY trial lasts about 23 minutes. The small one is
  // paid a minute longer (volumes are charged in id order), and both going
  // unpaid is one notice.
  NetworkVolume("vol-a", tenant, 1);
  NetworkVolume("vol-big", tenant, 65535);
  auto balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok());
  EXPECT_EQ(balance->burn_micros_per_minute, 65536 * 400 / 60);
  auto once = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(once.ok()) << once.status();
  balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok()) << balance.status();
  ASSERT_FALSE(balance->notices.empty());
  EXPECT_EQ(balance->notices[0].kind, "low_credit") << balance->notices[0].message;

  auto exhausted = [&] {
    std::vector<std::string> messages;
    auto now = billing.GetBalance(tenant, clock_.Now());
    EXPECT_TRUE(now.ok()) << now.status();
    for (const auto& n : now->notices) {
      if (n.kind == "credit_exhausted") messages.push_back(n.message);
    }
    return messages;
  };
  for (int minute = 1; minute <= 40; ++minute) {
    clock_.Advance(absl::Minutes(1));
    ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
    if (minute == 20) {
      EXPECT_TRUE(exhausted().empty());
    }
  }
  const std::vector<std::string> notices = exhausted();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("vol-big"), std::string::npos) << notices[0];
  int64_t unpaid_storage = 0;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    EXPECT_GT(txn.exec("SELECT count(*) FROM storage_shortfalls")[0][0].as<int64_t>(), 10);
    unpaid_storage = txn.exec("SELECT sum(fee_micros - charged_micros)::bigint "
                              "FROM storage_shortfalls")[0][0].as<int64_t>();
    return absl::OkStatus();
  }).ok());
  // The operator sees it: in the revenue summary and the dashboard's series
  // (until 2026-12-04 both counted unpaid GPU rent only).
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(summary.ok());
  EXPECT_GT(unpaid_storage, 10 * 436'000);
  EXPECT_EQ(summary->storage_shortfall_micros, unpaid_storage);
  EXPECT_EQ(summary->shortfall_micros, 0);
  store::DashboardStore dashboard(*db_);
  auto points = dashboard.RevenueSeries(clock_.Now() - absl::Hours(2), clock_.Now(), false);
  ASSERT_TRUE(points.ok()) << points.status();
  int64_t series_unpaid = 0;
  for (const auto& p : *points) series_unpaid += p.storage_shortfall_micros;
  EXPECT_EQ(series_unpaid, unpaid_storage);
  // Paid again after a top-up: the notice no longer threatens deletion.
  // Then unpaid again: a second notice, and both show.
  ASSERT_TRUE(billing.TopUp(tenant, "refill", 1 * kMicrosPerYuan, clock_.Now()).ok());
  clock_.Advance(absl::Minutes(1));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  EXPECT_TRUE(exhausted().empty());
  for (int minute = 2; minute <= 10; ++minute) {
    clock_.Advance(absl::Minutes(1));
    ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  }
  EXPECT_EQ(exhausted().size(), 2u);
  ExpectAuditClean(billing);
}

// Catching up after downtime bills the minutes as if each had been billed
// on time: rent and storage of minute m before anything of minute m+1. Until
// 2026-12-06 a batch of many minutes charged all its rent first, so the
// trial paid 37 minutes of GPU rent while the volume went unpaid from its
// second minute ("credit ran out for storage" half an hour before the
// instance stopped).
TEST_F(BillingTest, CatchUpPaysRentAndStorageMinuteByMinute) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("sleeper");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  const std::string id = Run(tenant, 8);
  NetworkVolume("vol-data", tenant, 10'000);  // 4 CNY an hour
  auto balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok()) << balance.status();
  const int64_t burn = balance->burn_micros_per_minute;
  ASSERT_GT(burn, 0);
  // An hour with no billing run (svd down), then one run catches up.
  clock_.Advance(absl::Hours(1));
  auto caught_up = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(caught_up.ok()) << caught_up.status();

  int64_t last_rent = 0, rent_minutes = 0, first_unpaid = 0, storage_paid_minutes = 0;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    auto rent = txn.exec_params(
        "SELECT max(c.minute), count(*) FROM ledger_charges c JOIN instances i "
        "ON i.billing_no = c.instance_no WHERE i.id = $1", id);
    last_rent = rent[0][0].as<int64_t>();
    rent_minutes = rent[0][1].as<int64_t>();
    first_unpaid = txn.exec("SELECT min(usage_minute) FROM storage_shortfalls")[0][0]
                       .as<int64_t>();
    storage_paid_minutes =
        txn.exec("SELECT count(DISTINCT usage_minute) FROM ledger_transfers "
                 "WHERE kind = 'storage'")[0][0].as<int64_t>();
    return absl::OkStatus();
  }).ok());
  // 10 CNY at the combined burn: rent and storage run out together.
  const int64_t expected_minutes = 10 * kMicrosPerYuan / burn;
  EXPECT_NEAR(rent_minutes, expected_minutes, 1);
  EXPECT_GE(first_unpaid, last_rent) << "storage went unpaid before later rent was charged";
  // Within a minute rent comes first, as on time: the last rent minute
  // may leave nothing for its storage.
  EXPECT_GE(storage_paid_minutes, rent_minutes - 1);
  // The instance ran until the run that caught up (it stops when the stop
  // is applied, as in UnappliedStopIsAppliedBeforeLaterMinutes), and the
  // notice of the storage names its first unpaid minute.
  EXPECT_EQ(StoppedAt(id), clock_.Now());
  balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok());
  const std::string minute_text = absl::FormatTime(
      "%Y-%m-%d %H:%M", absl::FromUnixSeconds(first_unpaid * 60), absl::UTCTimeZone());
  bool storage_notice = false;
  for (const auto& n : balance->notices) {
    if (n.message.find("credit ran out for storage in minute " + minute_text) !=
        std::string::npos) {
      storage_notice = true;
    }
  }
  EXPECT_TRUE(storage_notice);
  ExpectAuditClean(billing);
}

// A volume whose storage stays unpaid for the grace period is deleted, with
// a notice; its attachment to a stopped instance goes with it. A tenant who
// tops up within the grace keeps its volume, as does a tenant who pays.
// (Until 2026-12-04 unpaid volumes were kept for good, and each added a
// storage_shortfalls row a minute.)
TEST_F(BillingTest, UnpaidVolumesAreDeletedAfterTheGrace) {
  BillingOptions options;
  options.unpaid_storage_grace = absl::Hours(1);
  Billing billing = MakeBilling(options);
  auto [broke, broke_user] = NewTenant("broke");
  auto [returner, returner_user] = NewTenant("returner");
  auto [payer, payer_user] = NewTenant("payer");
  for (const std::string& user : {broke_user, returner_user, payer_user}) {
    ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  }
  ASSERT_TRUE(billing.TopUp(payer, "payer-1", 1000 * kMicrosPerYuan, clock_.Now()).ok());
  // 65,536 GiB: 436,906 micro-yuan a minute, so the trials last 22 minutes.
  NetworkVolume("vol-broke", broke, 65536);
  NetworkVolume("vol-returner", returner, 65536);
  NetworkVolume("vol-payer", payer, 65536);
  // The broke tenant's instance stops when its credit runs out; its volume
  // stays attached to it.
  const std::string instance = Run(broke, 1);
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params("INSERT INTO volume_attachments (volume_id, instance_id, tenant_id, "
                    "read_only, mount_path, state, requested_at) VALUES ('vol-broke', $1, "
                    "$2, false, '/mnt/data', 'attached', now())",
                    instance, broke);
    return absl::OkStatus();
  }).ok());

  auto unpaid_since = [&](const std::string& id) {
    std::optional<int64_t> since;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      auto r = txn.exec_params1("SELECT unpaid_since_minute FROM volumes WHERE id = $1", id);
      since.reset();
      if (!r[0].is_null()) since = r[0].as<int64_t>();
      return absl::OkStatus();
    }).ok());
    return since;
  };
  auto deleted = [&](const std::string& id) {
    bool gone = false;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      gone = !txn.exec_params1("SELECT deleted_at FROM volumes WHERE id = $1", id)[0].is_null();
      return absl::OkStatus();
    }).ok());
    return gone;
  };
  // The broke tenant's unpaid-storage notice while its volume is kept.
  auto storage_notices = [&] {
    std::vector<std::string> messages;
    auto balance = billing.GetBalance(broke, clock_.Now());
    EXPECT_TRUE(balance.ok()) << balance.status();
    for (const auto& n : balance->notices) {
      if (n.kind == "credit_exhausted" && n.instance_id.empty()) messages.push_back(n.message);
    }
    return messages;
  };
  std::vector<std::string> warned;
  std::optional<int64_t> broke_since;
  int64_t deleted_in_minute = 0;
  for (int minute = 1; minute <= 100; ++minute) {
    clock_.Advance(absl::Minutes(1));
    if (minute == 40) {  // Unpaid for about 18 minutes: in time.
      ASSERT_TRUE(unpaid_since("vol-returner").has_value());
      ASSERT_TRUE(billing.TopUp(returner, "returner-1", 100 * kMicrosPerYuan,
                                clock_.Now()).ok());
    }
    auto result = billing.RunOnce(clock_.Now());
    ASSERT_TRUE(result.ok()) << result.status();
    if (!broke_since) broke_since = unpaid_since("vol-broke");
    if (broke_since && !deleted("vol-broke") && warned.empty()) warned = storage_notices();
    if (deleted_in_minute == 0 && deleted("vol-broke")) {
      deleted_in_minute = MinuteOf(clock_.Now());
      EXPECT_EQ(result->deleted_volumes, 1);
    }
  }
  ASSERT_TRUE(broke_since.has_value());
  // Billed through minute since + 59, all unpaid: deleted in the turn that
  // billed that minute.
  EXPECT_EQ(deleted_in_minute, *broke_since + 60);
  EXPECT_FALSE(deleted("vol-returner"));
  EXPECT_FALSE(unpaid_since("vol-returner").has_value());
  EXPECT_FALSE(deleted("vol-payer"));
  EXPECT_EQ(store_->GetInstance(broke, instance)->state, store::InstanceState::kStopped);

  std::vector<std::string> deleted_notices;
  auto balance = billing.GetBalance(broke, clock_.Now());
  ASSERT_TRUE(balance.ok());
  for (const auto& n : balance->notices) {
    if (n.kind == "volume_deleted") deleted_notices.push_back(n.message);
  }
  ASSERT_EQ(deleted_notices.size(), 1u);
  EXPECT_NE(deleted_notices[0].find("vol-broke"), std::string::npos) << deleted_notices[0];
  // While kept, the tenant was told when it would be deleted; once it is,
  // that warning gives way to the deletion's notice.
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_NE(warned[0].find("deleted at"), std::string::npos) << warned[0];
  EXPECT_TRUE(storage_notices().empty());
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    EXPECT_EQ(txn.exec("SELECT count(*) FROM volume_attachments")[0][0].as<int64_t>(), 0);
    // Nothing is charged or recorded after the minute it was deleted in.
    EXPECT_EQ(txn.exec_params1("SELECT count(*) FROM storage_shortfalls WHERE volume_id = "
                               "'vol-broke' AND usage_minute > $1",
                               deleted_in_minute)[0].as<int64_t>(),
              0);
    return absl::OkStatus();
  }).ok());
  ExpectAuditClean(billing);
}

// A top-up's payment id is its idempotency key: a replay is a no-op, a
// different amount under the same id is refused.
// The price list a tenant reads: each item's price in effect now, until
// the next one scheduled, and that one; '*' after the named items; storage
// after GPUs; prices already replaced are left out.
TEST_F(BillingTest, PriceListShowsScheduledChanges) {
  Billing billing = MakeBilling();
  auto [renter, renter_user] = NewTenant("renter");
  auto [idle, idle_user] = NewTenant("idle");
  ASSERT_TRUE(billing.TopUp(renter, "pay-pl", 100 * kMicrosPerYuan, clock_.Now()).ok());
  Run(renter, 1);
  const absl::Time now = clock_.Now();
  ASSERT_TRUE(billing.SetGpuPrice("RTX 4090", 40'000, now, now).ok());
  ASSERT_TRUE(billing.SetGpuPrice("RTX 4090", 50'000, now + absl::Hours(48), now).ok());
  // The same price again at a later time changes nothing, and says nothing.
  ASSERT_TRUE(billing.SetGpuPrice("RTX 4090", 50'000, now + absl::Hours(72), now).ok());
  // A tenant renting the model is told of each change; one renting
  // nothing is not.
  std::vector<std::string> told;
  auto renter_balance = billing.GetBalance(renter, now);
  ASSERT_TRUE(renter_balance.ok()) << renter_balance.status();
  for (const auto& n : renter_balance->notices) {
    if (n.kind == "price_change") told.push_back(n.message);
  }
  const std::string at = absl::FormatTime("%Y-%m-%d %H:%M UTC", now + absl::Hours(48),
                                          absl::UTCTimeZone());
  ASSERT_EQ(told.size(), 2u) << absl::StrJoin(told, "\n");
  EXPECT_EQ(told[0], "the price of RTX 4090 changes from 2.40 CNY to 3.00 CNY per GPU-hour at " +
                         at + " (svctl prices)");
  EXPECT_NE(told[1].find("from 1.98 CNY to 2.40 CNY"), std::string::npos) << told[1];
  // Storage the same way: a tenant with a network volume is told; the
  // renter without one is not.
  NetworkVolume("vol-priced", idle, 100);
  ASSERT_TRUE(billing.SetStoragePrice("network", 500, now + absl::Hours(24), now).ok());
  EXPECT_EQ(ReasonOf(billing.SetStoragePrice("tape", 500, now, now)), "INVALID_VOLUME_KIND");
  EXPECT_EQ(ReasonOf(billing.SetStoragePrice("network", 500, now - absl::Hours(1), now)),
            "PRICE_IN_PAST");
  auto idle_balance = billing.GetBalance(idle, now);
  ASSERT_TRUE(idle_balance.ok()) << idle_balance.status();
  std::vector<std::string> idle_told;
  for (const auto& n : idle_balance->notices) {
    if (n.kind == "price_change") idle_told.push_back(n.message);
  }
  EXPECT_EQ(idle_told, std::vector<std::string>{
                           "the price of network volumes changes from 0.288 CNY to 0.36 CNY per "
                           "GiB-month at " +
                           absl::FormatTime("%Y-%m-%d %H:%M UTC", now + absl::Hours(24),
                                            absl::UTCTimeZone()) +
                           " (svctl prices)"});
  renter_balance = billing.GetBalance(renter, now);
  ASSERT_TRUE(renter_balance.ok());
  int renter_told = 0;
  for (const auto& n : renter_balance->notices) renter_told += n.kind == "price_change";
  EXPECT_EQ(renter_told, 2);
  auto prices = billing.ListPrices(now + absl::Seconds(1));
  ASSERT_TRUE(prices.ok()) << prices.status();
  std::vector<std::string> shown;
  for (const auto& p : *prices) {
    shown.push_back(absl::StrCat(p.item_kind, " ", p.item, " ", p.unit_price_micros,
                                 p.until ? " until" : ""));
  }
  EXPECT_EQ(shown, (std::vector<std::string>{
                       "gpu_minute RTX 4090 40000 until", "gpu_minute RTX 4090 50000 until",
                       "gpu_minute RTX 4090 50000", "gpu_minute * 33000",
                       "storage_gib_hour network 400 until", "storage_gib_hour network 500",
                       "storage_gib_hour node_local 200", "storage_gib_hour * 400"}));
  EXPECT_EQ((*prices)[0].from, now);
  EXPECT_EQ((*prices)[0].until, now + absl::Hours(48));
  // Two days on, the scheduled price is the one in effect, then its
  // repetition at 72 h.
  prices = billing.ListPrices(now + absl::Hours(49));
  ASSERT_TRUE(prices.ok());
  ASSERT_EQ(prices->size(), 6u);
  EXPECT_EQ((*prices)[0].unit_price_micros, 50'000);
  EXPECT_EQ((*prices)[0].until, now + absl::Hours(72));
  EXPECT_EQ((*prices)[2].item, "*");
}

TEST_F(BillingTest, TopUpIdempotency) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("topup");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-7", 5 * kMicrosPerYuan, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-7", 5 * kMicrosPerYuan, clock_.Now()).ok());
  auto clash = billing.TopUp(tenant, "pay-7", 6 * kMicrosPerYuan, clock_.Now());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReasonOf(clash.status()), "IDEMPOTENCY_KEY_REUSED");
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->paid_micros, 5 * kMicrosPerYuan);
  EXPECT_EQ(billing.TopUp(tenant, "", 1, clock_.Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(billing.TopUp(tenant, "pay-8", 0, clock_.Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(billing.TopUp("ten-nope", "pay-9", 1, clock_.Now()).status().code(),
            absl::StatusCode::kNotFound);
  // Another tenant's payment id is its own payment, not this one.
  auto [other, other_user] = NewTenant("topup-other");
  EXPECT_EQ(ReasonOf(billing.TopUp(other, "pay-7", 5 * kMicrosPerYuan, clock_.Now()).status()),
            "IDEMPOTENCY_KEY_REUSED");
  // A retry after the tenant went postpaid (its payment moved to the
  // receivable) is the same payment: answered with it, posted once. It
  // used to clash with itself, the destination being part of its hash.
  auto first = billing.TopUp(tenant, "pay-10", 3 * kMicrosPerYuan, clock_.Now());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 0).ok());
  auto retried = billing.TopUp(tenant, "pay-10", 3 * kMicrosPerYuan, clock_.Now());
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->id, first->id);
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->receivable_micros, 8 * kMicrosPerYuan);
}

// Operators give credit and refund top-ups through the ledger (until
// 2026-12-06 only raw SQL could): each is a transfer with a reason the
// tenant is shown, idempotent by its id, and never more than the rules
// allow: a refund never exceeds its top-up, what the wallet still holds,
// or a postpaid tenant's credit limit, and a payment is refunded once.
TEST_F(BillingTest, CreditsAndTopUpRefunds) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("refunds");
  auto [other, other_user] = NewTenant("bystander");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-r1", 100 * kMicrosPerYuan, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(other, "pay-o1", 7 * kMicrosPerYuan, clock_.Now()).ok());

  // A credit: paid wallet up, a notice with the reason, a replay is a no-op.
  auto credit = billing.IssueCredit(tenant, "inc-42", 5 * kMicrosPerYuan,
                                    "outage of pod 3 on 2026-12-01", "usr-op", clock_.Now());
  ASSERT_TRUE(credit.ok()) << credit.status();
  EXPECT_EQ(credit->kind, "credit");
  EXPECT_EQ(credit->tenant_delta_micros, 5 * kMicrosPerYuan);
  EXPECT_EQ(credit->reason, "outage of pod 3 on 2026-12-01");
  auto replay = billing.IssueCredit(tenant, "inc-42", 5 * kMicrosPerYuan,
                                    "outage of pod 3 on 2026-12-01", "usr-op", clock_.Now());
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->id, credit->id);
  for (auto [t, amount, reason] :
       {std::tuple{tenant, 6 * kMicrosPerYuan, "outage of pod 3 on 2026-12-01"},
        std::tuple{tenant, 5 * kMicrosPerYuan, "another reason"},
        std::tuple{other, 5 * kMicrosPerYuan, "outage of pod 3 on 2026-12-01"}}) {
    auto clash = billing.IssueCredit(t, "inc-42", amount, reason, "usr-op", clock_.Now());
    EXPECT_EQ(ReasonOf(clash.status()), "IDEMPOTENCY_KEY_REUSED") << clash.status();
  }
  EXPECT_EQ(ReasonOf(billing.IssueCredit(tenant, "inc-43", 1, "", "usr-op", clock_.Now())
                         .status()),
            "INVALID_REASON");
  EXPECT_EQ(ReasonOf(billing.IssueCredit(tenant, "inc-43", 1, "two\nlines", "usr-op",
                                         clock_.Now()).status()),
            "INVALID_REASON");
  EXPECT_EQ(ReasonOf(billing.IssueCredit(tenant, "inc-43", 0, "x", "usr-op", clock_.Now())
                         .status()),
            "INVALID_AMOUNT");
  EXPECT_EQ(billing.IssueCredit("ten-nope", "inc-44", 1, "x", "usr-op", clock_.Now())
                .status().code(),
            absl::StatusCode::kNotFound);
  auto balance = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(balance.ok());
  EXPECT_EQ(balance->paid_micros, 105 * kMicrosPerYuan);
  bool credit_notice = false;
  for (const auto& n : balance->notices) {
    if (n.kind == "credit" &&
        n.message == "a credit of 5.00 CNY was added to the paid wallet: outage of pod 3 "
                     "on 2026-12-01") {
      credit_notice = true;
    }
  }
  EXPECT_TRUE(credit_notice);

  // Refunds: part of a payment, once; never another tenant's payment, never
  // more than the top-up.
  EXPECT_EQ(ReasonOf(billing.RefundTopUp(tenant, "pay-o1", 0, "x", "usr-op", clock_.Now())
                         .status()),
            "TOPUP_NOT_FOUND");
  EXPECT_EQ(ReasonOf(billing.RefundTopUp(tenant, "pay-r1", 101 * kMicrosPerYuan, "x",
                                         "usr-op", clock_.Now()).status()),
            "REFUND_ABOVE_TOPUP");
  auto refund = billing.RefundTopUp(tenant, "pay-r1", 30 * kMicrosPerYuan,
                                    "entered 130 instead of 100", "usr-op", clock_.Now());
  ASSERT_TRUE(refund.ok()) << refund.status();
  EXPECT_EQ(refund->kind, "topup_refund");
  EXPECT_EQ(refund->tenant_delta_micros, -30 * kMicrosPerYuan);
  EXPECT_EQ(billing.RefundTopUp(tenant, "pay-r1", 30 * kMicrosPerYuan,
                                "entered 130 instead of 100", "usr-op", clock_.Now())
                ->id,
            refund->id);
  EXPECT_EQ(ReasonOf(billing.RefundTopUp(tenant, "pay-r1", 0, "entered 130 instead of 100",
                                         "usr-op", clock_.Now()).status()),
            "IDEMPOTENCY_KEY_REUSED");
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->paid_micros, 75 * kMicrosPerYuan);
  // The tenant's statement carries the reasons.
  auto statement = billing.ListTransfers(tenant, {.limit = 100});
  ASSERT_TRUE(statement.ok()) << statement.status();
  std::map<std::string, std::string> reasons;
  for (const auto& t : *statement) reasons[t.kind] = t.reason;
  EXPECT_EQ(reasons["credit"], "outage of pod 3 on 2026-12-01");
  EXPECT_EQ(reasons["topup_refund"], "entered 130 instead of 100");
  EXPECT_EQ(reasons["topup"], "");

  // Never more than the wallet holds: 8 GPUs for an hour spend the trial
  // and about 6 CNY of the 7 paid.
  const std::string id = Run(other, 8);
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  const int64_t left = billing.GetBalance(other, clock_.Now())->paid_micros;
  ASSERT_GT(left, 0);
  ASSERT_LT(left, 7 * kMicrosPerYuan);
  auto spent = billing.RefundTopUp(other, "pay-o1", 0, "tenant leaves", "usr-op", clock_.Now());
  EXPECT_EQ(ReasonOf(spent.status()), "REFUND_EXCEEDS_BALANCE") << spent.status();
  EXPECT_NE(spent.status().message().find("refund at most " + Yuan(left)), std::string::npos)
      << spent.status();
  auto rest = billing.RefundTopUp(other, "pay-o1", left, "tenant leaves", "usr-op",
                                  clock_.Now());
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(billing.GetBalance(other, clock_.Now())->paid_micros, 0);

  // Postpaid: a credit lowers what is owed; a refund raises it, within the
  // credit limit.
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 50 * kMicrosPerYuan).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-r2", 20 * kMicrosPerYuan, clock_.Now()).ok());
  auto postpaid_credit = billing.IssueCredit(tenant, "inc-45", 2 * kMicrosPerYuan, "goodwill",
                                             "usr-op", clock_.Now());
  ASSERT_TRUE(postpaid_credit.ok()) << postpaid_credit.status();
  EXPECT_EQ(postpaid_credit->to_kind, "receivable");
  auto before = billing.GetBalance(tenant, clock_.Now());
  ASSERT_EQ(before->receivable_micros, 97 * kMicrosPerYuan);  // 75 moved, 20 paid, 2 given.
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 0).ok());
  ASSERT_TRUE(billing.RefundTopUp(tenant, "pay-r2", 0, "paid twice", "usr-op", clock_.Now())
                  .ok());
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->receivable_micros, 77 * kMicrosPerYuan);

  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->credits_micros, 7 * kMicrosPerYuan);
  EXPECT_EQ(summary->topup_refunds_micros, 30 * kMicrosPerYuan + left + 20 * kMicrosPerYuan);
  EXPECT_EQ(summary->topups_micros, 127 * kMicrosPerYuan);
  ExpectAuditClean(billing);
  // The auditor checks each refund against its top-up.
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec("ALTER TABLE ledger_transfers DISABLE TRIGGER USER");
    txn.exec("UPDATE ledger_transfers SET idempotency_key = 'topup-refund:pay-none' "
             "WHERE idempotency_key = 'topup-refund:pay-r2'");
    txn.exec("ALTER TABLE ledger_transfers ENABLE TRIGGER USER");
    return absl::OkStatus();
  }).ok());
  auto failures = billing.Audit();
  ASSERT_TRUE(failures.ok());
  ASSERT_EQ(failures->size(), 1u);
  EXPECT_NE((*failures)[0].find("topup-refund:pay-none"), std::string::npos) << (*failures)[0];
}

// A change of billing mode takes the tenant's money along: the paid wallet
// of a prepaid tenant made postpaid goes into its receivable and pays the
// charges before any debt is run up; going back to prepaid takes what the
// receivable holds into the paid wallet. A debt is not moved: the tenant
// stays postpaid, and loses nothing, until it is paid.
TEST_F(BillingTest, BillingModeSwitchMovesTheBalance) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("switcher");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-s1", 100 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 8);
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto prepaid = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(prepaid.ok()) << prepaid.status();
  ASSERT_EQ(prepaid->trial_micros, 0);  // 10 CNY of trial is 38 minutes of 8 GPUs.
  ASSERT_GT(prepaid->paid_micros, 0);
  ASSERT_LT(prepaid->paid_micros, 100 * kMicrosPerYuan);

  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 50 * kMicrosPerYuan).ok());
  auto postpaid = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(postpaid->mode, BillingMode::kPostpaid);
  EXPECT_EQ(postpaid->paid_micros, 0);
  EXPECT_EQ(postpaid->receivable_micros, prepaid->paid_micros);
  EXPECT_EQ(postpaid->available_micros, prepaid->paid_micros + 50 * kMicrosPerYuan);
  // A limit past 1,000,000,000 CNY is refused and changes nothing. INT64_MAX
  // used to be taken, and the metering statement, which covers every
  // tenant, overflowed (22003) on every run: nobody was billed.
  auto unbounded = billing.SetBillingMode(tenant, BillingMode::kPostpaid,
                                          std::numeric_limits<int64_t>::max());
  EXPECT_EQ(unbounded.code(), absl::StatusCode::kInvalidArgument) << unbounded;
  EXPECT_EQ(ReasonOf(unbounded), "INVALID_CREDIT_LIMIT");
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->credit_limit_micros, 50 * kMicrosPerYuan);
  ASSERT_TRUE(billing
                  .SetBillingMode(tenant, BillingMode::kPostpaid,
                                  1'000'000'000 * kMicrosPerYuan)
                  .ok());
  EXPECT_TRUE(billing.RunOnce(clock_.Now()).ok());
  // Setting the mode it has (a new limit) moves nothing.
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 60 * kMicrosPerYuan).ok());
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->receivable_micros, prepaid->paid_micros);

  // The next hour is paid from the moved money.
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto spent = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(spent->paid_micros, 0);
  EXPECT_EQ(spent->receivable_micros, prepaid->paid_micros - 60 * 8 * kPrice);

  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPrepaid, 0).ok());
  auto back = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(back->mode, BillingMode::kPrepaid);
  EXPECT_EQ(back->receivable_micros, 0);
  EXPECT_EQ(back->paid_micros, spent->receivable_micros);

  // Both moves are in the tenant's statement, as neither a payment nor a
  // charge.
  auto moves = billing.ListTransfers(tenant, {.kind = "balance_move", .limit = 10});
  ASSERT_TRUE(moves.ok()) << moves.status();
  ASSERT_EQ(moves->size(), 2u);
  EXPECT_EQ((*moves)[0].from_kind, "paid_wallet");
  EXPECT_EQ((*moves)[0].to_kind, "receivable");
  EXPECT_EQ((*moves)[0].amount_micros, prepaid->paid_micros);
  EXPECT_EQ((*moves)[1].from_kind, "receivable");
  EXPECT_EQ((*moves)[1].to_kind, "paid_wallet");
  for (const auto& move : *moves) EXPECT_EQ(move.tenant_delta_micros, 0);

  // A tenant in debt cannot go back to prepaid, and nothing moves.
  Stop(tenant, id);
  auto [debtor, debtor_user] = NewTenant("debtor");
  ASSERT_TRUE(billing.SetBillingMode(debtor, BillingMode::kPostpaid, 50 * kMicrosPerYuan).ok());
  const std::string debt_id = Run(debtor, 8);
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  Stop(debtor, debt_id);
  auto owing = billing.GetBalance(debtor, clock_.Now());
  ASSERT_LT(owing->receivable_micros, 0);
  auto refused = billing.SetBillingMode(debtor, BillingMode::kPrepaid, 0);
  EXPECT_EQ(ReasonOf(refused), "CREDIT_LIMIT_BELOW_DEBT");
  auto unchanged = billing.GetBalance(debtor, clock_.Now());
  EXPECT_EQ(unchanged->mode, BillingMode::kPostpaid);
  EXPECT_EQ(unchanged->receivable_micros, owing->receivable_micros);
  EXPECT_EQ(unchanged->credit_limit_micros, 50 * kMicrosPerYuan);
  // Paid, and 5 CNY more: the 5 CNY go to the paid wallet.
  ASSERT_TRUE(billing
                  .TopUp(debtor, "pay-d1", -owing->receivable_micros + 5 * kMicrosPerYuan,
                         clock_.Now())
                  .ok());
  ASSERT_TRUE(billing.SetBillingMode(debtor, BillingMode::kPrepaid, 0).ok());
  auto settled = billing.GetBalance(debtor, clock_.Now());
  EXPECT_EQ(settled->receivable_micros, 0);
  EXPECT_EQ(settled->paid_micros, 5 * kMicrosPerYuan);
  ExpectAuditClean(billing);
}

// Two billers (two svd replicas) and concurrent top-ups on a tenant close to
// empty: no minute is charged twice and no wallet goes negative.
TEST_F(BillingTest, ConcurrentSpendingNeverNegative) {
  Billing a = MakeBilling();
  Billing b = MakeBilling();
  auto [tenant, user] = NewTenant("spender");
  ASSERT_TRUE(a.TopUp(tenant, "seed", 2 * kMicrosPerYuan, clock_.Now()).ok());
  for (int i = 0; i < 4; ++i) Run(tenant, 8);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int round = 0; round < 6; ++round) {
    clock_.Advance(absl::Minutes(1));
    const absl::Time now = clock_.Now();
    threads.emplace_back([&, now] { if (!a.RunOnce(now).ok()) ++failures; });
    threads.emplace_back([&, now] { if (!b.RunOnce(now).ok()) ++failures; });
    threads.emplace_back([&, now, round] {
      if (!a.TopUp(tenant, absl::StrCat("p", round), 300'000, now).ok()) ++failures;
    });
    for (auto& t : threads) t.join();
    threads.clear();
    auto balance = a.GetBalance(tenant, now);
    EXPECT_GE(balance->paid_micros, 0);
    EXPECT_GE(balance->trial_micros, 0);
  }
  EXPECT_EQ(failures.load(), 0);
  ExpectAuditClean(a);
}

// A postpaid tenant's charges go to its receivable; the invoice of a
// Shanghai calendar month totals exactly the ledger's charges for that
// month, is issued once and cannot be changed.
TEST_F(BillingTest, PostpaidInvoiceEqualsLedger) {
  Billing billing = MakeBilling();
  // 2026-11-30 23:00 Shanghai is 15:00 UTC; the instance runs into December.
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 11, 30, 14, 0, 10), absl::UTCTimeZone()));
  auto [tenant, user] = NewTenant("enterprise");
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid,
                                     100'000 * kMicrosPerYuan).ok());
  const std::string id = Run(tenant, 3);
  // A 100 GiB network disk from the same instant: storage is charged to the
  // receivable too and must be invoiced (400 micro-yuan per GiB-hour).
  NetworkVolume("vol-inv", tenant, 100);
  clock_.Advance(absl::Hours(3));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto early = billing.IssueInvoice(tenant, clock_.Now(), clock_.Now());
  EXPECT_EQ(ReasonOf(early.status()), "PERIOD_NOT_BILLED");
  const absl::Time month = absl::FromCivil(absl::CivilSecond(2026, 11, 15, 0, 0, 0),
                                           absl::UTCTimeZone());
  auto invoice = billing.IssueInvoice(tenant, month, clock_.Now());
  ASSERT_TRUE(invoice.ok()) << invoice.status();
  EXPECT_EQ(invoice->period, "2026-11");
  // November in Shanghai ends at 16:00 UTC on the 30th: 1 h 59 min 50 s of
  // running, i.e. 120 started minutes of 3 GPUs, less the 10 CNY trial
  // (spent first and not invoiced).
  // The disk: 120 minutes (14:00 to 15:59 UTC, two whole clock hours) of
  // 100 GiB at 400 per GiB-hour. The trial pays for the first minutes of
  // both, so only the total is fixed, not how it splits between the lines.
  const int64_t expected = 120 * 3 * kPrice + 2 * 100 * 400 - 10 * kMicrosPerYuan;
  EXPECT_EQ(invoice->total_micros, expected);
  ASSERT_EQ(invoice->lines.size(), 2u);
  EXPECT_EQ(invoice->lines[0].kind, "usage");
  EXPECT_EQ(invoice->lines[0].instance_id, id);
  EXPECT_GT(invoice->lines[0].gpu_minutes, 0);
  EXPECT_EQ(invoice->lines[1].kind, "storage");
  EXPECT_GT(invoice->lines[1].amount_micros, 0);
  EXPECT_EQ(invoice->lines[0].amount_micros + invoice->lines[1].amount_micros, expected);
  EXPECT_EQ(invoice->total_fen, RoundToFen(invoice->lines[0].amount_micros) +
                                    RoundToFen(invoice->lines[1].amount_micros));
  int64_t ledger = 0;
  for (const std::string kind : {"charge", "storage"}) {
    // Hold the result: iterating *ListTransfers(...) directly would read a
    // destroyed temporary (ASan: stack-use-after-scope).
    auto transfers = billing.ListTransfers(tenant, {.kind = kind, .limit = 1000});
    ASSERT_TRUE(transfers.ok()) << transfers.status();
    for (const auto& t : *transfers) {
      if (*t.usage_minute < MinuteOf(invoice->period_end) && t.from_kind == "receivable") {
        ledger += t.amount_micros;
      }
    }
  }
  EXPECT_EQ(invoice->total_micros, ledger);
  // Nothing was owed before November: the total is due. December's hour,
  // already charged to the receivable, is not in it.
  EXPECT_EQ(invoice->carried_micros, 0);
  EXPECT_EQ(invoice->amount_due_micros, expected);
  EXPECT_EQ(invoice->amount_due_fen, invoice->total_fen);
  auto balance = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(balance->receivable_micros,
            -(180 * 3 * kPrice - 10 * kMicrosPerYuan + 3 * 100 * 400));
  // Issued once; immutable.
  auto again = billing.IssueInvoice(tenant, month, clock_.Now());
  EXPECT_EQ(again->id, invoice->id);
  absl::Status edit = db_->Transact([&](pqxx::work& txn) {
    txn.exec("UPDATE invoices SET total_micros = 0");
    return absl::OkStatus();
  });
  EXPECT_FALSE(edit.ok());

  // Listed newest period first, a page at a time (ids are random, so not
  // in id order); a token that is not one of the tenant's invoices is
  // refused.
  for (int month_of_year : {9, 10}) {
    ASSERT_TRUE(billing
                    .IssueInvoice(tenant,
                                  absl::FromCivil(absl::CivilSecond(2026, month_of_year, 15, 0, 0, 0),
                                                  absl::UTCTimeZone()),
                                  clock_.Now())
                    .ok());
  }
  auto first = billing.ListInvoices(tenant, "", 2);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].period, "2026-11");
  EXPECT_EQ((*first)[1].period, "2026-10");
  auto rest = billing.ListInvoices(tenant, (*first)[1].id, 2);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ((*rest)[0].period, "2026-09");
  auto bad = billing.ListInvoices(tenant, "inv-notours", 2);
  EXPECT_EQ(ReasonOf(bad.status()), "INVALID_PAGE_TOKEN");
  ExpectAuditClean(billing);
}

// An SLA refund goes back where the hour's rent came from, in the same
// shares: the part of the rent paid with trial credit comes back as trial
// credit (which expires with the grant), the rest to the paid wallet. Once
// every grant has expired, the trial part goes to the promotion expense,
// as the expiry took the rest of that credit. Before, the whole refund
// went to the paid wallet: free credit came back as paid credit, which
// never expires and pays app fees.
TEST_F(BillingTest, SlaRefundsGoBackWhereTheRentCameFrom) {
  BillingOptions options;
  options.trial_validity = absl::Hours(2);
  Billing billing = MakeBilling(options);
  auto [tenant, user] = NewTenant("refunded");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());  // 10 CNY
  ASSERT_TRUE(billing.TopUp(tenant, "pay-sla", 20 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 8);
  const int64_t minute = absl::ToUnixSeconds(clock_.Now()) / 3600 * 60;
  // An hour spends the trial credit and some of the paid (the refunds
  // below give back less than the trial paid, as the judge's do).
  clock_.Advance(absl::Hours(1));
  Stop(tenant, id);
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto post = [&](const std::string& metric, int64_t amount, int64_t rent, int64_t trial_rent)
      -> absl::StatusOr<std::vector<PostedRefund>> {
    absl::StatusOr<std::vector<PostedRefund>> posted;
    absl::Status status = db_->Transact([&](pqxx::work& txn) -> absl::Status {
      posted = PostSlaRefunds(txn,
                              {{absl::StrCat("sla:", id, ":", minute / 60, ":", metric), tenant,
                                id, minute, amount, rent, trial_rent}},
                              clock_.Now());
      return posted.status();
    });
    if (!status.ok()) return status;
    return posted;
  };
  auto legs = [&](const std::string& metric) {
    std::vector<TransferRecord> out;
    auto all = billing.ListTransfers(tenant, {.kind = "sla_refund", .instance_id = id});
    EXPECT_TRUE(all.ok()) << all.status();
    for (const auto& t : *all) {
      if (absl::EndsWith(t.idempotency_key, ":" + metric)) out.push_back(t);
    }
    return out;
  };
  const auto before = billing.GetBalance(tenant, clock_.Now());
  ASSERT_TRUE(before.ok()) << before.status();

  // 15.84 CNY of rent, 10 of it from trial credit: 1.584 CNY back, 1 CNY
  // of it as trial credit.
  auto mixed = post("gpu_usable", 1'584'000, 15'840'000, 10'000'000);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  auto mixed_legs = legs("gpu_usable");
  ASSERT_EQ(mixed_legs.size(), 2u);
  EXPECT_EQ(mixed_legs[0].leg, 0);
  EXPECT_EQ(mixed_legs[0].to_kind, "paid_wallet");
  EXPECT_EQ(mixed_legs[0].amount_micros, 584'000);
  EXPECT_EQ(mixed_legs[0].id, (*mixed)[0].transfer_id);  // The verdict links leg 0.
  EXPECT_EQ(mixed_legs[1].leg, 1);
  EXPECT_EQ(mixed_legs[1].to_kind, "trial_wallet");
  EXPECT_EQ(mixed_legs[1].amount_micros, 1'000'000);
  auto after = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(after->paid_micros, before->paid_micros + 584'000);
  EXPECT_EQ(after->trial_micros, before->trial_micros + 1'000'000);

  // Posting it again is a replay of leg 0; other shares under the same key
  // are refused and write nothing.
  auto replay = post("gpu_usable", 1'584'000, 15'840'000, 10'000'000);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_TRUE((*replay)[0].replay);
  EXPECT_EQ((*replay)[0].transfer_id, (*mixed)[0].transfer_id);
  EXPECT_EQ(ReasonOf(post("gpu_usable", 1'584'000, 15'840'000, 0).status()),
            "IDEMPOTENCY_KEY_REUSED");
  EXPECT_EQ(ReasonOf(post("gpu_usable", 1'584'000, 15'840'000, 15'840'000).status()),
            "IDEMPOTENCY_KEY_REUSED");
  EXPECT_EQ(legs("gpu_usable").size(), 2u);

  // Rent paid with trial credit alone: one leg, to the trial wallet.
  ASSERT_TRUE(post("storage_write", 528'000, 5'280'000, 5'280'000).ok());
  auto trial_only = legs("storage_write");
  ASSERT_EQ(trial_only.size(), 1u);
  EXPECT_EQ(trial_only[0].leg, 0);
  EXPECT_EQ(trial_only[0].to_kind, "trial_wallet");
  EXPECT_EQ(trial_only[0].amount_micros, 528'000);

  // After the grant expired: the trial part to the promotion expense; the
  // tenant's trial wallet stays empty.
  clock_.Advance(absl::Hours(3));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ASSERT_EQ(billing.GetBalance(tenant, clock_.Now())->trial_micros, 0);
  const int64_t paid = billing.GetBalance(tenant, clock_.Now())->paid_micros;
  ASSERT_TRUE(post("network_latency", 100'000, 1'000'000, 250'000).ok());
  auto expired = legs("network_latency");
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].to_kind, "paid_wallet");
  EXPECT_EQ(expired[0].amount_micros, 75'000);
  EXPECT_EQ(expired[1].to_kind, "promotion_expense");
  EXPECT_EQ(expired[1].amount_micros, 25'000);
  EXPECT_EQ(expired[1].tenant_delta_micros, 0);
  after = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(after->trial_micros, 0);
  EXPECT_EQ(after->paid_micros, paid + 75'000);
  // The operators' dashboard: three refunds (not five legs), and only the
  // 659,000 paid as money taken off the net revenue.
  store::DashboardStore dashboard(*db_);
  auto by_metric = dashboard.SlaRefundsByMetric(absl::UnixEpoch(), clock_.Now() + absl::Hours(1));
  ASSERT_TRUE(by_metric.ok()) << by_metric.status();
  int64_t count = 0, refunded = 0;
  for (const auto& m : *by_metric) count += m.refund_count, refunded += m.amount_micros;
  EXPECT_EQ(count, 3);
  EXPECT_EQ(refunded, 2'212'000);
  auto points = dashboard.RevenueSeries(absl::UnixEpoch() + absl::Hours(24 * 365 * 50),
                                        clock_.Now() + absl::Hours(1), false);
  ASSERT_TRUE(points.ok()) << points.status();
  int64_t all = 0, trial = 0;
  for (const auto& p : *points) all += p.sla_refunds_micros, trial += p.sla_refunds_trial_micros;
  EXPECT_EQ(all, 2'212'000);
  EXPECT_EQ(all - trial, 659'000);
  ExpectAuditClean(billing);
}

// Trial credit given back expires with the grant, all of it. An SLA
// refund of an hour's trial-paid rent on top of an adjustment that gave
// back some of that rent can leave more in the trial wallet than was
// granted; the expiry used to take at most the grant and left the rest
// in the wallet for good (here 0.5 CNY).
TEST_F(BillingTest, TrialExpiryTakesTrialCreditGivenBack) {
  BillingOptions options;
  options.trial_validity = absl::Hours(2);
  Billing billing = MakeBilling(options);
  auto [tenant, user] = NewTenant("given-back");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());  // 10 CNY
  const int64_t minute = absl::ToUnixSeconds(clock_.Now()) / 60;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) -> absl::Status {
                   return PostSlaRefunds(txn,
                                         {{"sla:given-back:gpu_usable", tenant, "", minute,
                                           500'000, 5'000'000, 5'000'000}},
                                         clock_.Now())
                       .status();
                 }).ok());
  ASSERT_EQ(billing.GetBalance(tenant, clock_.Now())->trial_micros, 10'500'000);
  clock_.Advance(absl::Hours(3));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->trial_micros, 0);
  auto expiry = billing.ListTransfers(tenant, {.kind = "trial_expiry"});
  ASSERT_TRUE(expiry.ok()) << expiry.status();
  ASSERT_EQ(expiry->size(), 1u);
  EXPECT_EQ((*expiry)[0].amount_micros, 10'500'000);
  ExpectAuditClean(billing);
}

TEST(SlaRefundSharesTest, TrialPartIsTheTrialShareRoundedDown) {
  EXPECT_EQ(TrialPartOfRefund(1'584'000, 15'840'000, 10'000'000), 1'000'000);
  EXPECT_EQ(TrialPartOfRefund(100, 3, 1), 33);  // The paid part takes the rest.
  EXPECT_EQ(TrialPartOfRefund(100, 100, 0), 0);
  EXPECT_EQ(TrialPartOfRefund(100, 100, 100), 100);
  EXPECT_EQ(TrialPartOfRefund(100, 0, 0), 0);
  // No overflow where refund x trial rent passes 2^63.
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(TrialPartOfRefund(big, 4 * big, 2 * big), big / 2);
}

// An invoice says what is due, not only what the month cost: paid credit
// moved to the receivable by the switch to postpaid is taken off the first
// invoice, and what the tenant left unpaid of it is carried into the next.
// Before, both invoices said only their month's total: the tenant would
// have paid 100 CNY it had already paid, and the 18.40 CNY it still owed
// appeared on no invoice.
TEST_F(BillingTest, InvoiceSaysWhatIsDue) {
  Billing billing = MakeBilling();
  // 14:00 Shanghai on 31 October; October ends at 16:00 UTC.
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 10, 31, 6, 0, 10), absl::UTCTimeZone()));
  auto [tenant, user] = NewTenant("carried");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());  // 10 CNY, not invoiced
  ASSERT_TRUE(billing.TopUp(tenant, "pay-ahead", 100 * kMicrosPerYuan, clock_.Now()).ok());
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 1'000 * kMicrosPerYuan)
                  .ok());  // The 100 CNY move to the receivable.
  const std::string id = Run(tenant, 8);
  // 600 minutes of October and 30 of November (stopped at 16:30:00).
  clock_.Advance(absl::Hours(10) + absl::Minutes(29) + absl::Seconds(50));
  Stop(tenant, id);
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  // The invoice of a month of 2026, issued now.
  auto issue = [&](int month) {
    return billing.IssueInvoice(
        tenant, absl::FromCivil(absl::CivilDay(2026, month, 15), absl::UTCTimeZone()),
        clock_.Now());
  };
  auto first = issue(10);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->total_micros, 600 * 8 * kPrice - 10 * kMicrosPerYuan);  // 148.40 CNY
  EXPECT_EQ(first->carried_micros, -100 * kMicrosPerYuan);
  EXPECT_EQ(first->amount_due_micros, 48'400'000);
  EXPECT_EQ(first->carried_fen, -10'000);
  EXPECT_EQ(first->amount_due_fen, 4'840);

  // The tenant pays 30 CNY of it.
  ASSERT_TRUE(billing.TopUp(tenant, "pay-part", 30 * kMicrosPerYuan, clock_.Now()).ok());
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 11, 30, 16, 30, 0), absl::UTCTimeZone()));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto second = issue(11);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->total_micros, 30 * 8 * kPrice);  // 7.92 CNY
  EXPECT_EQ(second->carried_micros, 18'400'000);     // October, not paid yet.
  EXPECT_EQ(second->amount_due_micros, 30 * 8 * kPrice + 18'400'000);
  EXPECT_EQ(second->amount_due_fen, 792 + 1'840);
  // Nothing after November touched the receivable: what is due is what
  // it owes.
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->receivable_micros,
            -*second->amount_due_micros);
  // Read back as issued.
  auto listed = billing.ListInvoices(tenant, "", 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].amount_due_micros, second->amount_due_micros);
  EXPECT_EQ((*listed)[1].carried_fen, -10'000);

  // Paid in full and ahead: the next invoice is in credit, nothing due.
  ASSERT_TRUE(billing.TopUp(tenant, "pay-rest", 50 * kMicrosPerYuan, clock_.Now()).ok());
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 12, 31, 16, 30, 0), absl::UTCTimeZone()));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto third = issue(12);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->total_micros, 0);
  EXPECT_EQ(third->carried_micros, -(50 * kMicrosPerYuan - 30 * 8 * kPrice - 18'400'000));
  EXPECT_EQ(third->amount_due_micros, 0);
  EXPECT_EQ(third->amount_due_fen, 0);

  // The operators' list: every invoice of the filter, newest first, a page
  // at a time, with the totals of the whole filter.
  auto all = billing.ListAllInvoices({.tenant_id = tenant, .limit = 2});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->invoices.size(), 2u);
  EXPECT_EQ(all->invoices[0].tenant_name, "carried");
  EXPECT_EQ(all->invoices[0].invoice.period, "2026-12");
  EXPECT_TRUE(all->invoices[0].invoice.lines.empty());
  EXPECT_EQ(all->count, 3);
  EXPECT_EQ(all->total_micros, first->total_micros + second->total_micros);
  EXPECT_EQ(all->amount_due_micros, 48'400'000 + 26'320'000);
  auto rest = billing.ListAllInvoices({.tenant_id = tenant,
                                       .after_id = all->invoices[1].invoice.id, .limit = 2});
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->invoices.size(), 1u);
  EXPECT_EQ(rest->invoices[0].invoice.period, "2026-10");
  auto november_only = billing.ListAllInvoices({.period = "2026-11"});
  ASSERT_TRUE(november_only.ok()) << november_only.status();
  ASSERT_EQ(november_only->invoices.size(), 1u);
  EXPECT_EQ(november_only->invoices[0].invoice.id, second->id);
  EXPECT_EQ(november_only->amount_due_micros, 26'320'000);
  for (const std::string bad : {"2026-13", "2026-1", "november", "2026-11-01"}) {
    EXPECT_EQ(ReasonOf(billing.ListAllInvoices({.period = bad}).status()), "INVALID_PERIOD")
        << bad;
  }
  EXPECT_EQ(ReasonOf(billing.ListAllInvoices({.tenant_id = "ten-nope"}).status()),
            "TENANT_NOT_FOUND");
  EXPECT_EQ(ReasonOf(billing.ListAllInvoices({.period = "2026-10", .after_id = second->id})
                         .status()),
            "INVALID_PAGE_TOKEN");
  ExpectAuditClean(billing);
}

// A tenant prepaid for part of the month and postpaid for the rest: the
// invoice bills what the receivable was charged, less what was refunded
// to the receivable. An SLA refund paid into the paid wallet while the
// tenant was prepaid is the tenant's already, and is not taken off the
// invoice a second time. The refunds of the month's last hour are posted
// after metering has passed the month's end, so the invoice waits for the
// SLA judge's cursor (as in svd) and has them.
TEST_F(BillingTest, InvoiceHasTheMonthsRefundsToTheReceivable) {
  BillingOptions options;
  options.invoices_wait_for_sla_judge = true;
  Billing billing = MakeBilling(options);
  // 22:00 Shanghai on 30 November; the month ends at 16:00 UTC.
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 11, 30, 14, 0, 10), absl::UTCTimeZone()));
  const absl::Time month_end =
      absl::FromCivil(absl::CivilSecond(2026, 11, 30, 16, 0, 0), absl::UTCTimeZone());
  auto [tenant, user] = NewTenant("midmonth");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-mid", 100 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 8);
  // What the judge does for an hour: post its refunds, move its cursor.
  auto judge = [&](absl::Time hour_start, int64_t amount) {
    ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) -> absl::Status {
                     SV_RETURN_IF_ERROR(
                         PostSlaRefunds(txn,
                                        {{absl::StrCat("sla:", id, ":",
                                                       absl::ToUnixSeconds(hour_start),
                                                       ":gpu_utilization"),
                                          tenant, id, absl::ToUnixSeconds(hour_start) / 60,
                                          amount}},
                                        clock_.Now())
                             .status());
                     store::SlaStore::SetCursor(txn, hour_start + absl::Hours(1), clock_.Now());
                     return absl::OkStatus();
                   }).ok());
  };
  clock_.Advance(absl::Minutes(70));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  judge(month_end - absl::Hours(2), 2 * kMicrosPerYuan);  // Prepaid: into the paid wallet.
  ASSERT_EQ(billing.GetBalance(tenant, clock_.Now())->receivable_micros, 0);
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 1'000 * kMicrosPerYuan)
                  .ok());
  clock_.Advance(absl::Minutes(80));  // 16:30:10 UTC: metering is past the end.
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto listed = billing.ListInvoices(tenant, "", 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  const absl::Time month = absl::FromCivil(absl::CivilSecond(2026, 11, 15, 0, 0, 0),
                                           absl::UTCTimeZone());
  EXPECT_EQ(ReasonOf(billing.IssueInvoice(tenant, month, clock_.Now()).status()),
            "PERIOD_NOT_JUDGED");
  // Operators see the hold, and for how long, not only the judge's errors.
  auto gauge = [](const std::string& name) {
    const std::string text = metrics::Registry::Default().Render();
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? std::string("absent")
                                   : text.substr(at + name.size() + 2,
                                                 text.find('\n', at + 1) - at - name.size() - 2);
  };
  EXPECT_EQ(gauge("sv_invoices_held_by_sla_judge"), "1");
  EXPECT_EQ(gauge("sv_invoice_hold_seconds"), "1810");
  clock_.Advance(absl::Minutes(40));
  judge(month_end - absl::Hours(1), 3 * kMicrosPerYuan);  // Postpaid: into the receivable.
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  EXPECT_EQ(gauge("sv_invoices_held_by_sla_judge"), "0");
  EXPECT_EQ(gauge("sv_invoice_hold_seconds"), "0");
  listed = billing.ListInvoices(tenant, "", 10);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  const Invoice& invoice = listed->front();
  EXPECT_EQ(invoice.period, "2026-11");
  int64_t refunded = 0;
  for (const auto& line : invoice.lines) {
    if (line.kind == "sla_refund") refunded += line.amount_micros;
  }
  EXPECT_EQ(refunded, -3 * kMicrosPerYuan);
  // The invoice is the receivable's side of the month in the ledger.
  int64_t ledger = 0;
  for (const std::string kind : {"charge", "sla_refund"}) {
    auto transfers = billing.ListTransfers(tenant, {.kind = kind, .limit = 1000});
    ASSERT_TRUE(transfers.ok()) << transfers.status();
    for (const auto& t : *transfers) {
      if (*t.usage_minute >= MinuteOf(invoice.period_end)) continue;
      if (t.from_kind == "receivable") ledger += t.amount_micros;
      if (t.to_kind == "receivable") ledger -= t.amount_micros;
    }
  }
  EXPECT_GT(ledger, 0);
  EXPECT_EQ(invoice.total_micros, ledger);
  Stop(tenant, id);
  ExpectAuditClean(billing);
}

// The monthly invoicer issues a month's invoice to every tenant that was
// postpaid at some time in it: one still postpaid, and one that went back
// to prepaid during the month (its debt must still be invoiced), but none
// to a tenant that became postpaid only after the month ended.
TEST_F(BillingTest, InvoicesGoToTenantsPostpaidInTheMonth) {
  Billing billing = MakeBilling();
  auto at = [](int month, int day) {
    return absl::FromCivil(absl::CivilSecond(2026, month, day, 12, 0, 0), absl::UTCTimeZone());
  };
  clock_.Set(at(11, 20));
  auto [always, u1] = NewTenant("always");
  auto [left, u2] = NewTenant("left");
  auto [late, u3] = NewTenant("late");
  auto [never, u4] = NewTenant("never");
  ASSERT_TRUE(billing.SetBillingMode(always, BillingMode::kPostpaid, kMicrosPerYuan).ok());
  ASSERT_TRUE(billing.SetBillingMode(left, BillingMode::kPostpaid, kMicrosPerYuan).ok());
  clock_.Set(at(11, 25));
  ASSERT_TRUE(billing.SetBillingMode(left, BillingMode::kPrepaid, 0).ok());
  // Setting the mode a tenant has keeps its postpaid start.
  ASSERT_TRUE(billing.SetBillingMode(always, BillingMode::kPostpaid, 2 * kMicrosPerYuan).ok());
  clock_.Set(at(12, 5));
  ASSERT_TRUE(billing.SetBillingMode(late, BillingMode::kPostpaid, kMicrosPerYuan).ok());
  clock_.Set(at(12, 10));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto periods = [&](const std::string& tenant) {
    std::vector<std::string> out;
    auto invoices = billing.ListInvoices(tenant, "", 10);
    EXPECT_TRUE(invoices.ok()) << invoices.status();
    if (invoices.ok()) {
      for (const auto& inv : *invoices) out.push_back(inv.period);
    }
    return out;
  };
  EXPECT_EQ(periods(always), std::vector<std::string>{"2026-11"});
  EXPECT_EQ(periods(left), std::vector<std::string>{"2026-11"});
  EXPECT_TRUE(periods(late).empty());
  EXPECT_TRUE(periods(never).empty());
}

// A volume's create or delete stamped before minutes metering has already
// charged (the time read before a pass went past it) starts or ends at the
// cursor: the charged storage and the volume's life agree. The delete used
// to keep its early time, and the minutes charged past it stayed charged
// (the auditor flagged them, nothing refunded them).
TEST_F(BillingTest, AVolumeStampedBeforeChargedMinutesStartsAndEndsAtTheCursor) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("late");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-late", 100 * kMicrosPerYuan, clock_.Now()).ok());
  store::VolumeStore volumes(*db_);
  const absl::Time t0 = clock_.Now();
  auto made = volumes.Create(tenant, {"early", 1024, store::VolumeKind::kNetwork, false, ""},
                             "v-early", "f-early", t0);
  ASSERT_TRUE(made.ok()) << made.status();
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  // Both calls read their time at t0 + 2 min, before the pass.
  auto deleted = volumes.Delete(tenant, made->record.id, t0 + absl::Minutes(2));
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  auto late = volumes.Create(tenant, {"late", 1024, store::VolumeKind::kNetwork, false, ""},
                             "v-late", "f-late", t0 + absl::Minutes(2));
  ASSERT_TRUE(late.ok()) << late.status();
  const absl::Time cursor = absl::FromUnixSeconds(absl::ToUnixSeconds(clock_.Now()) / 60 * 60);
  EXPECT_EQ(deleted->deleted_at, cursor);
  EXPECT_EQ(late->record.created_at, cursor);
  clock_.Advance(absl::Minutes(5));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ExpectAuditClean(billing);
}

// One tenant's invoice that fails for an unexpected reason holds up no
// other: the run goes on to every due tenant (the failure is logged and
// counted in sv_invoice_failures_total). The
// run used to stop at it, and as the failing tenant came first again in
// each run, the tenants after it were never invoiced.
TEST_F(BillingTest, AFailingInvoiceHoldsUpNoOtherTenant) {
  Billing billing = MakeBilling();
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 11, 20, 12, 0, 0), absl::UTCTimeZone()));
  auto [first, u1] = NewTenant("first");
  auto [second, u2] = NewTenant("second");
  ASSERT_TRUE(billing.SetBillingMode(first, BillingMode::kPostpaid, kMicrosPerYuan).ok());
  ASSERT_TRUE(billing.SetBillingMode(second, BillingMode::kPostpaid, kMicrosPerYuan).ok());
  // The tenant first in id order cannot get an invoice.
  const std::string failing = std::min(first, second);
  const std::string other = std::max(first, second);
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
                    txn.exec(
                        "CREATE FUNCTION test_refuse_invoice() RETURNS trigger AS $$ BEGIN "
                        "RAISE EXCEPTION 'no invoice for this tenant'; END $$ LANGUAGE plpgsql");
                    txn.exec(absl::StrCat(
                        "CREATE TRIGGER test_refuse_invoice BEFORE INSERT ON invoices FOR EACH "
                        "ROW WHEN (NEW.tenant_id = ",
                        txn.quote(failing), ") EXECUTE FUNCTION test_refuse_invoice()"));
                    return absl::OkStatus();
                  })
                  .ok());
  clock_.Set(absl::FromCivil(absl::CivilSecond(2026, 12, 10, 12, 0, 0), absl::UTCTimeZone()));
  // The run succeeds (its metering did); the failure is logged and counted.
  EXPECT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto invoices = billing.ListInvoices(other, "", 10);
  ASSERT_TRUE(invoices.ok()) << invoices.status();
  ASSERT_EQ(invoices->size(), 1u);
  EXPECT_EQ((*invoices)[0].period, "2026-11");
  EXPECT_TRUE(billing.ListInvoices(failing, "", 10)->empty());
}

// At expiry, what is left of the trial goes back to the promotion expense;
// a second run reverses nothing more.
TEST_F(BillingTest, TrialExpiryReversesTheRest) {
  BillingOptions options;
  options.trial_validity = absl::Hours(2);
  Billing billing = MakeBilling(options);
  auto [tenant, user] = NewTenant("expiring");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  const std::string id = Run(tenant, 1);
  clock_.Advance(absl::Minutes(10));
  Stop(tenant, id);  // Started minute plus 9 more: 11 minutes (20 s offset).
  clock_.Advance(absl::Hours(3));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto balance = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(balance->trial_micros, 0);
  EXPECT_FALSE(balance->trial_expires_at.has_value());
  auto expiry = billing.ListTransfers(tenant, {.kind = "trial_expiry"});
  ASSERT_EQ(expiry->size(), 1u);
  EXPECT_EQ((*expiry)[0].amount_micros, 10 * kMicrosPerYuan - 11 * kPrice);
  EXPECT_EQ((*expiry)[0].idempotency_key, "trial-expiry:" + user);
  ExpectAuditClean(billing);
}

// Minutes billed again (the cursor moved back, as after a restore) are
// replays: the same charges are no-ops, nothing is charged twice. If the
// recomputation differs (here: a price rewritten in the past), the batch
// fails with CHARGE_CONTENT_CLASH and writes nothing. Charge rows cannot be
// changed or deleted.
TEST_F(BillingTest, ReplayedChargesAreNoOpsAndClashesFail) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("replayed");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-r", 50 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 2);
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  const int64_t paid = billing.GetBalance(tenant, clock_.Now())->paid_micros;
  auto query = [&](const std::string& sql) {
    int64_t v = 0;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      v = txn.exec(sql)[0][0].as<int64_t>();
      return absl::OkStatus();
    }).ok());
    return v;
  };
  const int64_t charges = query("SELECT count(*) FROM ledger_charges");
  const int64_t cursor = query("SELECT billed_before_minute FROM billing_cursor");
  ASSERT_GT(charges, 5);
  auto rewind = [&] {
    ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
      txn.exec_params("UPDATE billing_cursor SET billed_before_minute = $1", cursor - 5);
      return absl::OkStatus();
    }).ok());
  };
  rewind();
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  EXPECT_EQ(query("SELECT count(*) FROM ledger_charges"), charges);
  EXPECT_EQ(billing.GetBalance(tenant, clock_.Now())->paid_micros, paid);
  EXPECT_EQ(query("SELECT billed_before_minute FROM billing_cursor"), cursor);
  ExpectAuditClean(billing);

  rewind();
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec("UPDATE price_book SET unit_price_micros = 34000 WHERE item_kind = 'gpu_minute'");
    return absl::OkStatus();
  }).ok());
  auto clash = billing.RunOnce(clock_.Now());
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(ReasonOf(clash.status()), "CHARGE_CONTENT_CLASH") << clash.status();
  EXPECT_EQ(query("SELECT count(*) FROM ledger_charges"), charges);
  EXPECT_EQ(query("SELECT billed_before_minute FROM billing_cursor"), cursor - 5);
  for (const char* edit : {"UPDATE ledger_charges SET main_micros = main_micros + 1",
                           "DELETE FROM ledger_charges"}) {
    EXPECT_FALSE(db_->Transact([&](pqxx::work& txn) {
      txn.exec(edit);
      return absl::OkStatus();
    }).ok()) << edit;
  }
  // A charge can no longer be written as a transfer.
  EXPECT_FALSE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id, "
        "to_account_id, amount_micros, kind, tenant_id, at) SELECT 'charge:x:1', 0, 'x', w.id, "
        "r.id, 1, 'charge', $1, now() FROM ledger_accounts w, ledger_accounts r "
        "WHERE w.tenant_id = $1 AND w.kind = 'paid_wallet' AND r.kind = 'platform_revenue'",
        tenant);
    return absl::OkStatus();
  }).ok());
}

// The auditor finds a charge for a minute the instance did not run, and the
// database refuses a balance edited outside a transfer.
TEST_F(BillingTest, AuditorFindsForeignCharge) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("audited");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-a", 50 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 2);
  clock_.Advance(absl::Minutes(5));
  Stop(tenant, id);
  clock_.Advance(absl::Minutes(5));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ExpectAuditClean(billing);
  const int64_t idle_minute = MinuteOf(clock_.Now()) - 2;  // After the stop.
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO ledger_charges (instance_no, tenant_no, minute, gpu_count, unit_price, "
        "trial_micros, main_account, main_micros, revenue_account, at) "
        "SELECT i.billing_no, (SELECT billing_no FROM tenants WHERE id = i.tenant_id), "
        "$2::bigint, 2, 33000, 0, w.id, 66000, r.id, now() "
        "FROM instances i, ledger_accounts w, ledger_accounts r WHERE i.id = $1 "
        "AND w.tenant_id = $3 AND w.kind = 'paid_wallet' AND r.kind = 'platform_revenue'",
        id, idle_minute, tenant);
    return absl::OkStatus();
  }).ok());
  auto failures = billing.Audit();
  ASSERT_TRUE(failures.ok());
  ASSERT_EQ(failures->size(), 1u);
  EXPECT_NE((*failures)[0].find("charges match RUNNING intervals"), std::string::npos)
      << (*failures)[0];
  absl::Status edited = db_->Transact([&](pqxx::work& txn) {
    txn.exec("UPDATE ledger_accounts SET balance_micros = balance_micros + 1 "
             "WHERE kind = 'paid_wallet'");
    return absl::OkStatus();
  });
  EXPECT_FALSE(edited.ok());
}

// The primary key (minute, tenant number, instance number) is one row per
// instance-minute only while each row carries its instance's tenant number:
// a second charge of a billed minute under another tenant's number passes
// the key, and the auditor names it.
TEST_F(BillingTest, AuditorFindsChargeUnderAnotherTenantNumber) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("keyed");
  auto [other, other_user] = NewTenant("elsewhere");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-k", 50 * kMicrosPerYuan, clock_.Now()).ok());
  const std::string id = Run(tenant, 2);
  clock_.Advance(absl::Minutes(5));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ExpectAuditClean(billing);
  const int64_t billed_minute = MinuteOf(clock_.Now()) - 2;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO ledger_charges (instance_no, tenant_no, minute, gpu_count, unit_price, "
        "trial_micros, main_account, main_micros, revenue_account, at) "
        "SELECT i.billing_no, (SELECT billing_no FROM tenants WHERE id = $4), "
        "$2::bigint, 2, 33000, 0, w.id, 66000, r.id, now() "
        "FROM instances i, ledger_accounts w, ledger_accounts r WHERE i.id = $1 "
        "AND w.tenant_id = $3 AND w.kind = 'paid_wallet' AND r.kind = 'platform_revenue'",
        id, billed_minute, tenant, other);
    return absl::OkStatus();
  }).ok());
  auto failures = billing.Audit();
  ASSERT_TRUE(failures.ok());
  bool named = false;
  for (const std::string& f : *failures) {
    if (f.find("each instance-minute charged at most once") != std::string::npos &&
        f.find("not its instance's tenant " + tenant) != std::string::npos) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << absl::StrJoin(*failures, "\n");
}

// Readers by tenant probe the charges' key (minute, tenant number, instance
// number) once per minute (sv_tenant_charges, migration 0091). What they
// find must equal a plain scan of the view: the spend since a minute (the
// spend cap's measure), for bounds before, inside and after the history,
// for a tenant with another tenant's instances running beside it, and the
// usage rows per instance and day.
TEST_F(BillingTest, ChargesProbedByMinuteMatchThePlainView) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("probed");
  auto [other, other_user] = NewTenant("beside");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-p", 500 * kMicrosPerYuan, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(other, "pay-o", 500 * kMicrosPerYuan, clock_.Now()).ok());
  const int64_t m0 = MinuteOf(clock_.Now());
  const std::string a = Run(tenant, 2);
  Run(other, 4);
  clock_.Advance(absl::Minutes(10));
  const std::string b = Run(tenant, 8);
  clock_.Advance(absl::Minutes(15));
  Stop(tenant, a);
  clock_.Advance(absl::Minutes(20));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ExpectAuditClean(billing);
  for (int64_t since : {m0 - 100, m0, m0 + 1, m0 + 12, m0 + 44, m0 + 45, m0 + 500}) {
    int64_t probed = -1, plain = -2;
    ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
      probed = txn.exec_params1("SELECT sv_tenant_spent_since($1, $2)", tenant, since)[0]
                   .as<int64_t>();
      plain = txn.exec_params1(
                     "SELECT coalesce(sum(amount_micros), 0)::bigint FROM ledger_all_transfers "
                     "WHERE tenant_id = $1 AND kind IN ('charge', 'app_fee', 'storage') "
                     "AND usage_minute >= $2",
                     tenant, since)[0]
                  .as<int64_t>();
      return absl::OkStatus();
    }).ok());
    EXPECT_EQ(probed, plain) << "since minute m0" << (since - m0 >= 0 ? "+" : "")
                             << since - m0;
    if (since == m0) {
      // 26 minutes of 2 GPUs (m0 .. m0+25: each started minute is charged)
      // and 35 of 8 (m0+10 .. m0+44; minute m0+45 is not over).
      EXPECT_EQ(probed, (26 * 2 + 35 * 8) * 33'000);
    }
  }
  auto usage = billing.GetUsage(tenant, absl::InfinitePast(), absl::InfiniteFuture(), "");
  ASSERT_TRUE(usage.ok()) << usage.status();
  std::map<std::string, int64_t> minutes;
  for (const auto& row : *usage) minutes[row.instance_id] += row.instance_minutes;
  EXPECT_EQ(minutes.size(), 2u);
  EXPECT_EQ(minutes[a], 26);
  EXPECT_EQ(minutes[b], 35);
}

// A RUNNING end recorded after its minutes were billed (a node's death
// found late): the next run refunds exactly the minutes charged beyond the
// true end with `adjustment` transfers, paid credit back first, and the
// auditor passes again. A second run changes nothing.
TEST_F(BillingTest, LateEndIsRefundedByAdjustments) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("late");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-late", 50 * kMicrosPerYuan, clock_.Now()).ok());
  const absl::Time t0 = clock_.Now();  // 20 s into minute m0.
  const int64_t m0 = MinuteOf(t0);
  const std::string id = Run(tenant, 8);  // 264,000 per minute.
  clock_.Advance(absl::Minutes(60));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  // Minutes m0 .. m0+59 are charged: 10 CNY of trial, then paid credit.
  auto before = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(before->trial_micros, 0);
  EXPECT_EQ(before->paid_micros, 60 * kMicrosPerYuan - 60 * 264'000);
  ExpectAuditClean(billing);
  SlaRentSeen sla_before = SlaRentOver(id, m0, m0 + 59);
  EXPECT_EQ(sla_before.rent, 60 * 264'000);
  EXPECT_EQ(sla_before.trial, 10 * kMicrosPerYuan);
  EXPECT_EQ(sla_before.minutes, MinutesRange(m0, m0 + 59));

  // The end arrives now, dated 45 min 10 s after the start: minutes
  // m0 .. m0+45 were owed (46 started minutes), m0+46 .. m0+59 were not.
  ASSERT_TRUE(store_->StopInstance(tenant, id, "node lost", t0 + absl::Minutes(45) +
                                                                absl::Seconds(10)).ok());
  auto failures = billing.Audit();
  ASSERT_TRUE(failures.ok());
  EXPECT_EQ(failures->size(), 14u);  // One per minute charged beyond the end.

  clock_.Advance(absl::Minutes(1));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->adjustment_legs, 14);
  auto after = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(after->trial_micros, 0);  // Minutes paid from trial stay paid.
  EXPECT_EQ(after->paid_micros, 60 * kMicrosPerYuan - 46 * 264'000);
  auto adjustments = billing.ListTransfers(tenant, {.kind = "adjustment", .limit = 1000});
  ASSERT_TRUE(adjustments.ok());
  ASSERT_EQ(adjustments->size(), 14u);
  for (const auto& t : *adjustments) {
    EXPECT_EQ(t.amount_micros, 264'000);
    EXPECT_EQ(t.tenant_delta_micros, 264'000);
    EXPECT_EQ(t.to_kind, "paid_wallet");
    EXPECT_GE(*t.usage_minute, m0 + 46);
    EXPECT_LE(*t.usage_minute, m0 + 59);
    EXPECT_EQ(t.idempotency_key, absl::StrCat("adjust:", id, ":", *t.usage_minute, ":1"));
  }
  ExpectAuditClean(billing);

  // Nothing more on later runs, and the revenue is what was owed.
  clock_.Advance(absl::Minutes(5));
  auto again = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->adjustment_legs, 0);
  EXPECT_EQ(billing.ListTransfers(tenant, {.kind = "adjustment", .limit = 1000})->size(), 14u);
  auto summary = billing.GetRevenueSummary(absl::InfinitePast(), absl::InfiniteFuture());
  EXPECT_EQ(summary->platform_revenue_balance_micros, 46 * 264'000);
  ExpectAuditClean(billing);
  // The operator's dashboard agrees: its charges are net of the refunds.
  store::DashboardStore dashboard(*db_);
  auto points = dashboard.RevenueSeries(MinuteStart(m0), clock_.Now(), false);
  ASSERT_TRUE(points.ok()) << points.status();
  int64_t charged = 0, trial = 0;
  for (const auto& p : *points) {
    charged += p.charged_micros;
    trial += p.trial_charged_micros;
  }
  EXPECT_EQ(charged, 46 * 264'000);
  EXPECT_EQ(trial, 10 * kMicrosPerYuan);

  // The SLA judge refunds a share of the rent paid in the end, over the
  // minutes paid in the end: not of minutes already given back whole
  // (the dead node's would be judged silent, a breach of every metric).
  SlaRentSeen sla_after = SlaRentOver(id, m0, m0 + 59);
  EXPECT_EQ(sla_after.rent, 46 * 264'000);
  EXPECT_EQ(sla_after.trial, 10 * kMicrosPerYuan);  // The paid part came back.
  EXPECT_EQ(sla_after.minutes, MinutesRange(m0, m0 + 45));
}

// A late refund of minutes charged to the paid wallet, after the tenant
// became postpaid, goes to the receivable, where the wallet's balance went:
// not to a wallet that postpaid charges never touch.
TEST_F(BillingTest, LateRefundFollowsTheMovedBalance) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("switchlate");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-sl", 50 * kMicrosPerYuan, clock_.Now()).ok());
  const absl::Time t0 = clock_.Now();
  const std::string id = Run(tenant, 8);  // 264,000 per minute.
  clock_.Advance(absl::Minutes(60));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ASSERT_TRUE(billing.SetBillingMode(tenant, BillingMode::kPostpaid, 10 * kMicrosPerYuan).ok());
  auto before = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(before->paid_micros, 0);
  EXPECT_EQ(before->receivable_micros, 60 * kMicrosPerYuan - 60 * 264'000);

  // The end arrives late: 14 of the minutes charged were not owed.
  ASSERT_TRUE(store_->StopInstance(tenant, id, "node lost", t0 + absl::Minutes(45) +
                                                                absl::Seconds(10)).ok());
  clock_.Advance(absl::Minutes(1));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->adjustment_legs, 14);
  auto after = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(after->paid_micros, 0);
  EXPECT_EQ(after->receivable_micros, 60 * kMicrosPerYuan - 46 * 264'000);
  auto adjustments = billing.ListTransfers(tenant, {.kind = "adjustment", .limit = 1000});
  ASSERT_TRUE(adjustments.ok());
  ASSERT_EQ(adjustments->size(), 14u);
  for (const auto& t : *adjustments) EXPECT_EQ(t.to_kind, "receivable");
  ExpectAuditClean(billing);
}

// A payment or an SLA refund racing a switch to postpaid lands where the
// switch moved the balance, not in the paid wallet the new mode never
// spends. The race is made certain: a transaction holds the paid wallet, so
// the switch stops inside its move with the new mode written but not
// committed; the credit starts then, and both wait until it lets go.
TEST_F(BillingTest, CreditsRacingAModeSwitchFollowTheBalance) {
  Billing billing = MakeBilling();
  // Waits until `n` backends of this database wait for a lock.
  auto wait_for_lock_waiters = [&](int n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int waiting = 0;
    while (absl::Now() < deadline) {
      ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
                       waiting = txn.exec("SELECT count(*) FROM pg_stat_activity WHERE "
                                          "datname = current_database() AND "
                                          "wait_event_type = 'Lock'")[0][0]
                                     .as<int>();
                       return absl::OkStatus();
                     }).ok());
      if (waiting >= n) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << waiting << " backends wait for a lock, not " << n;
  };
  for (const bool sla : {false, true}) {
    SCOPED_TRACE(sla ? "SLA refund" : "top-up");
    auto [tenant, user] = NewTenant(sla ? "race-sla" : "race-pay");
    ASSERT_TRUE(billing.TopUp(tenant, "race-a-" + tenant, 20 * kMicrosPerYuan, clock_.Now()).ok());
    const std::string id = Run(tenant, 1);
    std::promise<void> held, release;
    std::shared_future<void> released = release.get_future().share();
    std::thread holder([&] {
      EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
                       txn.exec_params("SELECT 1 FROM ledger_accounts WHERE tenant_id = $1 "
                                       "AND kind = 'paid_wallet' FOR UPDATE",
                                       tenant);
                       held.set_value();
                       released.wait();
                       return absl::OkStatus();
                     }).ok());
    });
    held.get_future().wait();
    absl::Status switched, credited;
    std::thread switcher([&] {
      switched = billing.SetBillingMode(tenant, BillingMode::kPostpaid, 50 * kMicrosPerYuan);
    });
    wait_for_lock_waiters(1);
    std::thread creditor([&] {
      if (!sla) {
        credited = billing.TopUp(tenant, "race-b-" + tenant, 3 * kMicrosPerYuan, clock_.Now())
                       .status();
        return;
      }
      credited = db_->Transact([&](pqxx::work& txn) -> absl::Status {
        return PostSlaRefunds(txn,
                              {{"sla:" + id + ":race:gpu_utilization", tenant, id,
                                absl::ToUnixSeconds(clock_.Now()) / 3600 * 60,
                                3 * kMicrosPerYuan}},
                              clock_.Now())
            .status();
      });
    });
    wait_for_lock_waiters(2);
    release.set_value();
    holder.join();
    switcher.join();
    creditor.join();
    ASSERT_TRUE(switched.ok()) << switched;
    ASSERT_TRUE(credited.ok()) << credited;
    auto balance = billing.GetBalance(tenant, clock_.Now());
    ASSERT_TRUE(balance.ok()) << balance.status();
    EXPECT_EQ(balance->mode, BillingMode::kPostpaid);
    EXPECT_EQ(balance->paid_micros, 0);
    EXPECT_EQ(balance->receivable_micros, 23 * kMicrosPerYuan);
    Stop(tenant, id);
  }
  ExpectAuditClean(billing);
}

// A RUNNING interval recorded after its minutes were billed (an agent that
// reports, after a partition, a run it did): the next run charges the
// missed minutes with `adjustment` transfers and the auditor passes again.
TEST_F(BillingTest, LateRunIsChargedByAdjustments) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("laterun");
  ASSERT_TRUE(billing.TopUp(tenant, "pay-laterun", 50 * kMicrosPerYuan, clock_.Now()).ok());
  const absl::Time t0 = clock_.Now();  // 20 s into minute m0.
  const int64_t m0 = MinuteOf(t0);
  const std::string id = Run(tenant, 2);  // 66,000 per minute.
  clock_.Advance(absl::Minutes(5));
  Stop(tenant, id);  // Minutes m0 .. m0+5.
  clock_.Advance(absl::Minutes(20));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ExpectAuditClean(billing);
  // Recorded now: it ran again from t0+10m to t0+12m30s (m0+10 .. m0+12).
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) VALUES "
        "($1, to_timestamp($2), 'STOPPED', 'RUNNING', 'late report'), "
        "($1, to_timestamp($3), 'RUNNING', 'STOPPED', 'late report')",
        id, absl::ToUnixSeconds(t0 + absl::Minutes(10)),
        absl::ToUnixSeconds(t0 + absl::Minutes(12) + absl::Seconds(30)));
    return absl::OkStatus();
  }).ok());
  auto failures = billing.Audit();
  ASSERT_TRUE(failures.ok());
  EXPECT_EQ(failures->size(), 3u);
  clock_.Advance(absl::Minutes(1));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->adjustment_legs, 3);
  auto adjustments = billing.ListTransfers(tenant, {.kind = "adjustment", .limit = 100});
  ASSERT_EQ(adjustments->size(), 3u);
  for (const auto& t : *adjustments) {
    EXPECT_EQ(t.amount_micros, 66'000);
    EXPECT_EQ(t.tenant_delta_micros, -66'000);
    EXPECT_EQ(t.from_kind, "trial_wallet");  // The loop granted the trial: spent first.
    EXPECT_GE(*t.usage_minute, m0 + 10);
    EXPECT_LE(*t.usage_minute, m0 + 12);
  }
  auto balance = billing.GetBalance(tenant, clock_.Now());
  EXPECT_EQ(balance->trial_micros, 10 * kMicrosPerYuan - 9 * 66'000);
  EXPECT_EQ(balance->paid_micros, 50 * kMicrosPerYuan);
  ExpectAuditClean(billing);
  ASSERT_TRUE(billing.RunOnce(clock_.Now() + absl::Minutes(1)).ok());
  EXPECT_EQ(billing.ListTransfers(tenant, {.kind = "adjustment", .limit = 100})->size(), 3u);

  // The SLA judge counts the late run's minutes as rented, and their rent.
  SlaRentSeen sla = SlaRentOver(id, m0, m0 + 12);
  EXPECT_EQ(sla.rent, 9 * 66'000);
  EXPECT_EQ(sla.trial, 9 * 66'000);
  std::vector<int64_t> minutes = MinutesRange(m0, m0 + 5);
  for (int64_t m = m0 + 10; m <= m0 + 12; ++m) minutes.push_back(m);
  EXPECT_EQ(sla.minutes, minutes);
}

// Late corrections of a tenant whose credit ran out keep what is recorded
// as uncollected exact. A late run it cannot pay is recorded as shortfall
// (it used to be neither charged nor recorded, and the auditor reported it
// for ever). A late resize down makes a capped minute owed less, not
// nothing: what was paid still counts against it and the shortfall shrinks
// (all of the minute's charge used to come back while the tenant still owed
// more than it paid).
TEST_F(BillingTest, LateCorrectionsOfAnUnpaidTenantKeepItsShortfallExact) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("unpaid");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-unpaid", 900'000, clock_.Now()).ok());
  const absl::Time t0 = clock_.Now();  // 20 s into minute m0.
  const int64_t m0 = MinuteOf(t0);
  // 264,000 per minute: 10.9 CNY pays m0 .. m0+40 and 76,000 of m0+41.
  const std::string id = Run(tenant, 8);
  clock_.Advance(absl::Minutes(60));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());  // Stopped now, at t0+60m.
  ASSERT_EQ(store_->GetInstance(tenant, id)->state, store::InstanceState::kStopped);
  clock_.Advance(absl::Minutes(30));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  auto shortfalls = [&] {
    std::map<int64_t, std::pair<int64_t, int64_t>> out;  // minute -> (charged, shortfall)
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      for (const auto& row : txn.exec_params(
               "SELECT usage_minute, charged_micros, shortfall_micros FROM billing_shortfalls "
               "WHERE instance_id = $1", id)) {
        out[row[0].as<int64_t>()] = {row[1].as<int64_t>(), row[2].as<int64_t>()};
      }
      return absl::OkStatus();
    }).ok());
    return out;
  };
  ASSERT_EQ(shortfalls()[m0 + 41], std::make_pair(int64_t{76'000}, int64_t{188'000}));
  const size_t capped = shortfalls().size();
  ExpectAuditClean(billing);

  // Recorded now: it ran again from t0+70m to t0+72m30s (m0+70 .. m0+72).
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) VALUES "
        "($1, to_timestamp($2), 'STOPPED', 'RUNNING', 'late report'), "
        "($1, to_timestamp($3), 'RUNNING', 'STOPPED', 'late report')",
        id, absl::ToUnixSeconds(t0 + absl::Minutes(70)),
        absl::ToUnixSeconds(t0 + absl::Minutes(72) + absl::Seconds(30)));
    return absl::OkStatus();
  }).ok());
  clock_.Advance(absl::Minutes(1));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->adjustment_legs, 0);
  auto after_run = shortfalls();
  EXPECT_EQ(after_run.size(), capped + 3);
  for (int64_t m = m0 + 70; m <= m0 + 72; ++m) {
    EXPECT_EQ(after_run[m], std::make_pair(int64_t{0}, int64_t{264'000})) << m;
  }
  ExpectAuditClean(billing);

  // Recorded now: it was resized to 4 GPUs at t0+30m30s, in minute m0+30.
  InsertLateEvent(id, absl::ToUnixSeconds(t0 + absl::Minutes(30) + absl::Seconds(30)),
                  "RUNNING", "RUNNING", "late resize", 8, 4);
  clock_.Advance(absl::Minutes(1));
  result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  auto after_resize = shortfalls();
  // m0+41 is owed 132,000 and had 76,000 paid: nothing comes back.
  EXPECT_EQ(after_resize[m0 + 41], std::make_pair(int64_t{76'000}, int64_t{56'000}));
  for (const auto& [minute, row] : after_resize) {
    if (minute > m0 + 41) EXPECT_EQ(row, std::make_pair(int64_t{0}, int64_t{132'000})) << minute;
  }
  auto adjustments = billing.ListTransfers(tenant, {.kind = "adjustment", .limit = 1000});
  ASSERT_TRUE(adjustments.ok());
  int64_t refunded = 0;
  for (const auto& t : *adjustments) {
    EXPECT_GE(*t.usage_minute, m0 + 31);
    EXPECT_LE(*t.usage_minute, m0 + 40) << "only minutes paid beyond what they owe";
    refunded += t.tenant_delta_micros;
  }
  EXPECT_EQ(refunded, 10 * 132'000);
  ExpectAuditClean(billing);
}

// The auditor's app-fee check reads which minutes owe a fee from the
// charge rows: metering charges a fee for a minute whose rent it charged in
// full. It used to read it from whether the minute had a shortfall row, and
// a late end that removed the capped minute's row then left the check
// failing on every run.
TEST_F(BillingTest, AnAppsCappedMinuteEndedLateKeepsTheAuditClean) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("appbuyer");
  auto [publisher, publisher_user] = NewTenant("apppublisher");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-appbuyer", 2 * kMicrosPerYuan, clock_.Now()).ok());
  const absl::Time t0 = clock_.Now();
  const std::string id = Run(tenant, 8);
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO marketplace_images (id, publisher_tenant_id, name, version, image, "
        "gpu_count, price_per_hour_micros, request_id, created_at) VALUES ('img-capped', $1, "
        "'capped', '1.0', 'registry.example/capped:1.0', 8, 600000, 'r-capped', now())",
        publisher);
    txn.exec_params(
        "INSERT INTO instance_apps (instance_id, image_id, publisher_tenant_id, "
        "price_per_hour_micros) VALUES ($1, 'img-capped', $2, 600000)",
        id, publisher);
    return absl::OkStatus();
  }).ok());
  clock_.Advance(absl::Minutes(90));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());  // Credit runs out; stopped now.
  ASSERT_EQ(store_->GetInstance(tenant, id)->state, store::InstanceState::kStopped);
  int64_t capped = 0;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    capped = txn.exec_params1("SELECT min(usage_minute) FROM billing_shortfalls "
                              "WHERE instance_id = $1 AND charged_micros > 0", id)[0]
                 .as<int64_t>();
    return absl::OkStatus();
  }).ok());
  ASSERT_GT(capped, MinuteOf(t0));
  ExpectAuditClean(billing);

  // Recorded now: it ended in the minute before the capped one.
  InsertLateEvent(id, capped * 60 - 10, "RUNNING", "STOPPED", "late report");
  clock_.Advance(absl::Minutes(1));
  auto result = billing.RunOnce(clock_.Now());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->adjustment_legs, 0);  // The capped minute's rent comes back.
  EXPECT_EQ(CountFor("billing_shortfalls", id), 0);
  ExpectAuditClean(billing);
}

// ListTransfers pages, in both orders, with every filter and several page
// sizes, list exactly what one plain query over ledger_all_transfers lists
// in the documented order: a transfer by its posting time, a minute charge
// by the end of the minute it charges. The instances overlap, the runs post
// several minutes at once (catch-up), top-ups fall between charges, and
// another tenant's charges must not appear.
TEST_F(BillingTest, TransferPagesMatchOnePlainQuery) {
  Billing billing = MakeBilling();
  auto [tenant, user] = NewTenant("pages");
  auto [other, other_user] = NewTenant("pagesother");
  ASSERT_TRUE(billing.EnsureTrialGrant(user, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(tenant, "pay-p0", 100 * kMicrosPerYuan, clock_.Now()).ok());
  ASSERT_TRUE(billing.TopUp(other, "pay-o0", 100 * kMicrosPerYuan, clock_.Now()).ok());
  const absl::Time t0 = clock_.Now();
  const std::string a = Run(tenant, 1);
  Run(other, 1);
  clock_.Advance(absl::Minutes(5));
  const std::string b = Run(tenant, 8);
  for (int step = 0; step < 8; ++step) {
    clock_.Advance(absl::Minutes(3) + absl::Seconds(7));
    if (step == 2) Stop(tenant, b);
    if (step % 3 == 1) {
      ASSERT_TRUE(billing.TopUp(tenant, absl::StrCat("pay-p", step + 1), kMicrosPerYuan,
                                clock_.Now()).ok());
    }
    if (step % 2 == 0) {
      ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
    }
  }
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  // Five quiet hours (b stopped, a runs on), then a top-up and a third
  // instance: a page that spans the hours must widen its window of keys.
  Stop(tenant, a);
  clock_.Advance(absl::Hours(5));
  ASSERT_TRUE(billing.TopUp(tenant, "pay-late", kMicrosPerYuan, clock_.Now()).ok());
  const std::string c = Run(tenant, 2);
  clock_.Advance(absl::Minutes(4));
  ASSERT_TRUE(billing.RunOnce(clock_.Now()).ok());
  ExpectAuditClean(billing);

  auto reference = [&](const TransferFilter& f) {
    std::vector<std::string> keys;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
      keys.clear();
      const std::string order = f.newest_first ? " DESC" : "";
      auto rows = txn.exec_params(
          absl::StrCat(
              "SELECT idempotency_key || '/' || leg FROM (SELECT *, CASE WHEN src = 0 THEN at "
              "ELSE 'epoch'::timestamptz + (src_minute + 1) * interval '1 minute' END AS k "
              "FROM ledger_all_transfers) t WHERE tenant_id = $1 "
              "AND ($2 = '' OR kind = $2) AND ($3 = '' OR instance_id = $3) "
              "AND ($4::timestamptz IS NULL OR k >= $4::timestamptz) "
              "AND ($5::timestamptz IS NULL OR k < $5::timestamptz) "
              "ORDER BY k", order, ", src", order, ", src_no", order, ", src_minute", order,
              ", leg", order),
          tenant, f.kind, f.instance_id,
          f.from ? std::optional<std::string>(store::SqlTime(*f.from)) : std::nullopt,
          f.to ? std::optional<std::string>(store::SqlTime(*f.to)) : std::nullopt);
      for (const auto& r : rows) keys.push_back(r[0].as<std::string>());
      return absl::OkStatus();
    }).ok());
    return keys;
  };

  std::vector<TransferFilter> filters = {
      {},
      {.kind = "charge"},
      {.kind = "topup"},
      {.instance_id = b},
      {.from = t0 + absl::Minutes(7), .to = t0 + absl::Minutes(19) + absl::Seconds(40)},
      {.from = t0 + absl::Minutes(3), .kind = "charge", .instance_id = a},
      {.from = t0 + absl::Minutes(20), .to = clock_.Now(), .kind = "charge"},
      {.from = t0 + absl::Hours(2)},
      {.instance_id = c},
  };
  size_t listed = 0;
  for (TransferFilter filter : filters) {
    for (bool newest_first : {false, true}) {
      filter.newest_first = newest_first;
      const std::vector<std::string> want = reference(filter);
      for (int limit : {1, 2, 5, 1000}) {
        filter.limit = limit;
        filter.after.clear();
        std::vector<std::string> got;
        for (int page = 0; page < 1000; ++page) {
          auto transfers = billing.ListTransfers(tenant, filter);
          ASSERT_TRUE(transfers.ok()) << transfers.status();
          ASSERT_LE(transfers->size(), static_cast<size_t>(limit));
          for (const auto& t : *transfers) {
            got.push_back(absl::StrCat(t.idempotency_key, "/", t.leg));
          }
          if (transfers->size() < static_cast<size_t>(limit)) break;
          filter.after = transfers->back().cursor;
        }
        EXPECT_EQ(got, want) << "kind '" << filter.kind << "' instance '" << filter.instance_id
                             << "' limit " << limit << " newest_first " << newest_first;
      }
      listed += want.size();
    }
  }
  // The data set is what the test means it to be: charges of both
  // instances, top-ups, the trial grant, nothing of the other tenant.
  const std::vector<std::string> all = reference({});
  EXPECT_GT(all.size(), 40u);
  EXPECT_TRUE(std::find(all.begin(), all.end(), "trial:" + user + "/0") != all.end());
  EXPECT_GT(listed, 4 * all.size() / 2);
  for (const auto& key : all) EXPECT_EQ(key.find("pay-o"), std::string::npos) << key;
  // A forged token whose time no window can start from is refused (one
  // near the int64 limit overflowed the window's arithmetic).
  for (bool newest_first : {false, true}) {
    for (const char* forged : {"9223372036854775807.0.0.0.0", "-9223372036854775808.0.0.0.0",
                               "-253402300799000000.0.0.0.0", "0.99999.0.0.0", "0.0.0.0.99999",
                               "1.2.3", "x.0.0.0.0"}) {
      auto refused = billing.ListTransfers(
          tenant, {.after = forged, .limit = 10, .newest_first = newest_first});
      EXPECT_EQ(ReasonOf(refused.status()), "INVALID_PAGE_TOKEN") << forged;
    }
  }
}

}  // namespace
}  // namespace sv::billing
