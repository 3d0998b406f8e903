// One metering batch that mixes every way a minute can be charged
// (billing/metering.cc): tenants whose instances ran the whole batch and
// whose funds cover it (charged straight from running_since), tenants whose
// funds do not cover it (trial first, then capped), and tenants with an
// instance resized or stopped inside the batch (intervals from the events).
// Every charge row must be what a simple independent model says, to the
// micro-yuan. Also: the database refuses a malformed charge row, and the
// auditor finds one written past the constraint. Real PostgreSQL, fake clock.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "control/scheduling.h"
#include "gtest/gtest.h"
#include "tests/integration/billed_fleet.h"
#include "tests/integration/harness.h"

namespace sv::billing {
namespace {

constexpr int64_t kPrice = 33'000;  // RTX 4090, micro-yuan per GPU-minute.

class BillingBatchTest : public sv::testing::BilledFleetTest {
 protected:
  void SetUp() override { SetUpFleet(12, 1); }

  void CheckMixedBatch(bool cursor_set);

  std::string Run(const std::string& tenant, int gpus) {
    store::InstanceSpec spec;
    spec.name = absl::StrCat("i", ++counter_);
    spec.gpu_count = gpus;
    spec.gpu_model = "RTX 4090";
    spec.image = "ubuntu";
    auto created = store_->CreateInstance(tenant, spec, absl::StrCat("r", counter_),
                                          absl::StrCat("f", counter_), clock_.Now());
    EXPECT_TRUE(created.ok()) << created.status();
    EXPECT_TRUE(scheduling_->RunPass(clock_.Now()).ok());
    EXPECT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
    EXPECT_TRUE(store_->AdvanceSimulatedStarts(clock_.Now()).ok());
    EXPECT_EQ(store_->GetInstance(tenant, created->id)->state, store::InstanceState::kRunning);
    return created->id;
  }

