// Group commit of creates (store/create_batch.h, migration 0065) on a real
// PostgreSQL: creates written by one transaction keep every guarantee a
// create has alone. Limits stay exact within a batch and across concurrent
// batches, a request_id repeated within one batch answers its first answer,
// one bad element does not fail the others, the trial is granted once, and
// the billing and budget gate refuses per element.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <pqxx/pqxx>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "control/scheduling.h"
#include "store/create_batch.h"
#include "store/store.h"
#include "tests/integration/harness.h"

namespace sv::store {
namespace {

constexpr int64_t kTrialMicros = 10'000'000;

class CreateBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = sv::testing::CreateMigratedDatabase(&url_, 16);
    ASSERT_NE(db_, nullptr);
    store_ = std::make_unique<Store>(*db_);
  }

  // A tenant with one member user; returns {tenant id, user id}.
  std::pair<std::string, std::string> NewTenant(const std::string& name) {
    auto created = store_->CreateTenant(
        {name, name + "@example.com", Role::kMember, "key-" + name, "salt-" + name,
         std::string(64, 'a')},
        now_);
    EXPECT_TRUE(created.ok()) << created.status();
    return {created->tenant.id, created->user_id};
  }

  CreateRequest Request(const std::string& tenant, const std::string& request_id,
                        const std::string& fingerprint = "f") {
    CreateRequest r;
    r.tenant_id = tenant;
    r.spec = {"", 1, "RTX 4090", "ubuntu"};
    r.request_id = request_id;
    r.fingerprint = fingerprint;
    r.now = now_;
    return r;
  }

  int64_t Scalar(const std::string& sql) {
    pqxx::connection c(url_);
    pqxx::nontransaction n(c);
    return n.exec1(sql)[0].as<int64_t>();
  }

  std::string url_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
  std::unique_ptr<Database> db_;
  std::unique_ptr<Store> store_;
};

TEST_F(CreateBatchTest, OneTransactionGivesEachElementItsOwnExactVerdict) {
  auto [a, a_user] = NewTenant("alpha");
  auto [b, b_user] = NewTenant("beta");
  auto [c, c_user] = NewTenant("gamma");
  // alpha may hold two unfinished instances.
  Scalar(absl::StrCat("INSERT INTO tenant_quotas (tenant_id, gpus_in_use_max, "
                      "pending_count_max, instances_max, updated_at) VALUES ('",
                      a, "', 1000, 1000, 2, now()) RETURNING 1"));
  std::vector<CreateRequest> batch;
  for (const char* rid : {"a1", "a2", "a3"}) {
    batch.push_back(Request(a, rid));
    batch.back().gate.trial_user_id = a_user;  // Granted once, by the first.
    batch.back().gate.trial_amount_micros = kTrialMicros;
    batch.back().gate.trial_expires_at = now_ + absl::Hours(24 * 30);
  }
  batch.push_back(Request(b, "b1"));
  batch.push_back(Request(b, "b1"));           // The same request again.
  batch.push_back(Request(b, "b1", "other"));  // The same id, other content.
  batch.push_back(Request(c, "c1"));
  batch.back().gate.credit_minutes = 10;  // gamma has no credit at all.
  batch.push_back(Request(c, "c2"));      // No gate asked: created.

  auto out = store_->CreateInstances(batch);
  ASSERT_EQ(out.size(), batch.size());
  ASSERT_TRUE(out[0].ok() && out[1].ok()) << out[0].status() << out[1].status();
  EXPECT_TRUE(out[0]->inserted);
  EXPECT_TRUE(out[1]->inserted);
  EXPECT_EQ(out[0]->record.state, InstanceState::kPending);
  ASSERT_FALSE(out[2].ok());
  EXPECT_EQ(out[2].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sv::ReasonOf(out[2].status()), "INSTANCE_LIMIT_REACHED");
  ASSERT_TRUE(out[3].ok() && out[4].ok()) << out[3].status() << out[4].status();
  EXPECT_TRUE(out[3]->inserted);
  EXPECT_FALSE(out[4]->inserted);
  EXPECT_EQ(out[4]->record.id, out[3]->record.id);
  EXPECT_EQ(out[4]->record.request_id, "b1");
  ASSERT_FALSE(out[5].ok());
  EXPECT_EQ(sv::ReasonOf(out[5].status()), "REQUEST_ID_REUSED");
  ASSERT_TRUE(out[6].ok());
  ASSERT_TRUE(out[6]->refusal.has_value());
  EXPECT_EQ(out[6]->refusal->reason, "INSUFFICIENT_CREDIT");
  EXPECT_EQ(out[6]->refusal->used, 10 * 33'000);  // Needed: 10 minutes of 1 GPU.
  EXPECT_EQ(out[6]->refusal->allowed, 0);         // Available.
  ASSERT_TRUE(out[7].ok());
  EXPECT_TRUE(out[7]->inserted);

  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM instances WHERE tenant_id = '", a, "'")),
            2);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM instances WHERE tenant_id = '", b, "'")),
            1);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM instances WHERE tenant_id = '", c, "'")),
            1);
  // The trial: one grant row, one posting, the wallet holds it once.
  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM trial_grants WHERE user_id = '", a_user,
                                "'")),
            1);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM ledger_transfers WHERE "
                                "idempotency_key = 'trial:", a_user, "'")),
            1);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT balance_micros FROM ledger_accounts WHERE tenant_id = '",
                                a, "' AND kind = 'trial_wallet'")),
            kTrialMicros);
  // Billing's own entry point to the same rule is now a no-op for alpha.
  EXPECT_EQ(Scalar(absl::StrCat("SELECT sv_grant_trial('", a_user, "', ", kTrialMicros,
                                ", now(), now())::int")),
            0);
  // A retry of an accepted create answers its first answer, credit or not.
  auto retry = store_->CreateInstances({Request(b, "b1")});
  ASSERT_TRUE(retry[0].ok());
  EXPECT_EQ(retry[0]->record.id, out[3]->record.id);
}

