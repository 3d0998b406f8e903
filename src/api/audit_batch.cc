#include "api/audit_batch.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "api/errors.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"

namespace sv::api {
namespace {

// At most this many rows per INSERT; more wait for the next batch.
constexpr size_t kBatchRowsMax = 256;

absl::Status InsertBatch(store::Database& db, const std::vector<store::AuditRow>& rows) {
  return db.Transact([&](pqxx::work& txn) -> absl::Status {
    store::InsertAuditRows(txn, rows);
    return absl::OkStatus();
  });
}

class AuditBatcher {
 public:
  explicit AuditBatcher(store::Database& db) : db_(db) {}

  // Returns once `row` is committed (or could not be).
  absl::Status Append(store::AuditRow row) {
    auto slot = std::make_shared<Slot>();
    slot->row = std::move(row);
    std::unique_lock<std::mutex> lock(mutex_);
    queue_.push_back(slot);
    for (;;) {
      if (slot->done) return slot->status;
      if (writing_) {
        written_.wait(lock);
        continue;
      }
      // No batch is being written: this call writes everything queued.
      writing_ = true;
      std::vector<std::shared_ptr<Slot>> batch;
      while (!queue_.empty() && batch.size() < kBatchRowsMax) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      lock.unlock();
      Write(batch);
      lock.lock();
      for (auto& s : batch) s->done = true;
      writing_ = false;
      written_.notify_all();
    }
  }

 private:
  struct Slot {
    store::AuditRow row;
    bool done = false;
    absl::Status status;
  };

  void Write(const std::vector<std::shared_ptr<Slot>>& batch) {
    std::vector<store::AuditRow> rows;
    for (const auto& s : batch) rows.push_back(s->row);
    absl::Status status = InsertBatch(db_, rows);
    if (status.ok() || batch.size() == 1) {
      for (auto& s : batch) s->status = status;
      return;
    }
    // One row must not cost the others theirs: write them one by one.
    spdlog::warn("audit: batch of {} rows failed ({}); writing them one by one", batch.size(),
                 status.ToString());
    for (auto& s : batch) s->status = store::SecurityStore(db_).AppendAudit(s->row);
  }

  store::Database& db_;
  std::mutex mutex_;
  std::condition_variable written_;
  std::deque<std::shared_ptr<Slot>> queue_;
  bool writing_ = false;
};

}  // namespace

AuditSink BatchedDatabaseAuditSink(store::Database& db, const Clock& clock) {
  auto batcher = std::make_shared<AuditBatcher>(db);
  return [batcher, &clock](const AuditEvent& event) {
    store::AuditRow row = AuditRowOf(event, clock.Now());
    absl::Status status = batcher->Append(row);
    if (!status.ok()) ReportAuditFailure(row, status);
  };
}

}  // namespace sv::api
