#ifndef SV_STORE_CREATE_BATCH_H_
#define SV_STORE_CREATE_BATCH_H_

// Group commit of creates and deletes (docs/reliability.md, "Benchmark"):
// the calls that arrive while a batch is being written wait, and the first
// of them writes them all in one transaction (Store::CreateInstances,
// Store::DeleteInstances); every call returns its own answer once that
// transaction has committed. A tenant's calls always go to the same lane, so
// batches in flight at the same time never lock the same tenant's rows;
// within a lane batches follow each other.

#include <cassert>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace sv::store {

template <typename Request, typename Result>
class GroupCommitter {
 public:
  // At most this many calls per transaction; more wait for the next one.
  static constexpr size_t kBatchCallsMax = 128;
  // Writes a batch and returns one result per request, in order.
  using Writer = std::function<std::vector<Result>(const std::vector<Request>&)>;

  GroupCommitter(int lanes, Writer writer) : writer_(std::move(writer)) {
    assert(lanes > 0);
    for (int i = 0; i < lanes; ++i) lanes_.push_back(std::make_unique<Lane>());
  }
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Returns once the batch holding `request` has been written.
  Result Submit(const std::string& tenant_id, Request request) {
    Lane& lane = *lanes_[std::hash<std::string>{}(tenant_id) % lanes_.size()];
    auto slot = std::make_shared<Slot>(std::move(request));
    std::unique_lock<std::mutex> lock(lane.mutex);
    lane.queue.push_back(slot);
    if (lane.writing) {
      // A batch of this lane is being written: wait until this call's own
      // batch has been, or until the writer hands this call the next one.
      // Each call waits on its own condition, so a commit wakes only the
      // calls it answered and the next writer, not every call queued.
      slot->woken.wait(lock, [&] { return slot->done || slot->writes; });
      if (slot->done) return std::move(slot->result);
    }
    // This call writes what is queued, its own request first or among the
    // first kBatchCallsMax (it is the queue's front, or the queue was empty).
    lane.writing = true;
    std::vector<std::shared_ptr<Slot>> batch;
    while (!lane.queue.empty() && batch.size() < kBatchCallsMax) {
      batch.push_back(std::move(lane.queue.front()));
      lane.queue.pop_front();
    }
    lock.unlock();
    Write(batch);
    lock.lock();
    for (auto& s : batch) {
      s->done = true;
      if (s != slot) s->woken.notify_one();
    }
    if (lane.queue.empty()) {
      lane.writing = false;
    } else {
      // The calls that arrived meanwhile: the first of them writes them.
      lane.queue.front()->writes = true;
      lane.queue.front()->woken.notify_one();
    }
    return std::move(slot->result);
  }

 private:
  struct Slot {
    explicit Slot(Request r) : request(std::move(r)) {}
    Request request;
    bool done = false;    // Written; `result` holds this call's answer.
    bool writes = false;  // Handed the next batch by the last writer.
    std::condition_variable woken;
    Result result;
  };
  struct Lane {
    std::mutex mutex;
    std::deque<std::shared_ptr<Slot>> queue;
    bool writing = false;  // A call of this lane writes a batch, or is handed one.
  };

  void Write(const std::vector<std::shared_ptr<Slot>>& batch) {
    std::vector<Request> requests;
    requests.reserve(batch.size());
    for (const auto& s : batch) requests.push_back(s->request);
    std::vector<Result> results = writer_(requests);
    assert(results.size() == batch.size());
    for (size_t i = 0; i < batch.size(); ++i) batch[i]->result = std::move(results[i]);
  }

  Writer writer_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace sv::store

#endif  // SV_STORE_CREATE_BATCH_H_
