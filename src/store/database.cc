#include "store/database.h"

#include <pqxx/pqxx>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::store {
namespace {

bool IsRetryable(const std::string& sqlstate) {
  return sqlstate == "40001" || sqlstate == "40P01";
}

// The epoch of the leader whose work the current thread does (FenceScope).
thread_local std::optional<int64_t> t_fence_epoch;

// The shared lock makes a new leader's epoch bump wait for this transaction.
absl::Status CheckFence(pqxx::work& txn, int64_t epoch) {
  auto rows = txn.exec("SELECT epoch FROM leader_fence WHERE name = 'control' FOR SHARE");
  const int64_t current = rows.empty() ? -1 : rows[0][0].as<int64_t>();
  if (current == epoch) return absl::OkStatus();
  return Error(absl::StatusCode::kFailedPrecondition, "NOT_LEADER",
               absl::StrCat("this replica's leadership (epoch ", epoch,
                            ") ended; the leader epoch is now ", current,
                            "; the write was rejected"));
}

// A connection that failed this way is useless even if libpq still calls it
// open (a server shutting down, a read-only standby after a failover).
bool ConnectionUnusable(const absl::Status& status) {
  const std::string reason = ReasonOf(status);
  return reason == "DATABASE_UNAVAILABLE" || reason == "DATABASE_READ_ONLY";
}

}  // namespace

Database::Database(DatabaseOptions options) : options_(std::move(options)) {}

Database::~Database() = default;

absl::Status Database::Open(std::unique_ptr<pqxx::connection>* out) {
  try {
    auto connection = std::make_unique<pqxx::connection>(options_.url);
    pqxx::nontransaction setup(*connection);
    setup.exec(absl::StrCat(
        "SET statement_timeout = ",
        absl::ToInt64Milliseconds(options_.statement_timeout),
        "; SET lock_timeout = ", absl::ToInt64Milliseconds(options_.lock_timeout),
        "; SET idle_in_transaction_session_timeout = 60000; SET TIME ZONE 'UTC'"));
    setup.commit();
    *out = std::move(connection);
    return absl::OkStatus();
  } catch (...) {
    return StatusFromCurrentException();
  }
}

absl::Status Database::Acquire(std::unique_ptr<pqxx::connection>* out) {
  std::unique_lock<std::mutex> lock(mutex_);
  const absl::Time deadline = absl::Now() + options_.acquire_timeout;
  while (idle_.empty() && open_count_ >= options_.connections_max) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() ||
        released_.wait_for(lock, absl::ToChronoNanoseconds(left)) ==
            std::cv_status::timeout) {
      if (!idle_.empty() || open_count_ < options_.connections_max) break;
      return Error(absl::StatusCode::kUnavailable, "DATABASE_BUSY",
                   "all database connections are busy; retry later");
    }
  }
  if (!idle_.empty()) {
    *out = std::move(idle_.back());
    idle_.pop_back();
    return absl::OkStatus();
  }
  ++open_count_;
  lock.unlock();
  return OpenCounted(out);
}

absl::Status Database::OpenCounted(std::unique_ptr<pqxx::connection>* out) {
  absl::Status status = Open(out);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    --open_count_;
    released_.notify_one();
  }
  return status;
}

void Database::Release(std::unique_ptr<pqxx::connection> connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (connection != nullptr && connection->is_open()) {
    idle_.push_back(std::move(connection));
  } else {
    --open_count_;
  }
  released_.notify_one();
}

Database::PoolStats Database::Stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return {open_count_, static_cast<int>(idle_.size()), options_.connections_max};
}

absl::Status Database::Warm(int count) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (open_count_ >= std::min(count, options_.connections_max)) return absl::OkStatus();
      ++open_count_;
    }
    std::unique_ptr<pqxx::connection> connection;
    SV_RETURN_IF_ERROR(OpenCounted(&connection));
    Release(std::move(connection));
  }
}

absl::Status Database::Ping() {
  return Transact([](pqxx::work& txn) {
    txn.exec("SELECT 1");
    return absl::OkStatus();
  });
}

