#ifndef SV_STORE_CREATE_BATCH_H_
#define SV_STORE_CREATE_BATCH_H_

// Group commit of creates (docs/reliability.md, "Benchmark"): the creates
// that arrive while a batch is being written wait, and the first of them
// writes them all in one transaction (Store::CreateInstances); every call
// returns its own answer once that transaction has committed. A tenant's
// creates always go to the same lane, so batches in flight at the same time
// never lock the same tenant row; within a lane batches follow each other.

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace sv::store {

class CreateBatcher {
 public:
  // At most this many creates per transaction; more wait for the next one.
  static constexpr size_t kBatchCreatesMax = 128;

  CreateBatcher(Store& store, int lanes);
  CreateBatcher(const CreateBatcher&) = delete;
  CreateBatcher& operator=(const CreateBatcher&) = delete;

  // Returns once the batch holding `request` has committed (or failed).
  absl::StatusOr<CreateOutcome> Submit(CreateRequest request);

 private:
  struct Slot {
    CreateRequest request;
    bool done = false;
    absl::StatusOr<CreateOutcome> outcome;
  };
  struct Lane {
    std::mutex mutex;
    std::condition_variable written;
    std::deque<std::shared_ptr<Slot>> queue;
    bool writing = false;
  };

  void Write(const std::vector<std::shared_ptr<Slot>>& batch);

  Store& store_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace sv::store

#endif  // SV_STORE_CREATE_BATCH_H_
