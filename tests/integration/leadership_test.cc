// Leader election and fencing against a real PostgreSQL: one leader at a
// time, takeover only after the lease lapses or is handed back, and a
// deposed leader's late writes are rejected in the database.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <pqxx/pqxx>
#include <thread>

#include "common/status.h"
#include "control/leadership.h"
#include "store/database.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using control::Leadership;
using control::LeadershipOptions;

class LeadershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = CreateMigratedDatabase(nullptr, 4);
    ASSERT_NE(db_, nullptr);
    ASSERT_TRUE(db_->Transact([](pqxx::work& txn) {
                     txn.exec("CREATE TABLE fenced_writes (id serial, who text)");
                     return absl::OkStatus();
                   }).ok());
  }

  LeadershipOptions Options(const std::string& id) {
    return {id, absl::Milliseconds(800), absl::Milliseconds(200)};
  }

  absl::Status Write(int64_t epoch, const std::string& who) {
    store::FenceScope fence(epoch);
    return db_->Transact([&](pqxx::work& txn) {
      txn.exec_params("INSERT INTO fenced_writes (who) VALUES ($1)", who);
      return absl::OkStatus();
    });
  }

  int Count(const std::string& who) {
    int n = -1;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
                     n = txn.exec_params1("SELECT count(*) FROM fenced_writes WHERE who = $1",
                                          who)[0].as<int>();
                     return absl::OkStatus();
                   }).ok());
    return n;
  }

  std::unique_ptr<store::Database> db_;
};

TEST_F(LeadershipTest, OneLeaderAndADeposedLeadersWritesAreRejected) {
  Leadership a(*db_, Options("a"));
  Leadership b(*db_, Options("b"));
  ASSERT_TRUE(a.Step().ok());
  ASSERT_TRUE(b.Step().ok());
  ASSERT_TRUE(a.is_leader());
  EXPECT_FALSE(b.is_leader()) << "two leaders at once";
  const int64_t epoch_a = *a.LeaderEpoch();
  EXPECT_EQ(b.view().holder, "a");
  EXPECT_TRUE(Write(epoch_a, "a").ok());

  // a stops renewing (a stalled process); once the lease lapses by the
  // database's clock, b takes over with a higher epoch.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  EXPECT_FALSE(a.is_leader()) << "a's own view must lapse with its lease";
  ASSERT_TRUE(b.Step().ok());
  ASSERT_TRUE(b.is_leader());
  const int64_t epoch_b = *b.LeaderEpoch();
  EXPECT_GT(epoch_b, epoch_a);

  // a's late write, fenced with its old epoch, never commits.
  absl::Status late = Write(epoch_a, "a-late");
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(ReasonOf(late), "NOT_LEADER");
  EXPECT_EQ(Count("a-late"), 0);
  EXPECT_TRUE(Write(epoch_b, "b").ok());

  // a wakes up and renews: it learns it was deposed and stays a follower.
  ASSERT_TRUE(a.Step().ok());
  EXPECT_FALSE(a.is_leader());
  EXPECT_EQ(a.view().holder, "b");
}

TEST_F(LeadershipTest, TakeoverWaitsForTheOldLeadersTransactionInFlight) {
  Leadership a(*db_, Options("a"));
  Leadership b(*db_, Options("b"));
  ASSERT_TRUE(a.Step().ok());
  const int64_t epoch_a = *a.LeaderEpoch();
  std::atomic<bool> in_body{false};
  // When the body ended: its COMMIT is sent after this, so a takeover that
  // waited for it ends later. (The time Transact returned is no bound: b
  // may be woken by the COMMIT and finish before this thread runs again.)
  std::atomic<int64_t> body_done_ms{0};
  std::thread slow([&] {
    store::FenceScope fence(epoch_a);
    absl::Status s = db_->Transact([&](pqxx::work& txn) {
      txn.exec("INSERT INTO fenced_writes (who) VALUES ('a-slow')");
      in_body = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      body_done_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  });
  while (!in_body) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The lease lapses while the write is still open; b's takeover must wait
  // for it (the fence row is share-locked), and only then b leads.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  ASSERT_TRUE(b.Step().ok());
  const int64_t led_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count();
  slow.join();
  ASSERT_TRUE(b.is_leader());
  EXPECT_GE(led_at_ms, body_done_ms.load()) << "b led while a's fenced write was open";
  EXPECT_EQ(Count("a-slow"), 1);
  EXPECT_FALSE(Write(epoch_a, "a-after").ok());
  EXPECT_EQ(Count("a-after"), 0);
}

TEST_F(LeadershipTest, StopHandsTheLeaseOverAtOnce) {
  LeadershipOptions slow_lease{"a", absl::Seconds(60), absl::Milliseconds(200)};
  Leadership a(*db_, slow_lease);
  Leadership b(*db_, LeadershipOptions{"b", absl::Seconds(60), absl::Milliseconds(200)});
  a.Start();
  ASSERT_TRUE(a.is_leader());
  ASSERT_TRUE(b.Step().ok());
  EXPECT_FALSE(b.is_leader());
  a.Stop();
  EXPECT_FALSE(a.is_leader());
  ASSERT_TRUE(b.Step().ok());
  EXPECT_TRUE(b.is_leader()) << "a graceful stop must not leave a 60 s lease behind";
  EXPECT_EQ(a.view().terms_lost, 0);
}

TEST_F(LeadershipTest, NullGateRunsUnfencedAndAFollowerGetsNoTurn) {
  store::LeaderTurn unfenced(nullptr);
  EXPECT_TRUE(unfenced.ok());
  EXPECT_FALSE(store::FenceScope::Current().has_value());
  Leadership a(*db_, Options("a"));
  Leadership b(*db_, Options("b"));
  ASSERT_TRUE(a.Step().ok());
  ASSERT_TRUE(b.Step().ok());
  {
    store::LeaderTurn turn(&b);
    EXPECT_FALSE(turn.ok());
    EXPECT_FALSE(store::FenceScope::Current().has_value());
  }
  {
    store::LeaderTurn turn(&a);
    EXPECT_TRUE(turn.ok());
    EXPECT_EQ(store::FenceScope::Current(), a.LeaderEpoch());
  }
  EXPECT_FALSE(store::FenceScope::Current().has_value());
}

}  // namespace
}  // namespace sv::testing
