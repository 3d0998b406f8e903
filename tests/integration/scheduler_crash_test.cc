// A crash between deciding and committing a queue pass: svd is made to
// _exit() after it has written a pass's reservations and before COMMIT.
// After a restart on the same database, the instance must be placed exactly
// once and no GPU may be reserved twice.

#include <gtest/gtest.h>

#include <cstdlib>
#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

constexpr int kCrashExitCode = 86;  // control::kCrashAfterDecideExitCode

struct Counts {
  int reservations = 0;
  int distinct_gpus = 0;
  int scheduled_events = 0;
  std::string state;
};

Counts Read(const std::string& url, const std::string& id) {
  pqxx::connection db(url);
  pqxx::work txn(db);
  Counts c;
  c.reservations = txn.exec1("SELECT count(*) FROM gpu_reservations")[0].as<int>();
  c.distinct_gpus =
      txn.exec1("SELECT count(DISTINCT (node_id, gpu_index)) FROM gpu_reservations")[0].as<int>();
  c.scheduled_events = txn.exec_params1(
      "SELECT count(*) FROM instance_events WHERE instance_id = $1 AND to_state = 'SCHEDULED'",
      id)[0].as<int>();
  c.state = txn.exec_params1("SELECT state FROM instances WHERE id = $1", id)[0].as<std::string>();
  return c;
}

std::string PendingId(const std::string& url) {
  pqxx::connection db(url);
  pqxx::work txn(db);
  auto rows = txn.exec("SELECT id FROM instances WHERE state = 'PENDING'");
  return rows.size() == 1 ? rows[0][0].as<std::string>() : "";
}

TEST(SchedulerCrashTest, CrashBeforeCommitPlacesExactlyOnceAfterRestart) {
  const std::string url = CreateTestDatabase();
  SvdProcess crashing(SvdOptions{url, 4, 1, {}});
  setenv("SV_FAULT_CRASH_AFTER_DECIDE", "1", 1);
  const bool started = crashing.Start();
  unsetenv("SV_FAULT_CRASH_AFTER_DECIDE");
  ASSERT_TRUE(started);
  const std::string token = CreateTenant(crashing, "crash");
  ASSERT_FALSE(token.empty());

  // The create commits the PENDING instance, then its placement pass
  // decides, writes the reservations and dies before COMMIT.
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(16);
  request.set_request_id("crash-1");
  v1::Instance ignored;
  auto stub = v1::InstanceService::NewStub(crashing.channel());
  grpc::Status lost = stub->CreateInstance(Context(token).get(), request, &ignored);
  EXPECT_FALSE(lost.ok()) << "svd answered although it should have crashed";
  stub.reset();
  EXPECT_EQ(crashing.Stop(), kCrashExitCode);

  const std::string id = PendingId(url);
  ASSERT_FALSE(id.empty()) << "the create should have committed before the pass";
  Counts after_crash = Read(url, id);
  EXPECT_EQ(after_crash.reservations, 0) << "an uncommitted pass left reservations";
  EXPECT_EQ(after_crash.scheduled_events, 0);
  EXPECT_EQ(after_crash.state, "PENDING");

  // Two replicas on the same database: their passes must not double-book.
  SvdProcess first(SvdOptions{url, 4, 1, {}});
  SvdProcess second(SvdOptions{url, 4, 1, {}});
  ASSERT_TRUE(first.Start());
  ASSERT_TRUE(second.Start());
  Counts placed;
  for (int tries = 0; tries < 400; ++tries) {
    placed = Read(url, id);
    if (placed.state == "RUNNING") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(placed.state, "RUNNING");
  EXPECT_EQ(placed.reservations, 16);
  EXPECT_EQ(placed.distinct_gpus, 16);
  EXPECT_EQ(placed.scheduled_events, 1) << "placed more than once";

  // The retry of the lost create returns the same, now placed, instance.
  auto retry_stub = v1::InstanceService::NewStub(second.channel());
  v1::Instance retried;
  ASSERT_TRUE(retry_stub->CreateInstance(Context(token).get(), request, &retried).ok());
  EXPECT_EQ(retried.id(), id);
  EXPECT_EQ(retried.placement_size(), 2);
  retry_stub.reset();
  EXPECT_EQ(first.Stop(), 0);
  EXPECT_EQ(second.Stop(), 0);
}

}  // namespace
}  // namespace sv::testing