absl::Status Database::Transact(
    const std::function<absl::Status(pqxx::work&)>& body) {
  const std::optional<int64_t> fence = FenceScope::Current();
  const absl::Time reconnect_deadline = absl::Now() + options_.reconnect_window;
  absl::Duration backoff = absl::Milliseconds(50);
  absl::Status last;
  int conflicts = 0;
  for (;;) {
    std::unique_ptr<pqxx::connection> connection;
    bool lost = false;
    absl::Status acquired = Acquire(&connection);
    if (!acquired.ok()) {
      // BUSY is the pool's own bound; anything else means no server answers
      // (restart, failover in progress): wait for it within the window.
      if (acquired.code() != absl::StatusCode::kUnavailable ||
          ReasonOf(acquired) == "DATABASE_BUSY") {
        return acquired;
      }
      last = acquired;
      lost = true;
    } else {
      bool committing = false;
      try {
        pqxx::work txn(*connection);
        absl::Status status = absl::OkStatus();
        if (fence.has_value()) status = CheckFence(txn, *fence);
        if (status.ok()) status = body(txn);
        if (status.ok()) {
          committing = true;
          txn.commit();
        } else {
          txn.abort();
        }
        Release(std::move(connection));
        return status;
      } catch (...) {
        last = StatusFromCurrentException();
        const bool open = connection != nullptr && connection->is_open();
        if (committing && (!open || ReasonOf(last) == "COMMIT_IN_DOUBT")) {
          // COMMIT was sent and no answer came: it may or may not have
          // happened. Never report success, never retry blindly; callers
          // retry with their idempotency key.
          broken_connections_.fetch_add(1);
          connection.reset();
          Release(nullptr);
          DropIdle();
          return Error(absl::StatusCode::kUnavailable, "COMMIT_IN_DOUBT",
                       "the database connection was lost during COMMIT, so the outcome "
                       "is unknown; retry with the same request_id");
        }
        // A read-only server is a standby or a demoted primary after a
        // failover: drop the connection so the next one finds the primary.
        if (!open || ConnectionUnusable(last)) {
          broken_connections_.fetch_add(1);
          connection.reset();
          lost = true;
        }
      }
      Release(std::move(connection));
    }
    if (lost) {
      DropIdle();
      if (absl::Now() + backoff > reconnect_deadline) {
        if (last.code() != absl::StatusCode::kUnavailable) {
          return Error(absl::StatusCode::kUnavailable, "DATABASE_UNAVAILABLE",
                       absl::StrCat("database connection lost: ", last.message()));
        }
        return last;
      }
      reconnect_retries_.fetch_add(1);
      spdlog::debug("store: reconnecting after: {}", last.ToString());
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
      continue;
    }
    if (last.code() != absl::StatusCode::kAborted) return last;
    if (++conflicts >= options_.transaction_retries_max) {
      return Error(absl::StatusCode::kAborted, "TRANSACTION_CONFLICT",
                   absl::StrCat("transaction kept conflicting: ", last.message()));
    }
    spdlog::debug("store: retrying transaction after: {}", last.ToString());
  }
}

void Database::DropIdle() {
  std::vector<std::unique_ptr<pqxx::connection>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(idle_);
    open_count_ -= static_cast<int>(dropped.size());
    released_.notify_all();
  }
  // Closing happens outside the lock; a broken socket closes at once.
}

FenceScope::FenceScope(int64_t epoch) : previous_(t_fence_epoch) { t_fence_epoch = epoch; }

FenceScope::~FenceScope() { t_fence_epoch = previous_; }

std::optional<int64_t> FenceScope::Current() { return t_fence_epoch; }

LeaderTurn::LeaderTurn(const LeaderGate* gate) {
  if (gate == nullptr) {
    ok_ = true;
    return;
  }
  std::optional<int64_t> epoch = gate->LeaderEpoch();
  if (!epoch.has_value()) return;
  fence_.emplace(*epoch);
  ok_ = true;
}

absl::Status Database::WithConnection(
    const std::function<absl::Status(pqxx::connection&)>& body) {
  std::unique_ptr<pqxx::connection> connection;
  SV_RETURN_IF_ERROR(Open(&connection));
  try {
    return body(*connection);
  } catch (...) {
    return StatusFromCurrentException();
  }
}

std::string CurrentSqlState() {
  try {
    throw;
  } catch (const pqxx::sql_error& e) {
    return e.sqlstate();
  } catch (...) {
    return "";
  }
}

absl::Status StatusFromCurrentException() {
  try {
    throw;
  } catch (const pqxx::broken_connection& e) {
    return Error(absl::StatusCode::kUnavailable, "DATABASE_UNAVAILABLE",
                 absl::StrCat("database connection failed: ", e.what()));
  } catch (const pqxx::transaction_rollback& e) {
    return Error(absl::StatusCode::kAborted, "TRANSACTION_CONFLICT", e.what());
  } catch (const pqxx::in_doubt_error& e) {
    return Error(absl::StatusCode::kUnavailable, "COMMIT_IN_DOUBT", e.what());
  } catch (const pqxx::sql_error& e) {
    const std::string& state = e.sqlstate();
    if (IsRetryable(state)) {
      return Error(absl::StatusCode::kAborted, "TRANSACTION_CONFLICT", e.what());
    }
    if (state == "57014" || state == "55P03") {
      return Error(absl::StatusCode::kDeadlineExceeded, "DATABASE_TIMEOUT",
                   "a database statement timed out");
    }
    if (state == "25006") {
      return Error(absl::StatusCode::kUnavailable, "DATABASE_READ_ONLY",
                   "the database server is read-only (a standby, or failing over)");
    }
    if (state.rfind("08", 0) == 0 || state == "57P01" || state == "57P02" ||
        state == "57P03") {
      return Error(absl::StatusCode::kUnavailable, "DATABASE_UNAVAILABLE", e.what());
    }
    spdlog::error("store: SQL error {}: {}", state, e.what());
    return Error(absl::StatusCode::kInternal, "DATABASE_ERROR",
                 absl::StrCat("database error ", state));
  } catch (const std::exception& e) {
    spdlog::error("store: unexpected error: {}", e.what());
    return Error(absl::StatusCode::kInternal, "INTERNAL", e.what());
  }
}

std::string SqlTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%E6S+00", t, absl::UTCTimeZone());
}

std::string MicrosOf(const std::string& column) {
  return absl::StrCat("(extract(epoch from ", column, ") * 1000000)::bigint");
}

}  // namespace sv::store
