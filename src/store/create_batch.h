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
    for (;;) {
      if (slot->done) return std::move(slot->result);
      if (lane.writing) {
        lane.written.wait(lock);
        continue;
      }
      // No batch of this lane is being written: this call writes what is
      // queued (its own among them), the others wait for the commit.
      lane.writing = true;
      std::vector<std::shared_ptr<Slot>> batch;
      while (!lane.queue.empty() && batch.size() < kBatchCallsMax) {
        batch.push_back(std::move(lane.queue.front()));
        lane.queue.pop_front();
      }
      lock.unlock();
      Write(batch);
      lock.lock();
      for (auto& s : batch) s->done = true;
      lane.writing = false;
      lane.written.notify_all();
    }
  }

 private:
  struct Slot {
    explicit Slot(Request r) : request(std::move(r)) {}
    Request request;
    bool done = false;
    Result result;
  };
  struct Lane {
    std::mutex mutex;
    std::condition_variable written;
    std::deque<std::shared_ptr<Slot>> queue;
    bool writing = false;
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
