// The group committer behind create and delete batches (store/create_batch.h):
// under concurrent callers every request is written exactly once and gets
// its own answer, one batch is in flight unless many calls wait, it stalls
// or it has only its COMMIT left, never more than `lanes` and never two
// with the same tenant,
// batches keep the arrival order and their size limit, and a lone call
// writes at once.
#include "store/create_batch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <set>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
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

// Blocks the writer of each batch until the test lets it go, and records
// the tenants (callers) of each batch in the order they started.
class HeldWriter {
 public:
  // With `committing`, each batch says it has only its COMMIT left (twice:
  // the second call changes nothing) before it blocks.
  explicit HeldWriter(bool committing = false) : committing_(committing) {}

  std::vector<int> operator()(const std::vector<Request>& rs) {
    if (committing_) {
      BatchCommitting();
      BatchCommitting();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    std::set<int> tenants;
    for (const Request& r : rs) tenants.insert(r.caller);
    started_.push_back(tenants);
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_; });
    return std::vector<int>(rs.size(), 1);
  }
  // Waits (at most 10 s) until `n` batches have started; returns how many had.
  int WaitStarted(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(10),
                      [&] { return static_cast<int>(started_.size()) >= n; });
    return static_cast<int>(started_.size());
  }
  int Started() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(started_.size());
  }
  std::set<int> Tenants(int batch) {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_.at(batch);
  }
  // The tenants of every batch from the `first`th (0-based) on.
  std::set<int> TenantsFrom(int first) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::set<int> tenants;
    for (size_t i = first; i < started_.size(); ++i) {
      tenants.insert(started_[i].begin(), started_[i].end());
    }
    return tenants;
  }
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  const bool committing_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::set<int>> started_;
  bool released_ = false;
};

using Held = GroupCommitter<Request, int>;

// The threads of a test's calls, each made on the heap. GCC 12 warns
// (-Warray-bounds, a false positive) when emplace_back constructs a
// std::thread in a std::vector's own storage; reserve() does not help.
class Calls {
 public:
  template <typename F>
  void Start(F f) {
    threads_.push_back(std::make_unique<std::thread>(std::move(f)));
  }
  void JoinAll() {
    for (auto& t : threads_) t->join();
  }

 private:
  std::vector<std::unique_ptr<std::thread>> threads_;
};

TEST(GroupCommitterTest, AnotherBatchWaitsForTheOneInFlightUntilItStalls) {
  HeldWriter held;
  // Two lanes; another batch only after the first has run 1 s.
  Held committer(
      2, [&](const std::vector<Request>& rs) { return held(rs); }, Held::kSpreadCallsDefault,
      std::chrono::seconds(1));
  Calls calls;
  calls.Start([&] { committer.Submit("a", {1, 0}); });
  ASSERT_EQ(held.WaitStarted(1), 1);
  const auto second_submitted = std::chrono::steady_clock::now();
  calls.Start([&] { committer.Submit("b", {2, 0}); });
  // Tenant b waits while a's batch runs...
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(held.Started(), 1);
  // ...but not for ever: a batch stuck for 1 s lets b's start beside it.
  ASSERT_EQ(held.WaitStarted(2), 2);
  EXPECT_GE(std::chrono::steady_clock::now() - second_submitted, std::chrono::milliseconds(800));
  EXPECT_EQ(held.Tenants(1), std::set<int>{2});
  held.ReleaseAll();
  calls.JoinAll();
}

