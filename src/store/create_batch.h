#ifndef SV_STORE_CREATE_BATCH_H_
#define SV_STORE_CREATE_BATCH_H_

// Group commit of creates and deletes (docs/reliability.md, "Benchmark"):
// the calls that arrive while a batch is being written wait, and one of
// them writes them all in one transaction (Store::CreateInstances,
// Store::DeleteInstances); every call returns its own answer once that
// transaction has committed.
//
// One batch is in flight at a time as a rule. Fewer, larger batches cost
// less per call than several small ones side by side, which also contend
// for the same index pages (docs/reliability.md, "One batch in flight").
// Another batch, up to `lanes` in all, starts only when `spread_calls`
// calls wait, more than one batch can hold, when the oldest batch in
// flight has run `stall_after` (a lock wait, say), so that one stuck batch
// does not hold up every tenant, or when every batch in flight has only
// its COMMIT left (its writer called BatchCommitting()): the next batch's
// statements then run during that round trip and WAL flush instead of
// after it (docs/reliability.md, "The next batch during the COMMIT"). A
// tenant is in at most one batch in
// flight, so batches in flight never wait on each other's tenant rows and
// a tenant's calls are written in the order they arrived.

#include <algorithm>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sv::store {

// The hook of the batch this thread is writing, if any (BatchCommitting()).
namespace internal {
inline thread_local std::function<void()>* batch_committing = nullptr;
}  // namespace internal

// Tells the group committer whose batch this thread is writing that only
// the COMMIT is left, so the next batch may start its statements meanwhile.
// A no-op outside a writer, and after its first call per batch.
inline void BatchCommitting() {
  if (auto* hook = internal::batch_committing) (*hook)();
}

template <typename Request, typename Result>
class GroupCommitter {
 public:
  // At most this many calls per transaction; more wait for the next one.
  static constexpr size_t kBatchCallsMax = 128;
  // Waiting calls that start another batch beside those in flight.
  static constexpr size_t kSpreadCallsDefault = kBatchCallsMax / 2;
  // How long the oldest batch in flight runs before another may start.
  static constexpr std::chrono::milliseconds kStallAfterDefault{100};
  // Writes a batch and returns one result per request, in order.
  using Writer = std::function<std::vector<Result>(const std::vector<Request>&)>;
  using Clock = std::chrono::steady_clock;

  GroupCommitter(int lanes, Writer writer, size_t spread_calls = kSpreadCallsDefault,
                 Clock::duration stall_after = kStallAfterDefault)
      : lanes_(lanes),
        spread_calls_(std::max<size_t>(1, spread_calls)),
        stall_after_(stall_after),
        writer_(std::move(writer)) {
    assert(lanes > 0);
  }
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Returns once the batch holding `request` has been written.
  Result Submit(const std::string& tenant_id, Request request) {
    auto slot = std::make_shared<Slot>(tenant_id, std::move(request));
    std::unique_lock<std::mutex> lock(mutex_);
    queue_.push_back(slot);
    WakeAfterUnlock(lock, FormBatchesLocked());
    lock.lock();
    // Wait until another call has written this call's batch, or until this
    // call is handed a batch to write. Each call waits on its own condition,
    // so a commit wakes only the calls it answered and the writers of the
    // next batches, not every call queued. A waiting call looks again after
    // `stall_after_`, in case the batches in flight are stuck.
    while (!slot->done && slot->batch.empty()) {
      if (slot->woken.wait_for(lock, stall_after_) == std::cv_status::timeout) {
        WakeAfterUnlock(lock, FormBatchesLocked());
        lock.lock();
      }
    }
    if (slot->done) return std::move(slot->result);
    std::vector<std::shared_ptr<Slot>> batch = std::move(slot->batch);
    slot->batch.clear();
    const auto started = slot->started;
    lock.unlock();
    // A writer that throws still frees its tenants, else their later calls
    // would wait for ever: the others of its batch get a default-made
    // Result (an UNKNOWN error for a StatusOr), this call the exception.
    std::exception_ptr failed;
    std::function<void()> committing = [this, started] {
      std::unique_lock<std::mutex> l(mutex_);
      if (started->committing) return;
      started->committing = true;
      WakeAfterUnlock(l, FormBatchesLocked());
    };
    std::function<void()>* const outer = internal::batch_committing;
    internal::batch_committing = &committing;
    try {
      Write(batch);
    } catch (...) {
      failed = std::current_exception();
    }
    internal::batch_committing = outer;
    lock.lock();
    std::vector<std::shared_ptr<Slot>> wake;
    wake.reserve(batch.size());
    for (auto& s : batch) {
      s->done = true;
      busy_tenants_.erase(s->tenant_id);
      if (s != slot) wake.push_back(s);
    }
    in_flight_.erase(started);
    // The calls that arrived meanwhile, and the waiting calls of this
    // batch's tenants.
    for (auto& w : FormBatchesLocked()) wake.push_back(std::move(w));
    WakeAfterUnlock(lock, std::move(wake));
    if (failed) std::rethrow_exception(failed);
    return std::move(slot->result);
  }