TEST_F(CreateBatchTest, OneBadElementDoesNotFailTheOthers) {
  auto [a, a_user] = NewTenant("alpha");
  auto [b, b_user] = NewTenant("beta");
  std::vector<CreateRequest> batch = {Request(a, "a1"), Request(b, "b1"), Request(a, "a2"),
                                      Request(b, "b2")};
  batch[1].spec.extras.library_mounts = {"no-such-item"};  // Fails the transaction.
  auto out = store_->CreateInstances(batch);
  ASSERT_EQ(out.size(), 4u);
  ASSERT_FALSE(out[1].ok());
  EXPECT_EQ(out[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sv::ReasonOf(out[1].status()), "UNKNOWN_LIBRARY_ITEM");
  for (int i : {0, 2, 3}) {
    ASSERT_TRUE(out[i].ok()) << i << ": " << out[i].status();
    EXPECT_TRUE(out[i]->inserted);
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM instances"), 3);
  EXPECT_EQ(Scalar("SELECT count(*) FROM instances WHERE request_id = 'b1'"), 0);
}

TEST_F(CreateBatchTest, SpendCapRefusesOnlyItsTenant) {
  auto [a, a_user] = NewTenant("alpha");
  auto [b, b_user] = NewTenant("beta");
  Scalar(absl::StrCat("INSERT INTO tenant_budgets (tenant_id, monthly_spend_cap_micros, "
                      "updated_at) VALUES ('", a, "', 0, now()) RETURNING 1"));
  std::vector<CreateRequest> batch = {Request(a, "a1"), Request(b, "b1")};
  for (auto& r : batch) r.gate.spend_cap_since_minute = absl::ToUnixSeconds(now_) / 60 - 60;
  auto out = store_->CreateInstances(batch);
  ASSERT_TRUE(out[0].ok() && out[1].ok());
  ASSERT_TRUE(out[0]->refusal.has_value());
  EXPECT_EQ(out[0]->refusal->reason, "SPEND_CAP_REACHED");
  EXPECT_EQ(out[0]->refusal->used, 0);     // Spent this month.
  EXPECT_EQ(out[0]->refusal->allowed, 0);  // The cap.
  EXPECT_FALSE(out[1]->refusal.has_value());
  EXPECT_TRUE(out[1]->inserted);
}

// The set-based path (migration 0085): a tenant none of whose elements
// needs the element-by-element path (no trial to grant, no request_id seen
// before or repeated in the batch) is judged in one statement, and still
// counts its limits element by element in order: with room for 2 the first
// 2 of 3 are accepted and the third sees the 2 before it. Its gate is per
// element (an 8-GPU create refused for credit does not use up room), and a
// tenant on the old path in the same batch keeps its answers.
TEST_F(CreateBatchTest, SetBasedTenantsCountTheirLimitsInOrder) {
  auto [a, a_user] = NewTenant("alpha");
  auto [b, b_user] = NewTenant("beta");
  auto [c, c_user] = NewTenant("gamma");
  auto [d, d_user] = NewTenant("delta");
  // alpha may hold 2 unfinished instances, delta 1; beta's pending quota is
  // the default below (2) and it holds one PENDING instance already; delta
  // has had its trial (10 CNY) and gamma an earlier create.
  for (const auto& [tenant, max] : {std::pair{a, 2}, std::pair{d, 1}}) {
    Scalar(absl::StrCat("INSERT INTO tenant_quotas (tenant_id, gpus_in_use_max, "
                        "pending_count_max, instances_max, updated_at) VALUES ('",
                        tenant, "', 1000, 1000, ", max, ", now()) RETURNING 1"));
  }
  ASSERT_TRUE(store_->CreateInstances({Request(b, "b0")})[0].ok());
  auto first = store_->CreateInstances({Request(c, "c0")});
  ASSERT_TRUE(first[0].ok());
  Scalar(absl::StrCat("SELECT sv_grant_trial('", d_user, "', ", kTrialMicros,
                      ", now(), now() + interval '30 days')::int"));

  std::vector<CreateRequest> batch;
  for (const char* rid : {"a1", "a2", "a3"}) batch.push_back(Request(a, rid));
  for (const char* rid : {"b1", "b2", "b3"}) {
    batch.push_back(Request(b, rid));
    batch.back().pending_max_default = 2;
  }
  batch.push_back(Request(c, "c0"));  // A retry: gamma takes the old path.
  batch.push_back(Request(c, "c1"));
  for (int gpus : {8, 1, 1}) {
    batch.push_back(Request(d, absl::StrCat("d", batch.size())));
    batch.back().spec.gpu_count = gpus;
    batch.back().gate.trial_user_id = d_user;  // Already granted: set-based.
    batch.back().gate.trial_amount_micros = kTrialMicros;
    batch.back().gate.trial_expires_at = now_ + absl::Hours(24 * 30);
    batch.back().gate.credit_minutes = 60;
  }
  auto out = store_->CreateInstances(batch);
  ASSERT_EQ(out.size(), batch.size());
  auto created = [&](size_t i) {
    return out[i].ok() && !out[i]->refusal.has_value() && out[i]->inserted;
  };
  EXPECT_TRUE(created(0) && created(1));
  ASSERT_FALSE(out[2].ok());
  EXPECT_EQ(sv::ReasonOf(out[2].status()), "INSTANCE_LIMIT_REACHED");
  EXPECT_EQ(out[2].status().message(),
            "the tenant already has 2 unfinished instances, the most allowed (2)");
  EXPECT_TRUE(created(3));
  for (size_t i : {4, 5}) {
    ASSERT_FALSE(out[i].ok()) << i;
    EXPECT_EQ(sv::ReasonOf(out[i].status()), "QUOTA_EXCEEDED");
    EXPECT_EQ(out[i].status().message(), "the tenant has 2 pending instances; its quota allows 2");
  }
  ASSERT_TRUE(out[6].ok());
  EXPECT_FALSE(out[6]->inserted);
  EXPECT_EQ(out[6]->record.id, first[0]->record.id);
  EXPECT_TRUE(created(7));
  ASSERT_TRUE(out[8].ok());
  ASSERT_TRUE(out[8]->refusal.has_value());
  EXPECT_EQ(out[8]->refusal->reason, "INSUFFICIENT_CREDIT");
  EXPECT_EQ(out[8]->refusal->used, 8 * 60 * 33'000);
  EXPECT_EQ(out[8]->refusal->allowed, kTrialMicros);
  EXPECT_TRUE(created(9));
  ASSERT_FALSE(out[10].ok());
  EXPECT_EQ(out[10].status().message(),
            "the tenant already has 1 unfinished instances, the most allowed (1)");

  // What was written: the accepted rows with one event each, in order.
  EXPECT_EQ(Scalar("SELECT count(*) FROM instances"), 2 + 5);
  EXPECT_EQ(Scalar("SELECT count(*) FROM instance_events WHERE to_state = 'PENDING'"), 7);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM instances WHERE tenant_id = '", a,
                                "' AND request_id IN ('a1', 'a2')")),
            2);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT (max(queue_seq) FILTER (WHERE request_id = 'a2') > "
                                "max(queue_seq) FILTER (WHERE request_id = 'a1'))::int FROM "
                                "instances WHERE tenant_id = '", a, "'")),
            1);
  // A create moves no money: delta's trial wallet is untouched.
  EXPECT_EQ(Scalar(absl::StrCat("SELECT balance_micros FROM ledger_accounts WHERE tenant_id = '",
                                d, "' AND kind = 'trial_wallet'")),
            kTrialMicros);
}

