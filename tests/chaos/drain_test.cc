// Graceful shutdown: svd gets SIGTERM while clients have creates (each
// deleted again after) in flight.
// Calls already in flight finish with their real answer (creates leave
// their instance, deletes leave it deleted or stopping); calls after that
// are refused with UNAVAILABLE, never cut off with CANCELLED or INTERNAL;
// svd exits 0.
//
// Batching lines the clients up: they tend to create together and delete
// together, so at SIGTERM the calls in flight may all be deletes. Both
// kinds count as drained calls.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <pqxx/pqxx>
#include <thread>

#include "absl/strings/str_cat.h"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST(DrainTest, InFlightCallsFinishAndLaterOnesAreRefusedCleanly) {
  const std::string url = CreateTestDatabase();
  SvdProcess svd(SvdOptions{url, 8, 2,
                            {"--rate-limit-key-rps", "0", "--rate-limit-tenant-rps", "0"}});
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "drain");
  const std::string endpoint = svd.endpoint();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> sigterm_at_us{0};
  std::mutex mutex;
  std::vector<std::string> ok_ids;
  std::vector<std::pair<std::string, v1::InstanceState>> deleted_ids;
  int ok_after_sigterm = 0, refused = 0, other = 0;
  std::string other_text;
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      auto stub = v1::InstanceService::NewStub(
          grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
      for (int n = 0; !stop; ++n) {
        v1::CreateInstanceRequest request;
        request.mutable_instance()->set_gpu_count(1 + n % 2);
        request.set_request_id(absl::StrCat("d", c, "-", n));
        v1::Instance created;
        grpc::Status s = stub->CreateInstance(Context(token).get(), request, &created);
        const int64_t answered_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                        Clock::now().time_since_epoch())
                                        .count();
        if (s.ok()) {
          // Delete it again, so the tenant never reaches its limit of 1000
          // unfinished instances however fast creates are; the row stays
          // (DELETED), so the check below still finds every acknowledged one.
          v1::DeleteInstanceRequest del;
          del.set_id(created.id());
          v1::Instance deleted;
          grpc::Status d = stub->DeleteInstance(Context(token).get(), del, &deleted);
          const int64_t deleted_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                         Clock::now().time_since_epoch())
                                         .count();
          std::lock_guard<std::mutex> lock(mutex);
          if (d.ok()) {
            deleted_ids.emplace_back(created.id(), deleted.state());
            if (sigterm_at_us > 0 && deleted_us > sigterm_at_us) ++ok_after_sigterm;
          } else if (sigterm_at_us == 0 || (d.error_code() != grpc::StatusCode::UNAVAILABLE &&
                                            d.error_code() != grpc::StatusCode::CANCELLED)) {
            ++other;
            other_text += absl::StrCat("delete: ", d.error_code(), " ", d.error_message(), "; ");
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        if (s.ok()) {
          ok_ids.push_back(created.id());
          if (sigterm_at_us > 0 && answered_us > sigterm_at_us) ++ok_after_sigterm;
        } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                   (s.error_code() == grpc::StatusCode::CANCELLED && sigterm_at_us > 0)) {
          // After SIGTERM, gRPC refuses new calls with UNAVAILABLE, or
          // CANCELLED for one that reached the transport as it closed.
          // Either way no success was reported, and a client retries with
          // the same request_id; acknowledged creates are checked below.
          ++refused;
          if (sigterm_at_us == 0) other_text += "UNAVAILABLE before SIGTERM; ";
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } else {
          ++other;
          other_text += absl::StrCat(s.error_code(), " ", s.error_message(), "; ");
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  sigterm_at_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      Clock::now().time_since_epoch())
                      .count();
  EXPECT_EQ(svd.Stop(), 0) << "svd did not exit cleanly after SIGTERM";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : clients) t.join();
  std::printf("drain: %zu creates and %zu deletes answered OK (%d after SIGTERM), "
              "%d refused after\n",
              ok_ids.size(), deleted_ids.size(), ok_after_sigterm, refused);
  EXPECT_EQ(other, 0) << other_text;
  EXPECT_GT(ok_after_sigterm, 0) << "no call was in flight at SIGTERM, or none was drained";
  pqxx::connection db(url);
  pqxx::work txn(db);
  for (const std::string& id : ok_ids) {
    EXPECT_EQ(txn.exec_params1("SELECT count(*) FROM instances WHERE id = $1", id)[0].as<int>(),
              1)
        << id;
  }
  // A delete answered OK was written: the row is in the state the answer
  // gave, or already DELETED.
  for (const auto& [id, state] : deleted_ids) {
    const std::string stored =
        txn.exec_params1("SELECT state FROM instances WHERE id = $1", id)[0].as<std::string>();
    EXPECT_TRUE(stored == v1::InstanceState_Name(state) || stored == "DELETED")
        << id << " answered " << v1::InstanceState_Name(state) << ", stored " << stored;
  }
}

}  // namespace
}  // namespace sv::testing
