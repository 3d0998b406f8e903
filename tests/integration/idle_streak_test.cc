// Idle streaks on a real PostgreSQL: every telemetry batch of a node with a
// watched instance reports it idle or busy, and the row is written only when
// a streak starts or ends, so a fleet streaming every second does not
// rewrite its instances every second.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include "store/agent_store.h"
#include "store/store.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'793'613'600);  // 2026-11-02T10:00Z

class IdleStreakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = CreateMigratedDatabase(&url_);
    ASSERT_NE(db_, nullptr);
    store::Store store(*db_);
    auto tenant = store.CreateTenant({"idle", "idle@example.com", store::Role::kMember,
                                      "key-idle", "salt-idle", std::string(64, 'a')},
                                     kT0);
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    // Two instances straight in the table: one RUNNING, one STOPPED.
    Sql("INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state, "
        "request_id, request_fingerprint, created_at, updated_at, running_since) VALUES "
        "('ins-run', '" + tenant->tenant.id + "', 'r', 1, 'RTX 4090', 'ubuntu', 'RUNNING', "
        "'r1', 'f', now(), now(), now()), "
        "('ins-stop', '" + tenant->tenant.id + "', 's', 1, 'RTX 4090', 'ubuntu', 'STOPPED', "
        "'r2', 'f', now(), now(), NULL)");
  }

  void Sql(const std::string& sql) { ExecSql(url_, sql); }

  // The row's idle_since (0 when NULL) and the transaction that last wrote it.
  std::pair<int64_t, std::string> Row(const std::string& id) {
    pqxx::connection c(url_);
    pqxx::work txn(c);
    auto r = txn.exec_params1(
        "SELECT coalesce(extract(epoch from idle_since)::bigint, 0), xmin::text "
        "FROM instances WHERE id = $1",
        id);
    return {r[0].as<int64_t>(), r[1].as<std::string>()};
  }

  std::string url_;
  std::unique_ptr<store::Database> db_;
};

// Goal: a streak starts at the first idle batch and keeps its start; a busy
// batch ends it; batches that change nothing write nothing.
TEST_F(IdleStreakTest, OnlyAStartOrAnEndWritesTheRow) {
  store::AgentStore agents(*db_);
  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", true}}, kT0).ok());
  const auto started = Row("ins-run");
  EXPECT_EQ(started.first, absl::ToUnixSeconds(kT0));

  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", true}}, kT0 + absl::Seconds(1)).ok());
  EXPECT_EQ(Row("ins-run"), started) << "an idle batch during a streak rewrote the row";

  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", false}}, kT0 + absl::Seconds(2)).ok());
  const auto ended = Row("ins-run");
  EXPECT_EQ(ended.first, 0);
  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", false}}, kT0 + absl::Seconds(3)).ok());
  EXPECT_EQ(Row("ins-run"), ended) << "a busy batch outside a streak rewrote the row";

  // A new streak starts at its own first idle batch; an instance that is
  // not RUNNING starts none; one call carries both kinds.
  const auto stopped = Row("ins-stop");
  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", true}, {"ins-stop", true}},
                                       kT0 + absl::Seconds(4))
                  .ok());
  EXPECT_EQ(Row("ins-run").first, absl::ToUnixSeconds(kT0 + absl::Seconds(4)));
  EXPECT_EQ(Row("ins-stop"), stopped);
  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", false}, {"ins-stop", false}},
                                       kT0 + absl::Seconds(5))
                  .ok());
  EXPECT_EQ(Row("ins-run").first, 0);
  EXPECT_EQ(Row("ins-stop"), stopped);
}

// Goal: a streak counts only the time telemetry saw it. It was the time
// since its first idle batch, so after an outage of svd or the database (the
// busy batches lost), or while a node's telemetry was cut off, a busy
// instance was stopped as soon as the monitor ran again.
TEST_F(IdleStreakTest, AStreakDoesNotGrowWhileNoTelemetryArrives) {
  Sql("UPDATE instances SET idle_seconds = 60, idle_utilization_pct = 10 WHERE id = 'ins-run'");
  store::AgentStore agents(*db_);
  auto stopped_at = [&](absl::Time t) {
    auto stopped = agents.StopIdleInstances(t);
    EXPECT_TRUE(stopped.ok()) << stopped.status();
    return stopped.ok() && !stopped->empty();
  };
  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", true}}, kT0).ok());
  // Ten minutes with no telemetry: nothing says it stayed idle.
  EXPECT_FALSE(stopped_at(kT0 + absl::Minutes(10)));
  // Telemetry resumes, idle: the silence does not count, so a busy batch
  // soon after still ends the streak in time.
  absl::Time t = kT0 + absl::Minutes(10);
  ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", true}}, t).ok());
  EXPECT_EQ(Row("ins-run").first, absl::ToUnixSeconds(t));
  EXPECT_FALSE(stopped_at(t + absl::Seconds(1)));
  // Idle batches every second for the policy's minute: stopped.
  for (int i = 1; i <= 60; ++i) {
    ASSERT_TRUE(agents.UpdateIdleStreaks({{"ins-run", true}}, t + absl::Seconds(i)).ok());
    if (i < 60) EXPECT_FALSE(stopped_at(t + absl::Seconds(i))) << i;
  }
  EXPECT_TRUE(stopped_at(t + absl::Seconds(60)));

  // Agents told to send telemetry once a minute: their batches are a
  // streak without pause, not silences (a fixed 45 s gap kept moving the
  // start, and such instances were never stopped).
  Sql("UPDATE instances SET state = 'RUNNING', idle_since = NULL, idle_seen_at = NULL, "
      "idle_seconds = 120 WHERE id = 'ins-run'");
  const absl::Time u = t + absl::Hours(1);
  for (int i = 0; i <= 2; ++i) {
    ASSERT_TRUE(
        agents.UpdateIdleStreaks({{"ins-run", true}}, u + absl::Minutes(i), absl::Minutes(1))
            .ok());
    if (i < 2) EXPECT_FALSE(stopped_at(u + absl::Minutes(i))) << i;
  }
  EXPECT_TRUE(stopped_at(u + absl::Minutes(2)));
}

}  // namespace
}  // namespace sv::testing