// sv_create_gate (one element) answers as the set-based gate does, through
// the one definition: no gate, a refusal for credit, a spend cap.
TEST_F(CreateBatchTest, OneElementGateIsTheSetBasedGate) {
  auto [a, a_user] = NewTenant("alpha");
  auto gate = [&](int gpus, int minutes, int64_t since) {
    pqxx::connection conn(url_);
    pqxx::nontransaction n(conn);
    auto row = n.exec1(absl::StrCat("SELECT verdict, coalesce(used, -1), coalesce(allowed, -1) "
                                    "FROM sv_create_gate('", a, "', ", gpus,
                                    ", 'RTX 4090', now(), ", minutes, ", ", since, ")"));
    return absl::StrCat(row[0].as<std::string>(), " ", row[1].as<int64_t>(), " ",
                        row[2].as<int64_t>());
  };
  EXPECT_EQ(gate(1, -1, -1), "OK -1 -1");
  EXPECT_EQ(gate(1, 0, -1), "OK -1 -1");
  EXPECT_EQ(gate(2, 10, -1), "INSUFFICIENT_CREDIT 660000 0");
  EXPECT_EQ(gate(1, -1, 0), "OK -1 -1");  // No budget row.
  Scalar(absl::StrCat("INSERT INTO tenant_budgets (tenant_id, monthly_spend_cap_micros, "
                      "updated_at) VALUES ('", a, "', 0, now()) RETURNING 1"));
  EXPECT_EQ(gate(1, -1, 0), "SPEND_CAP_REACHED 0 0");
  EXPECT_EQ(gate(1, 10, 0), "INSUFFICIENT_CREDIT 330000 0");  // Credit is checked first.
}