  int counter_ = 0;
};

// What one charge row holds.
struct Charge {
  int gpus = 0;
  int64_t trial = 0;
  int64_t main = 0;
  bool operator==(const Charge& o) const {
    return gpus == o.gpus && trial == o.trial && main == o.main;
  }
};

// The batch below, either as the ledger's first (no cursor yet: the whole
// statement, app rent possible) or after a run that set the cursor (the
// statement of the easy tenants, then the whole one for the tenants it
// leaves: mixed, short, resized, stopped, split).
void BillingBatchTest::CheckMixedBatch(bool cursor_set) {
  const int64_t m0 = MinuteOf(clock_.Now());
  constexpr int64_t kMinutes = 60;  // One batch: m0 .. m0+59.
  if (cursor_set) {
    auto set = billing_->BillMinutesBefore(m0, clock_.Now());
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(set->minutes_billed, 0);
  }
  const int64_t kRich = 1'000 * kMicrosPerYuan;
  const int64_t kTrial = 10 * kMicrosPerYuan;
  // easy: covered by the paid wallet; its third instance starts mid-batch.
  const std::string easy = NewTenant("easy", kRich, false);
  // trial: covered by the trial wallet alone.
  const std::string trial = NewTenant("trial", 0, true);
  // mixed: the trial wallet runs out inside the batch, then the paid wallet.
  const std::string mixed = NewTenant("mixed", 100 * kMicrosPerYuan, true);
  // short: 1 CNY, three full minutes of 8 GPUs and part of a fourth.
  const std::string poor = NewTenant("short", kMicrosPerYuan, false);
  // resized / stopped: covered, but one instance has events in the batch.
  const std::string resized = NewTenant("resized", kRich, false);
  const std::string stopped = NewTenant("stopped", kRich, false);
  // split: the trial wallet covers its instance without events alone and
  // its resized instance alone, but not both: all of its minutes must go
  // through one running sum, trial first.
  const std::string split = NewTenant("split", 100 * kMicrosPerYuan, true);

  const std::string a1 = Run(easy, 8), a2 = Run(easy, 8);
  const std::string b1 = Run(trial, 1);
  const std::string c1 = Run(mixed, 8);
  const std::string d1 = Run(poor, 8);
  const std::string e1 = Run(resized, 1), e2 = Run(resized, 8);
  const std::string f1 = Run(stopped, 2), f2 = Run(stopped, 4);
  const std::string g1 = Run(split, 1), g2 = Run(split, 8);
  clock_.Advance(absl::Minutes(10));  // m0+10 + 20 s
  ASSERT_TRUE(scheduling_->Resize(resized, e2, 16, clock_.Now()).ok());
  auto grown = scheduling_->Resize(split, g2, 16, clock_.Now());
  ASSERT_TRUE(grown.ok()) << grown.status();
  clock_.Advance(absl::Minutes(10));  // m0+20 + 20 s
  ASSERT_TRUE(store_->StopInstance(stopped, f2, "done", clock_.Now()).ok());
  ASSERT_TRUE(store_->StopInstance(split, g2, "done", clock_.Now()).ok());
  clock_.Advance(absl::Minutes(10));  // m0+30 + 20 s
  const std::string a3 = Run(easy, 4);
  clock_.Advance(absl::Minutes(31));  // m0+61 + 20 s

  // 13 instances: one batch covers all 60 minutes (batch_rows_max 200,000).
  auto billed = billing_->BillMinutesBefore(m0 + kMinutes, clock_.Now());
  ASSERT_TRUE(billed.ok()) << billed.status();
  EXPECT_EQ(billed->minutes_billed, kMinutes);

  // The model, per instance and minute.
  std::map<std::string, std::map<int64_t, Charge>> want;
  auto full = [&](const std::string& id, int gpus, int64_t from, int64_t to, bool from_trial) {
    for (int64_t m = from; m < to; ++m) {
      const int64_t gross = gpus * kPrice;
      want[id][m] = {gpus, from_trial ? gross : 0, from_trial ? 0 : gross};
    }
  };
  full(a1, 8, m0, m0 + kMinutes, false);
  full(a2, 8, m0, m0 + kMinutes, false);
  full(a3, 4, m0 + 30, m0 + kMinutes, false);
  full(b1, 1, m0, m0 + kMinutes, true);
  // Trial first, minute by minute in (minute, instance id) order, then the
  // paid wallet.
  auto trial_first = [&](std::map<std::string, std::map<int64_t, int>> gpus) {
    int64_t left = kTrial;
    for (int64_t m = m0; m < m0 + kMinutes; ++m) {
      for (const auto& [id, by_minute] : gpus) {  // In id order.
        auto it = by_minute.find(m);
        if (it == by_minute.end()) continue;
        const int64_t gross = it->second * kPrice;
        const int64_t from_trial = std::min(left, gross);
        left -= from_trial;
        want[id][m] = {it->second, from_trial, gross - from_trial};
      }
    }
  };
  std::map<int64_t, int> c1_gpus, g1_gpus, g2_gpus;
  for (int64_t m = m0; m < m0 + kMinutes; ++m) {
    c1_gpus[m] = 8;
    g1_gpus[m] = 1;
    // Grown at m0+10 + 20 s, stopped at m0+20 + 20 s.
    if (m <= m0 + 20) g2_gpus[m] = m < m0 + 10 ? 8 : 16;
  }
  // 37 minutes of 264,000 from the trial wallet, then 232,000 of minute 37.
  trial_first({{c1, c1_gpus}});
  EXPECT_EQ(want[c1][m0 + 37].trial, kTrial - 37 * 8 * kPrice);
  // 1,980,000 (g1) and 8,448,000 (g2): each alone within the trial credit.
  trial_first({{g1, g1_gpus}, {g2, g2_gpus}});
  // 1,000,000: three minutes of 264,000, then 208,000 of the fourth; the
  // instance is stopped after the batch and nothing later is charged.
  full(d1, 8, m0, m0 + 3, false);
  want[d1][m0 + 3] = {8, 0, kMicrosPerYuan - 3 * 8 * kPrice};
  full(e1, 1, m0, m0 + kMinutes, false);
  full(e2, 8, m0, m0 + 10, false);
  full(e2, 16, m0 + 10, m0 + kMinutes, false);  // Grown at m0+10 + 20 s.
  full(f1, 2, m0, m0 + kMinutes, false);
  full(f2, 4, m0, m0 + 21, false);  // Stopped at m0+20 + 20 s.

  std::map<std::string, std::map<int64_t, Charge>> got;
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    got.clear();
    auto rows = txn.exec(
        "SELECT i.id, c.minute, c.gpu_count, c.unit_price, c.trial_micros, c.main_micros "
        "FROM ledger_charges c JOIN instances i ON i.billing_no = c.instance_no");
    for (const auto& r : rows) {
      EXPECT_EQ(r[3].as<int64_t>(), kPrice);
      got[r[0].as<std::string>()][r[1].as<int64_t>()] = {r[2].as<int>(), r[4].as<int64_t>(),
                                                          r[5].as<int64_t>()};
    }
    return absl::OkStatus();
  }).ok());
  int64_t rows = 0;
  for (const auto& [id, minutes] : want) {
    rows += minutes.size();
    for (const auto& [m, c] : minutes) {
      auto it = got[id].find(m);
      if (it == got[id].end()) {
        ADD_FAILURE() << id << " minute " << m - m0 << ": not charged";
        continue;
      }
      EXPECT_TRUE(it->second == c)
          << id << " minute " << m - m0 << ": " << it->second.gpus << " GPUs, trial "
          << it->second.trial << ", main " << it->second.main << "; want " << c.gpus
          << ", " << c.trial << ", " << c.main;
    }
    for (const auto& [m, c] : got[id]) {
      if (!minutes.contains(m)) ADD_FAILURE() << id << " minute " << m - m0 << ": extra";
    }
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ(billed->postings, rows);

  // The rest of the fourth minute is a shortfall, and so is every later
  // minute of the batch: the instance ran in all of them (it is stopped when
  // the batch's stop is applied, now, not back at the end of the fourth
  // minute). One stop, recorded at the end of what was paid.
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    auto s = txn.exec_params(
        "SELECT usage_minute, charged_micros, shortfall_micros FROM billing_shortfalls "
        "WHERE instance_id = $1 ORDER BY usage_minute",
        d1);
    EXPECT_EQ(s.size(), static_cast<size_t>(kMinutes - 3));
    for (size_t k = 0; k < s.size(); ++k) {
      EXPECT_EQ(s[k][0].as<int64_t>(), m0 + 3 + static_cast<int64_t>(k));
      EXPECT_EQ(s[k][1].as<int64_t>(), k == 0 ? kMicrosPerYuan - 3 * 8 * kPrice : 0);
      EXPECT_EQ(s[k][2].as<int64_t>(),
                k == 0 ? 4 * 8 * kPrice - kMicrosPerYuan : 8 * kPrice);
    }
    EXPECT_EQ(txn.exec("SELECT count(*) FROM billing_shortfalls")[0][0].as<int64_t>(),
              kMinutes - 3);
    auto stops = txn.exec_params(
        "SELECT (extract(epoch from stop_at))::bigint, applied FROM billing_stops "
        "WHERE instance_id = $1", d1);
    EXPECT_EQ(stops.size(), 1u);
    if (stops.size() == 1) {
      EXPECT_EQ(stops[0][0].as<int64_t>(), (m0 + 4) * 60);
      EXPECT_TRUE(stops[0][1].as<bool>());
    }
    auto stopped_at = txn.exec_params(
        "SELECT (extract(epoch from at) * 1000000)::bigint FROM instance_events "
        "WHERE instance_id = $1 AND to_state = 'STOPPED'",
        d1);
    EXPECT_EQ(stopped_at.size(), 1u);
    if (stopped_at.size() == 1) {
      EXPECT_EQ(stopped_at[0][0].as<int64_t>(), absl::ToUnixMicros(clock_.Now()));
    }
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(store_->GetInstance(poor, d1)->state, store::InstanceState::kStopped);

  // Balances: what the model charged, from the right wallets.
  auto spent = [&](const std::vector<std::string>& ids, bool from_trial) {
    int64_t sum = 0;
    for (const auto& id : ids) {
      for (const auto& [m, c] : want[id]) sum += from_trial ? c.trial : c.main;
    }
    return sum;
  };
  auto expect_balance = [&](const std::string& tenant, int64_t paid, int64_t trial_left) {
    auto b = billing_->GetBalance(tenant, clock_.Now());
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->paid_micros, paid) << tenant;
    EXPECT_EQ(b->trial_micros, trial_left) << tenant;
  };
  expect_balance(easy, kRich - spent({a1, a2, a3}, false), 0);
  expect_balance(trial, 0, kTrial - spent({b1}, true));
  expect_balance(mixed, 100 * kMicrosPerYuan - spent({c1}, false), 0);
  expect_balance(poor, 0, 0);
  expect_balance(resized, kRich - spent({e1, e2}, false), 0);
  expect_balance(stopped, kRich - spent({f1, f2}, false), 0);
  EXPECT_EQ(spent({g1, g2}, true), kTrial);
  expect_balance(split, 100 * kMicrosPerYuan - spent({g1, g2}, false), 0);

  auto failures = billing_->Audit();
  ASSERT_TRUE(failures.ok()) << failures.status();
  for (const auto& f : *failures) ADD_FAILURE() << f;

  // The next batch charges each instance still running once per minute and
  // nothing twice.
  auto next = billing_->BillMinutesBefore(m0 + kMinutes + 1, clock_.Now());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->postings, 9);  // a1 a2 a3 b1 c1 e1 e2 f1 g1
}

