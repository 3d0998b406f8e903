#include "store/create_batch.h"

#include <cassert>
#include <functional>

namespace sv::store {

CreateBatcher::CreateBatcher(Store& store, int lanes) : store_(store) {
  assert(lanes > 0);
  for (int i = 0; i < lanes; ++i) lanes_.push_back(std::make_unique<Lane>());
}

absl::StatusOr<CreateOutcome> CreateBatcher::Submit(CreateRequest request) {
  Lane& lane = *lanes_[std::hash<std::string>{}(request.tenant_id) % lanes_.size()];
  auto slot = std::make_shared<Slot>();
  slot->request = std::move(request);
  std::unique_lock<std::mutex> lock(lane.mutex);
  lane.queue.push_back(slot);
  for (;;) {
    if (slot->done) return std::move(slot->outcome);
    if (lane.writing) {
      lane.written.wait(lock);
      continue;
    }
    // No batch of this lane is being written: this call writes what is
    // queued (its own create among them), the others wait for the commit.
    lane.writing = true;
    std::vector<std::shared_ptr<Slot>> batch;
    while (!lane.queue.empty() && batch.size() < kBatchCreatesMax) {
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

void CreateBatcher::Write(const std::vector<std::shared_ptr<Slot>>& batch) {
  std::vector<CreateRequest> requests;
  requests.reserve(batch.size());
  for (const auto& s : batch) requests.push_back(s->request);
  std::vector<absl::StatusOr<CreateOutcome>> outcomes = store_.CreateInstances(requests);
  assert(outcomes.size() == batch.size());
  for (size_t i = 0; i < batch.size(); ++i) batch[i]->outcome = std::move(outcomes[i]);
}

}  // namespace sv::store