// Model-based: random batches over tenants with random limits, credit,
// retries, reused and repeated request_ids; an independent simple model,
// element by element in order, predicts every answer and the rows written.
TEST_F(CreateBatchTest, RandomBatchesMatchAnElementByElementModel) {
  struct ModelTenant {
    std::string id, user;
    int instances_max = 1000;
    int pending_max = -1;  // The batch's default; -1: none.
    bool trial = false;    // Its elements ask for the trial.
    bool granted = false;
    std::map<std::string, std::string> fingerprints;  // request_id -> fingerprint.
    int64_t unfinished = 0;
    int64_t gpus = 0;  // Of the unfinished instances: their rent is committed.
  };
  std::mt19937 random(20261130);
  std::vector<ModelTenant> tenants;
  for (int t = 0; t < 5; ++t) {
    ModelTenant m;
    std::tie(m.id, m.user) = NewTenant(absl::StrCat("m", t));
    // Tenant 3 asks for the trial and has room, so its credit binds.
    m.instances_max = t == 0 || t == 3 ? 1000 : static_cast<int>(random() % 6);
    m.pending_max = t % 2 == 0 ? static_cast<int>(random() % 5) : -1;
    m.trial = t >= 2;
    if (t != 0) {
      Scalar(absl::StrCat("INSERT INTO tenant_quotas (tenant_id, gpus_in_use_max, "
                          "pending_count_max, instances_max, updated_at) VALUES ('",
                          m.id, "', 1000, 1000, ", m.instances_max, ", now()) RETURNING 1"));
    }
    tenants.push_back(m);
  }
  int checked = 0;
  int refused_for_committed = 0;  // Would fit alone, not with the tenant's others.
  for (int round = 0; round < 12; ++round) {
    std::vector<CreateRequest> batch;
    std::vector<size_t> owner;
    const int size = 1 + static_cast<int>(random() % 12);
    for (int e = 0; e < size; ++e) {
      const size_t t = random() % tenants.size();
      CreateRequest r = Request(tenants[t].id, absl::StrCat("r", random() % 8),
                                random() % 4 == 0 ? "g" : "f");
      r.spec.gpu_count = random() % 3 == 0 ? 8 : 1;
      r.pending_max_default = tenants[t].pending_max;
      if (tenants[t].trial) {
        r.gate.trial_user_id = tenants[t].user;
        r.gate.trial_amount_micros = kTrialMicros;
        r.gate.trial_expires_at = now_ + absl::Hours(24 * 30);
        // 1 GPU: 1.98 CNY, so at most five; 8 GPUs: 15.84 (over 10).
        r.gate.credit_minutes = 60;
      }
      batch.push_back(r);
      owner.push_back(t);
    }
    auto out = store_->CreateInstances(batch);
    ASSERT_EQ(out.size(), batch.size());
    // The model, in array order per tenant (tenants are independent).
    for (size_t i = 0; i < batch.size(); ++i) {
      ModelTenant& m = tenants[owner[i]];
      const CreateRequest& r = batch[i];
      const std::string where = absl::StrCat("round ", round, " element ", i);
      if (m.trial) m.granted = true;
      if (auto seen = m.fingerprints.find(r.request_id); seen != m.fingerprints.end()) {
        if (seen->second == r.fingerprint) {
          ASSERT_TRUE(out[i].ok()) << where << out[i].status();
          EXPECT_FALSE(out[i]->inserted) << where;
        } else {
          EXPECT_EQ(sv::ReasonOf(out[i].status()), "REQUEST_ID_REUSED") << where;
        }
        ++checked;
        continue;
      }
      // The gate covers the tenant's instances accepted before this one too.
      const int64_t needed = int64_t{33'000} * (m.gpus + r.spec.gpu_count) * 60;
      if (m.trial && needed > kTrialMicros) {
        if (int64_t{33'000} * r.spec.gpu_count * 60 <= kTrialMicros) ++refused_for_committed;
        ASSERT_TRUE(out[i].ok()) << where << out[i].status();
        ASSERT_TRUE(out[i]->refusal.has_value()) << where;
        EXPECT_EQ(out[i]->refusal->reason, "INSUFFICIENT_CREDIT") << where;
        EXPECT_EQ(out[i]->refusal->used, needed) << where;
        EXPECT_EQ(out[i]->refusal->allowed, kTrialMicros) << where;
      } else if (m.unfinished >= m.instances_max) {
        EXPECT_EQ(sv::ReasonOf(out[i].status()), "INSTANCE_LIMIT_REACHED") << where;
        EXPECT_EQ(out[i].status().message(),
                  absl::StrCat("the tenant already has ", m.unfinished,
                               " unfinished instances, the most allowed (", m.instances_max,
                               ")"))
            << where;
      } else if (m.pending_max >= 0 && m.unfinished >= m.pending_max) {
        EXPECT_EQ(sv::ReasonOf(out[i].status()), "QUOTA_EXCEEDED") << where;
        EXPECT_EQ(out[i].status().message(),
                  absl::StrCat("the tenant has ", m.unfinished, " pending instances; its quota "
                               "allows ", m.pending_max))
            << where;
      } else {
        ASSERT_TRUE(out[i].ok()) << where << out[i].status();
        EXPECT_FALSE(out[i]->refusal.has_value()) << where;
        EXPECT_TRUE(out[i]->inserted) << where;
        m.fingerprints[r.request_id] = r.fingerprint;
        ++m.unfinished;
        m.gpus += r.spec.gpu_count;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
  EXPECT_GT(refused_for_committed, 0);
  for (const ModelTenant& m : tenants) {
    EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM instances WHERE tenant_id = '", m.id,
                                  "' AND state = 'PENDING'")),
              m.unfinished)
        << m.id;
    EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM trial_grants WHERE user_id = '", m.user,
                                  "'")),
              m.granted ? 1 : 0)
        << m.id;
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM instance_events"),
            Scalar("SELECT count(*) FROM instances"));
}