TEST_F(BillingBatchTest, MixedBatchAgreesWithModel) { CheckMixedBatch(false); }

TEST_F(BillingBatchTest, MixedBatchAfterCursorAgreesWithModel) { CheckMixedBatch(true); }

// The database refuses a charge row that breaks any of its conditions, and
// the auditor reports one that got past a dropped constraint.
TEST_F(BillingBatchTest, MalformedChargeRowsAreRefusedAndAudited) {
  const std::string tenant = NewTenant("rows", 1'000 * kMicrosPerYuan, true);
  const std::string id = Run(tenant, 2);
  clock_.Advance(absl::Minutes(3));
  ASSERT_TRUE(billing_->RunOnce(clock_.Now()).ok());
  const int64_t minute = MinuteOf(clock_.Now()) + 100;  // Never billed.
  // (gpu_count, unit_price, trial part, main part, trial account?, main
  // account?, revenue = the main account?)
  struct Row {
    const char* what;
    int gpus;
    int64_t price, trial, main;
    bool trial_account, main_account, revenue_pays;
  };
  const std::vector<Row> bad = {
      {"no GPU", 0, kPrice, 0, 1, false, true, false},
      {"negative trial part", 2, kPrice, -1, 2, true, true, false},
      {"negative main part", 2, kPrice, 2, -1, true, true, false},
      {"nothing charged", 2, kPrice, 0, 0, false, false, false},
      {"more than the gross", 2, kPrice, 0, 2 * kPrice + 1, false, true, false},
      {"no price", 2, 0, 0, 1, false, true, false},
      {"trial part without its account", 2, kPrice, 1, 1, false, true, false},
      {"trial account without a part", 2, kPrice, 0, 1, true, true, false},
      {"main part without its account", 2, kPrice, 0, 1, false, false, false},
      {"revenue pays itself", 2, kPrice, 0, 1, false, true, true},
  };
  auto insert = [&](const Row& r, int64_t at_minute) {
    return db_->Transact([&](pqxx::work& txn) {
      txn.exec_params(
          "INSERT INTO ledger_charges (instance_no, tenant_no, minute, gpu_count, unit_price, "
          "trial_account, trial_micros, main_account, main_micros, revenue_account, at) "
          "SELECT i.billing_no, (SELECT billing_no FROM tenants WHERE id = i.tenant_id), "
          "$2::bigint, $3::int, $4::bigint, "
          "CASE WHEN $5 THEN tw.id END, $6::bigint, CASE WHEN $7 THEN "
          "(CASE WHEN $9 THEN r.id ELSE w.id END) END, $8::bigint, r.id, now() "
          "FROM instances i, ledger_accounts w, ledger_accounts tw, ledger_accounts r "
          "WHERE i.id = $1 AND w.tenant_id = i.tenant_id AND w.kind = 'paid_wallet' "
          "AND tw.tenant_id = i.tenant_id AND tw.kind = 'trial_wallet' "
          "AND r.kind = 'platform_revenue' AND r.tenant_id IS NULL",
          id, at_minute, r.gpus, r.price, r.trial_account, r.trial, r.main_account, r.main,
          r.revenue_pays);
      return absl::OkStatus();
    });
  };
  for (const Row& r : bad) EXPECT_FALSE(insert(r, minute).ok()) << r.what;
  // A well-formed row of the same shape is accepted; the auditor reports
  // it only as a charge for a minute the instance did not run.
  ASSERT_TRUE(
      insert({"well formed", 2, kPrice, 1, 2 * kPrice - 1, true, true, false}, minute).ok());
  auto failures = billing_->Audit();
  ASSERT_TRUE(failures.ok());
  ASSERT_EQ(failures->size(), 1u);
  EXPECT_NE((*failures)[0].find("charges match RUNNING intervals"), std::string::npos)
      << (*failures)[0];

  // Past the constraint (dropped here), the auditor still finds the row.
  ASSERT_TRUE(db_->Transact([&](pqxx::work& txn) {
    txn.exec("ALTER TABLE ledger_charges DROP CONSTRAINT ledger_charges_well_formed");
    return absl::OkStatus();
  }).ok());
  ASSERT_TRUE(insert({"nothing charged", 2, kPrice, 0, 0, false, false, false}, minute + 1).ok());
  failures = billing_->Audit();
  ASSERT_TRUE(failures.ok());
  bool found = false;
  for (const auto& f : *failures) {
    found = found || f.find("charge rows are well formed") != std::string::npos;
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace sv::billing