TEST(GroupCommitterTest, ManyWaitingCallsStartAnotherBatchButNotForATenantInFlight) {
  HeldWriter held;
  // Two lanes; another batch once 4 calls wait; no stall within the test.
  Held committer(
      2, [&](const std::vector<Request>& rs) { return held(rs); }, 4, std::chrono::hours(1));
  Calls calls;
  calls.Start([&] { committer.Submit("t1", {1, 0}); });
  ASSERT_EQ(held.WaitStarted(1), 1);
  // Tenant 1 again and tenant 2: too few waiting to start a batch.
  calls.Start([&] { committer.Submit("t1", {1, 1}); });
  calls.Start([&] { committer.Submit("t2", {2, 0}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(held.Started(), 1);
  // Tenants 3 and 4 make four waiting: the second batch starts, with every
  // waiting tenant but tenant 1, whose batch is in flight.
  calls.Start([&] { committer.Submit("t3", {3, 0}); });
  calls.Start([&] { committer.Submit("t4", {4, 0}); });
  ASSERT_EQ(held.WaitStarted(2), 2);
  EXPECT_EQ(held.Tenants(1), (std::set<int>{2, 3, 4}));
  // Both lanes are taken: nothing else starts, however many wait.
  for (int t = 5; t < 10; ++t) {
    calls.Start([&, t] { committer.Submit("t" + std::to_string(t), {t, 0}); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(held.Started(), 2);
  held.ReleaseAll();
  calls.JoinAll();
  EXPECT_EQ(held.TenantsFrom(2), (std::set<int>{1, 5, 6, 7, 8, 9}));
}

TEST(GroupCommitterTest, TheNextBatchStartsOnceTheOneInFlightIsCommitting) {
  BatchCommitting();  // Outside a writer: nothing to tell, nothing happens.
  HeldWriter held(/*committing=*/true);
  // Two lanes; no stall, and too few calls to spread, within the test.
  Held committer(
      2, [&](const std::vector<Request>& rs) { return held(rs); }, Held::kSpreadCallsDefault,
      std::chrono::hours(1));
  Calls calls;
  calls.Start([&] { committer.Submit("t1", {1, 0}); });
  ASSERT_EQ(held.WaitStarted(1), 1);
  // The first batch is committing: the next starts at once, without its
  // tenant, whose call waits for that batch to end.
  calls.Start([&] { committer.Submit("t1", {1, 1}); });
  calls.Start([&] { committer.Submit("t2", {2, 0}); });
  ASSERT_EQ(held.WaitStarted(2), 2);
  EXPECT_EQ(held.Tenants(1), std::set<int>{2});
  // Both lanes are taken, committing or not.
  calls.Start([&] { committer.Submit("t3", {3, 0}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(held.Started(), 2);
  held.ReleaseAll();
  calls.JoinAll();
  EXPECT_EQ(held.TenantsFrom(2), (std::set<int>{1, 3}));
}

TEST(GroupCommitterTest, ManyTenantsOnSeveralLanesAreEachWrittenOnceInTheirOrder) {
  constexpr int kLanes = 4;
  constexpr int kTenants = 8;
  constexpr int kCallersPerTenant = 3;
  constexpr int kCallsEach = 150;
  std::mutex mutex;
  std::multiset<int> tenants_in_flight;
  int in_flight = 0;
  int most_in_flight = 0;
  int shared_tenant = 0;  // Batches that started while another held a tenant of theirs.
  std::map<std::pair<int, int>, int> written;
  std::map<int, int> last_seq;
  int out_of_order = 0;
  // Another batch as soon as two calls wait, so that several run at once.
  GroupCommitter<Request, int> committer(
      kLanes,
      [&](const std::vector<Request>& rs) {
        std::set<int> tenants;
        for (const Request& r : rs) tenants.insert(r.caller / kCallersPerTenant);
        {
          std::lock_guard<std::mutex> lock(mutex);
          for (int t : tenants) {
            if (tenants_in_flight.count(t)) ++shared_tenant;
          }
          tenants_in_flight.insert(tenants.begin(), tenants.end());
          most_in_flight = std::max(most_in_flight, ++in_flight);
          for (const Request& r : rs) {
            ++written[{r.caller, r.seq}];
            auto it = last_seq.find(r.caller);
            if (it != last_seq.end() && r.seq <= it->second) ++out_of_order;
            last_seq[r.caller] = r.seq;
          }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        std::lock_guard<std::mutex> lock(mutex);
        for (int t : tenants) tenants_in_flight.erase(tenants_in_flight.find(t));
        --in_flight;
        std::vector<int> out;
        for (const Request& r : rs) out.push_back(r.caller * 100000 + r.seq);
        return out;
      },
      2);
  std::atomic<int> wrong_answers{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kTenants * kCallersPerTenant; ++c) {
    callers.emplace_back([&, c] {
      const std::string tenant = "t" + std::to_string(c / kCallersPerTenant);
      for (int n = 0; n < kCallsEach; ++n) {
        if (committer.Submit(tenant, {c, n}) != c * 100000 + n) ++wrong_answers;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong_answers.load(), 0);
  EXPECT_EQ(shared_tenant, 0);
  EXPECT_EQ(out_of_order, 0);
  EXPECT_LE(most_in_flight, kLanes);
  ASSERT_EQ(written.size(), static_cast<size_t>(kTenants * kCallersPerTenant * kCallsEach));
  for (const auto& [key, times] : written) EXPECT_EQ(times, 1);
}

TEST(GroupCommitterTest, AWriterThatThrowsFreesItsTenants) {
  HeldWriter held;
  std::atomic<int> batches{0};
  GroupCommitter<Request, std::string> committer(1, [&](const std::vector<Request>& rs) {
    if (batches.fetch_add(1) == 0) {
      held(rs);  // The first batch waits until the others have queued.
      throw std::runtime_error("lost the connection");
    }
    return std::vector<std::string>(rs.size(), "written");
  });
  std::string second_answer = "not answered";
  std::thread first([&] {
    EXPECT_THROW(committer.Submit("a", {1, 0}), std::runtime_error);
  });
  ASSERT_EQ(held.WaitStarted(1), 1);
  std::thread second([&] { second_answer = committer.Submit("a", {1, 1}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  held.ReleaseAll();
  first.join();
  second.join();
  // Tenant a was freed: its later calls are written.
  EXPECT_EQ(second_answer, "written");
  EXPECT_EQ(committer.Submit("a", {1, 2}), "written");
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