// The queue pass skips a PENDING instance whose row another transaction
// holds (a delete batch about to commit) instead of waiting for that COMMIT
// while it holds the rows it placed, and a later pass places it when the
// other transaction leaves it PENDING. (Waiting, the pass would fail on the
// lock timeout.)
TEST_F(CreateBatchTest, QueuePassSkipsAHeldRowAndPlacesItLater) {
  auto [a, a_user] = NewTenant("alpha");
  ASSERT_TRUE(sv::testing::AddSimulatedNodes(*store_, 1, 1, now_).ok());
  auto created = store_->CreateInstances({Request(a, "a1"), Request(a, "a2")});
  ASSERT_TRUE(created[0].ok() && created[1].ok());
  const std::string a1 = created[0]->record.id, a2 = created[1]->record.id;
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  pqxx::connection holder(url_);
  pqxx::work held(holder);
  held.exec_params("SELECT 1 FROM instances WHERE id = $1 FOR NO KEY UPDATE", a2);
  auto first = scheduling.RunPass(now_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->placed, 1);
  auto state_of = [&](const std::string& id) {
    auto got = store_->GetInstance(a, id);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->state : InstanceState::kFailed;
  };
  EXPECT_EQ(state_of(a1), InstanceState::kScheduled);
  EXPECT_EQ(state_of(a2), InstanceState::kPending);
  EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM gpu_reservations WHERE instance_id = '",
                                a2, "'")),
            0);
  held.abort();  // The other transaction leaves it PENDING.
  auto second = scheduling.RunPass(now_ + absl::Seconds(1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->placed, 1);
  EXPECT_EQ(state_of(a2), InstanceState::kScheduled);
  EXPECT_EQ(Scalar("SELECT count(*) FROM gpu_reservations"), 2);
}

