// The group committer behind create and delete batches (store/create_batch.h):
// under concurrent callers every request is written exactly once and gets
// its own answer, a lane never writes two batches at once, batches keep the
// arrival order and their size limit, and a lone call writes at once.
#include "store/create_batch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sv::store {
namespace {

struct Request {
  int caller = 0;
  int seq = 0;
};

TEST(GroupCommitterTest, LoneCallIsWrittenAtOnceAndAnswered) {
  int batches = 0;
  GroupCommitter<Request, int> committer(2, [&](const std::vector<Request>& rs) {
    ++batches;
    std::vector<int> out;
    for (const Request& r : rs) out.push_back(r.seq * 10);
    return out;
  });
  EXPECT_EQ(committer.Submit("t1", {0, 4}), 40);
  EXPECT_EQ(committer.Submit("t2", {0, 5}), 50);
  EXPECT_EQ(batches, 2);
}

TEST(GroupCommitterTest, ConcurrentCallsAreEachWrittenOnceInOrder) {
  constexpr int kCallers = 24;
  constexpr int kCallsEach = 300;
  std::mutex mutex;
  std::map<std::pair<int, int>, int> written;  // (caller, seq) -> times written
  std::vector<size_t> sizes;
  std::atomic<int> in_flight{0};
  std::atomic<int> overlaps{0};
  std::map<int, int> last_seq;  // Per caller: sequence numbers only grow.
  int out_of_order = 0;
  // One lane: every batch of this committer must be written alone.
  GroupCommitter<Request, std::string> committer(1, [&](const std::vector<Request>& rs) {
    if (in_flight.fetch_add(1) != 0) ++overlaps;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::vector<std::string> out;
    {
      std::lock_guard<std::mutex> lock(mutex);
      sizes.push_back(rs.size());
      for (const Request& r : rs) {
        ++written[{r.caller, r.seq}];
        auto it = last_seq.find(r.caller);
        if (it != last_seq.end() && r.seq <= it->second) ++out_of_order;
        last_seq[r.caller] = r.seq;
        out.push_back(std::to_string(r.caller) + ":" + std::to_string(r.seq));
      }
    }
    in_flight.fetch_sub(1);
    return out;
  });
  std::atomic<int> wrong_answers{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int n = 0; n < kCallsEach; ++n) {
        const std::string answer = committer.Submit("tenant", {c, n});
        if (answer != std::to_string(c) + ":" + std::to_string(n)) ++wrong_answers;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong_answers.load(), 0);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(out_of_order, 0);
  ASSERT_EQ(written.size(), static_cast<size_t>(kCallers * kCallsEach));
  for (const auto& [key, times] : written) EXPECT_EQ(times, 1);
  size_t largest = 0;
  for (size_t s : sizes) largest = std::max(largest, s);
  EXPECT_LE(largest, (GroupCommitter<Request, std::string>::kBatchCallsMax));
  // Calls did share transactions: fewer batches than calls.
  EXPECT_LT(sizes.size(), static_cast<size_t>(kCallers * kCallsEach));
}

TEST(GroupCommitterTest, BatchesAreCappedAndTheRestWrittenNext) {
  constexpr int kCallers = 300;
  std::mutex mutex;
  std::vector<size_t> sizes;
  std::atomic<bool> release{false};
  std::atomic<int> started{0};
  GroupCommitter<Request, int> committer(1, [&](const std::vector<Request>& rs) {
    // The first batch holds the lane until every caller has queued.
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mutex);
    sizes.push_back(rs.size());
    return std::vector<int>(rs.size(), 1);
  });
  std::vector<std::thread> callers;
  std::atomic<int> answered{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      ++started;
      answered += committer.Submit("t", {c, 0});
    });
  }
  while (started.load() < kCallers) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release = true;
  for (auto& t : callers) t.join();
  EXPECT_EQ(answered.load(), kCallers);
  size_t total = 0;
  for (size_t s : sizes) {
    EXPECT_LE(s, (GroupCommitter<Request, int>::kBatchCallsMax));
    total += s;
  }
  EXPECT_EQ(total, static_cast<size_t>(kCallers));
}

}  // namespace
}  // namespace sv::store