 private:
  // A batch in flight: when it started, and whether only its COMMIT is left.
  struct InFlight {
    Clock::time_point started;
    bool committing = false;
  };
  struct Slot {
    Slot(std::string t, Request r) : tenant_id(std::move(t)), request(std::move(r)) {}
    std::string tenant_id;
    Request request;
    bool done = false;  // Written; `result` holds this call's answer.
    // Handed to this call to write: its own request and those queued with
    // it, and where its start is recorded in `in_flight_`.
    std::vector<std::shared_ptr<Slot>> batch;
    typename std::list<InFlight>::iterator started;
    std::condition_variable woken;
    Result result;
  };

  // Whether another batch may start now beside those in flight.
  bool MayStartLocked() const {
    if (in_flight_.empty()) return true;
    if (static_cast<int>(in_flight_.size()) >= lanes_) return false;
    if (std::all_of(in_flight_.begin(), in_flight_.end(),
                    [](const InFlight& f) { return f.committing; })) {
      return true;
    }
    return queue_.size() >= spread_calls_ ||
           Clock::now() - in_flight_.front().started >= stall_after_;
  }

  // Unlocks, then wakes `slots`. A call woken while the lock is still held
  // would only block on it again: a second sleep and wake-up per call. The
  // shared pointers keep each slot's condition alive even if its call has
  // already seen `done` and returned.
  static void WakeAfterUnlock(std::unique_lock<std::mutex>& lock,
                              std::vector<std::shared_ptr<Slot>> slots) {
    lock.unlock();
    for (const auto& s : slots) s->woken.notify_one();
  }

  // Forms the next batches from the queue while MayStartLocked(): in
  // arrival order, every waiting call whose tenant is in no batch in
  // flight, up to kBatchCallsMax. The oldest call in a batch writes it.
  // Returns those writers, to be woken once the lock is released.
  [[nodiscard]] std::vector<std::shared_ptr<Slot>> FormBatchesLocked() {
    std::vector<std::shared_ptr<Slot>> writers;
    while (!queue_.empty() && MayStartLocked()) {
      std::vector<std::shared_ptr<Slot>> batch;
      std::set<std::string> taken;  // Tenants of this batch.
      for (auto it = queue_.begin(); it != queue_.end() && batch.size() < kBatchCallsMax;) {
        const std::string& tenant = (*it)->tenant_id;
        if (busy_tenants_.count(tenant)) {
          ++it;
          continue;
        }
        taken.insert(tenant);
        batch.push_back(std::move(*it));
        it = queue_.erase(it);
      }
      if (batch.empty()) break;  // Every waiting call's tenant is in flight.
      busy_tenants_.insert(taken.begin(), taken.end());
      std::shared_ptr<Slot> writer = batch.front();
      writer->started = in_flight_.insert(in_flight_.end(), InFlight{Clock::now()});
      writer->batch = std::move(batch);
      writers.push_back(std::move(writer));
    }
    return writers;
  }

  void Write(const std::vector<std::shared_ptr<Slot>>& batch) {
    std::vector<Request> requests;
    requests.reserve(batch.size());
    for (const auto& s : batch) requests.push_back(s->request);
    std::vector<Result> results = writer_(requests);
    assert(results.size() == batch.size());
    for (size_t i = 0; i < batch.size(); ++i) batch[i]->result = std::move(results[i]);
  }

  const int lanes_;
  const size_t spread_calls_;
  const Clock::duration stall_after_;
  Writer writer_;
  std::mutex mutex_;
  std::deque<std::shared_ptr<Slot>> queue_;  // Waiting for a batch, oldest first.
  std::set<std::string> busy_tenants_;       // Tenants of the batches in flight.
  std::list<InFlight> in_flight_;  // Oldest first.
};

}  // namespace sv::store

#endif  // SV_STORE_CREATE_BATCH_H_