// Nor does the pass wait for a waiting instance's row to write its new
// reason: it holds the rows it placed, and a delete batch waiting for its
// rows in id order may hold that one while it waits for one of those. The
// row keeps its old reason until a pass finds it free.
TEST_F(CreateBatchTest, QueuePassSkipsAHeldWaitingRow) {
  auto [a, a_user] = NewTenant("alpha");
  ASSERT_TRUE(sv::testing::AddSimulatedNodes(*store_, 1, 1, now_).ok());
  std::vector<CreateRequest> requests = {Request(a, "a1"), Request(a, "a2")};
  for (CreateRequest& r : requests) r.spec.gpu_count = 8;
  auto created = store_->CreateInstances(requests);
  ASSERT_TRUE(created[0].ok() && created[1].ok());
  const std::string a1 = created[0]->record.id, a2 = created[1]->record.id;
  auto reason_of = [&](const std::string& id) {
    auto got = store_->GetInstance(a, id);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->state_reason : std::string();
  };
  const std::string accepted = reason_of(a2);
  control::Scheduling scheduling(*db_, control::SchedulingOptions{});
  {
    pqxx::connection holder(url_);
    pqxx::work held(holder);
    held.exec_params("SELECT 1 FROM instances WHERE id = $1 FOR NO KEY UPDATE", a2);
    auto pass = scheduling.RunPass(now_);
    ASSERT_TRUE(pass.ok()) << pass.status();  // Waiting, it would fail on the lock timeout.
    EXPECT_EQ(pass->placed, 1);
    EXPECT_EQ(pass->waiting, 1);
    held.abort();
  }
  EXPECT_EQ(reason_of(a2), accepted);
  auto again = scheduling.RunPass(now_ + absl::Seconds(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(reason_of(a2), accepted);
  EXPECT_NE(reason_of(a2).find("waiting for capacity"), std::string::npos) << reason_of(a2);
  (void)a1;
}

// Deletes of one batch: each its own answer, another tenant's instance is
// NOT_FOUND, a repeated delete answers the DELETED row, and a row another
// transaction holds is deleted alone once that one commits.
TEST_F(CreateBatchTest, DeleteBatchAnswersEachAndWaitsOnlyForHeldRows) {
  auto [a, a_user] = NewTenant("alpha");
  auto [b, b_user] = NewTenant("beta");
  auto created = store_->CreateInstances({Request(a, "a1"), Request(a, "a2"), Request(b, "b1")});
  for (const auto& c : created) ASSERT_TRUE(c.ok()) << c.status();
  const std::string a1 = created[0]->record.id, a2 = created[1]->record.id,
                    b1 = created[2]->record.id;
  // Another transaction holds a2's row until it commits.
  pqxx::connection holder(url_);
  pqxx::work held(holder);
  held.exec_params("SELECT 1 FROM instances WHERE id = $1 FOR NO KEY UPDATE", a2);
  std::vector<absl::StatusOr<InstanceRecord>> out;
  std::thread deleter([&] {
    out = store_->DeleteInstances(
        {{a, a1, now_}, {a, b1, now_}, {a, a1, now_}, {a, a2, now_}, {b, b1, now_}});
  });
  // The batch commits without waiting for a2: a1 and b1 become DELETED
  // while a2's row is still held.
  const std::string deleted_sql = absl::StrCat(
      "SELECT count(*) FROM instances WHERE state = 'DELETED' AND id IN ('", a1, "', '", b1,
      "')");
  for (int i = 0; i < 200 && Scalar(deleted_sql) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Scalar(deleted_sql), 2);
  held.commit();
  deleter.join();
  ASSERT_EQ(out.size(), 5u);
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  EXPECT_EQ(out[0]->state, InstanceState::kDeleted);
  ASSERT_FALSE(out[1].ok());  // beta's instance, asked for as alpha.
  EXPECT_EQ(out[1].status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(out[2].ok());
  EXPECT_EQ(out[2]->id, a1);
  EXPECT_EQ(out[2]->state, InstanceState::kDeleted);
  ASSERT_TRUE(out[3].ok()) << out[3].status();
  EXPECT_EQ(out[3]->state, InstanceState::kDeleted);
  ASSERT_TRUE(out[4].ok());
  EXPECT_EQ(out[4]->state, InstanceState::kDeleted);
  // One DELETED event each, the repeated delete wrote none.
  EXPECT_EQ(Scalar("SELECT count(*) FROM instance_events WHERE to_state = 'DELETED'"), 3);
}

// The calls' audit rows (issue 9): a batch commits the row of each element
// that created its instance or deleted (or re-answered) its row, in the same
// transaction; any other answer, and every element redone alone after a
// failed batch or deleted alone after a held row, leaves its row to the
// interceptor (audited = false, no row written here).
TEST_F(CreateBatchTest, AuditRowsCommitWithTheirElementsOnly) {
  auto [a, a_user] = NewTenant("alpha");
  auto [b, b_user] = NewTenant("beta");
  auto [c, c_user] = NewTenant("gamma");
  Scalar(absl::StrCat("INSERT INTO tenant_quotas (tenant_id, gpus_in_use_max, "
                      "pending_count_max, instances_max, updated_at) VALUES ('",
                      a, "', 1000, 1000, 1, now()) RETURNING 1"));
  auto audited = [&](CreateRequest r, const std::string& user) {
    AuditRow row;
    row.at = now_;
    row.tenant_id = r.tenant_id;
    row.user_id = user;
    row.user_email = "someone@example.com";
    row.api_key_id = "key-x";
    row.method = "/sv.v1.InstanceService/CreateInstance";
    row.request_id = r.request_id;
    row.code = "OK";
    row.peer = "ipv4:127.0.0.1:1";
    r.audit = row;
    return r;
  };
  auto rows = [&](const std::string& where) {
    return Scalar("SELECT count(*) FROM audit_log WHERE " + where);
  };
  auto out = store_->CreateInstances({audited(Request(a, "a1"), a_user),
                                      audited(Request(a, "a2"), a_user),  // Over the limit.
                                      audited(Request(b, "b1"), b_user),
                                      audited(Request(b, "b1"), b_user),  // Answered EXISTS.
                                      Request(b, "b2")});                 // No row asked.
  ASSERT_EQ(out.size(), 5u);
  ASSERT_TRUE(out[0].ok() && out[2].ok() && out[3].ok() && out[4].ok());
  EXPECT_TRUE(out[0]->audited);
  EXPECT_EQ(sv::ReasonOf(out[1].status()), "INSTANCE_LIMIT_REACHED");
  EXPECT_TRUE(out[2]->audited);
  EXPECT_FALSE(out[3]->inserted);
  EXPECT_FALSE(out[3]->audited);
  EXPECT_FALSE(out[4]->audited);
  EXPECT_EQ(rows("true"), 2);
  EXPECT_EQ(rows(absl::StrCat("request_id = 'a1' AND tenant_id = '", a, "' AND code = 'OK' ",
                              "AND user_id = '", a_user, "' AND peer = 'ipv4:127.0.0.1:1'")),
            1);
  EXPECT_EQ(rows("request_id = 'b1'"), 1);

  // A failed batch: each element is redone alone, without its row.
  std::vector<CreateRequest> failing = {audited(Request(c, "c1"), c_user),
                                        audited(Request(c, "c2"), c_user)};
  failing[1].spec.extras.library_mounts = {"no-such-item"};
  out = store_->CreateInstances(failing);
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  EXPECT_TRUE(out[0]->inserted);
  EXPECT_FALSE(out[0]->audited);
  EXPECT_FALSE(out[1].ok());
  EXPECT_EQ(rows(absl::StrCat("tenant_id = '", c, "'")), 0);

  // Deletes: the row answered is audited with it; NOT_FOUND is not.
  auto delete_row = [&](DeleteRequest r, const std::string& user) {
    AuditRow row;
    row.at = now_;
    row.tenant_id = r.tenant_id;
    row.user_id = user;
    row.method = "/sv.v1.InstanceService/DeleteInstance";
    row.code = "OK";
    r.audit = row;
    return r;
  };
  auto listed = store_->ListInstances(a, std::nullopt, 10, false);
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  const std::string a_id = (*listed)[0].id;
  DeleteOutcome deleted = store_->SubmitDelete(delete_row({a, a_id, now_}, a_user));
  ASSERT_TRUE(deleted.record.ok()) << deleted.record.status();
  EXPECT_TRUE(deleted.audited);
  DeleteOutcome again = store_->SubmitDelete(delete_row({a, a_id, now_}, a_user));
  ASSERT_TRUE(again.record.ok());
  EXPECT_TRUE(again.audited);  // Answered OK (already DELETED): audited too.
  DeleteOutcome other = store_->SubmitDelete(delete_row({b, a_id, now_}, b_user));
  EXPECT_EQ(other.record.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(other.audited);
  EXPECT_EQ(rows("method LIKE '%DeleteInstance'"), 2);
  EXPECT_EQ(rows(absl::StrCat("method LIKE '%DeleteInstance' AND tenant_id = '", b, "'")), 0);

  // A row another transaction holds: deleted by a second batch that waits
  // for it (migration 0097), its audit row with it.
  auto b_listed = store_->ListInstances(b, std::nullopt, 10, false);
  ASSERT_TRUE(b_listed.ok() && !b_listed->empty());
  const std::string b_id = (*b_listed)[0].id;
  auto events = [&](const std::string& id) {
    return Scalar(absl::StrCat("SELECT count(*) FROM instance_events WHERE instance_id = '", id,
                               "' AND to_state = 'DELETED'"));
  };
  // Deletes `id` while another transaction, which first runs `hold` ($1 is
  // the id), holds its row; that one commits 200 ms later.
  auto delete_held = [&](const std::string& tenant, const std::string& user,
                         const std::string& id, const std::vector<std::string>& hold) {
    pqxx::connection holder(url_);
    pqxx::work held(holder);
    for (const std::string& sql : hold) held.exec_params(sql, id);
    DeleteOutcome busy;
    std::thread deleter(
        [&] { busy = store_->SubmitDelete(delete_row({tenant, id, now_}, user)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    held.commit();
    deleter.join();
    return busy;
  };
  DeleteOutcome busy =
      delete_held(b, b_user, b_id, {"SELECT 1 FROM instances WHERE id = $1 FOR NO KEY UPDATE"});
  ASSERT_TRUE(busy.record.ok()) << busy.record.status();
  EXPECT_EQ(busy.record->state, InstanceState::kDeleted);
  EXPECT_TRUE(busy.audited);
  EXPECT_EQ(rows(absl::StrCat("method LIKE '%DeleteInstance' AND tenant_id = '", b, "'")), 1);
  EXPECT_EQ(events(b_id), 1);
  // The holder deletes the row itself before it lets go: the waiting batch
  // sees the newest version, answers it as it is and writes nothing more.
  const auto c_created = store_->CreateInstances({Request(c, "c3")});
  ASSERT_TRUE(c_created[0].ok()) << c_created[0].status();
  const std::string c_id = c_created[0]->record.id;
  busy = delete_held(c, c_user, c_id,
                     {"UPDATE instances SET state = 'DELETED', state_reason = 'held and deleted' "
                      "WHERE id = $1",
                      "INSERT INTO instance_events (instance_id, at, from_state, to_state, "
                      "reason) VALUES ($1, now(), 'PENDING', 'DELETED', 'held and deleted')"});
  ASSERT_TRUE(busy.record.ok()) << busy.record.status();
  EXPECT_EQ(busy.record->state, InstanceState::kDeleted);
  EXPECT_EQ(busy.record->state_reason, "held and deleted");
  EXPECT_EQ(events(c_id), 1);
}

// Many callers of several tenants at once through the batcher: each
// tenant's pending quota admits exactly its quota, however the creates were
// grouped, and the two callers sharing a request_id get one instance.
TEST_F(CreateBatchTest, ConcurrentBatchesKeepEveryTenantsQuotaExact) {
  constexpr int kTenants = 6;
  constexpr int kCallersPerTenant = 16;
  constexpr int kQuota = 3;
  store_->SetCreateBatchLanes(2);
  std::vector<std::string> tenants;
  for (int t = 0; t < kTenants; ++t) tenants.push_back(NewTenant(absl::StrCat("t", t)).first);
  std::mutex mutex;
  std::map<std::string, std::set<std::string>> inserted_ids, answered_ids;
  std::map<std::string, std::map<std::string, std::set<std::string>>> ids_by_request;
  std::atomic<int> refused{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kTenants; ++t) {
    for (int c = 0; c < kCallersPerTenant; ++c) {
      threads.emplace_back([&, t, c] {
        CreateRequest r = Request(tenants[t], absl::StrCat("r", c / 2));  // Pairs share one.
        r.pending_max_default = kQuota;
        auto outcome = store_->SubmitCreate(r);
        std::lock_guard<std::mutex> lock(mutex);
        if (!outcome.ok()) {
          if (sv::ReasonOf(outcome.status()) == "QUOTA_EXCEEDED") {
            ++refused;
          } else {
            ++wrong;
            ADD_FAILURE() << outcome.status();
          }
          return;
        }
        if (outcome->inserted) inserted_ids[tenants[t]].insert(outcome->record.id);
        answered_ids[tenants[t]].insert(outcome->record.id);
        ids_by_request[tenants[t]][r.request_id].insert(outcome->record.id);
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  for (const auto& tenant : tenants) {
    EXPECT_EQ(inserted_ids[tenant].size(), static_cast<size_t>(kQuota)) << tenant;
    EXPECT_EQ(answered_ids[tenant], inserted_ids[tenant]) << tenant;
    for (const auto& [rid, ids] : ids_by_request[tenant]) EXPECT_EQ(ids.size(), 1u) << rid;
    EXPECT_EQ(Scalar(absl::StrCat("SELECT count(*) FROM instances WHERE tenant_id = '", tenant,
                                  "' AND state = 'PENDING'")),
              kQuota);
  }
  EXPECT_GE(refused.load(), kTenants * (kCallersPerTenant / 2 - kQuota));
}

}  // namespace
}  // namespace sv::store
