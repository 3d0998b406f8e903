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
#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "store/create_batch.h"
#include "store/migrations.h"
#include "store/store.h"
#include "tests/integration/harness.h"

namespace sv::store {
namespace {

constexpr int64_t kTrialMicros = 10'000'000;

class CreateBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = sv::testing::CreateTestDatabase();
    DatabaseOptions options;
    options.url = url_;
    options.connections_max = 16;
    db_ = std::make_unique<Database>(options);
    ASSERT_TRUE(ApplyMigrations(*db_).ok());
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

  // A row another transaction holds: deleted alone after the batch, so its
  // audit row is left to the interceptor.
  auto b_listed = store_->ListInstances(b, std::nullopt, 10, false);
  ASSERT_TRUE(b_listed.ok() && !b_listed->empty());
  const std::string b_id = (*b_listed)[0].id;
  pqxx::connection holder(url_);
  pqxx::work held(holder);
  held.exec_params("SELECT 1 FROM instances WHERE id = $1 FOR NO KEY UPDATE", b_id);
  DeleteOutcome busy;
  std::thread deleter([&] { busy = store_->SubmitDelete(delete_row({b, b_id, now_}, b_user)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  held.commit();
  deleter.join();
  ASSERT_TRUE(busy.record.ok()) << busy.record.status();
  EXPECT_EQ(busy.record->state, InstanceState::kDeleted);
  EXPECT_FALSE(busy.audited);
  EXPECT_EQ(rows(absl::StrCat("method LIKE '%DeleteInstance' AND tenant_id = '", b, "'")), 0);
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
