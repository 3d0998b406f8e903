#include "store/database.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::store {
namespace {

bool IsRetryable(const std::string& sqlstate) {
  return sqlstate == "40001" || sqlstate == "40P01";
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
  absl::Status status = Open(out);
  if (!status.ok()) {
    lock.lock();
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

absl::Status Database::Ping() {
  return Transact([](pqxx::work& txn) {
    txn.exec("SELECT 1");
    return absl::OkStatus();
  });
}

absl::Status Database::Transact(
    const std::function<absl::Status(pqxx::work&)>& body) {
  absl::Status last;
  for (int attempt = 0; attempt < options_.transaction_retries_max; ++attempt) {
    std::unique_ptr<pqxx::connection> connection;
    SV_RETURN_IF_ERROR(Acquire(&connection));
    bool retry = false;
    try {
      pqxx::work txn(*connection);
      absl::Status status = body(txn);
      if (status.ok()) {
        txn.commit();
      } else {
        txn.abort();
      }
      Release(std::move(connection));
      return status;
    } catch (const pqxx::broken_connection&) {
      last = StatusFromCurrentException();
      connection.reset();
      retry = attempt == 0;  // A stale pooled connection: try one fresh one.
    } catch (...) {
      last = StatusFromCurrentException();
      retry = last.code() == absl::StatusCode::kAborted;
    }
    Release(std::move(connection));
    if (!retry) return last;
    spdlog::debug("store: retrying transaction after: {}", last.ToString());
  }
  return Error(absl::StatusCode::kAborted, "TRANSACTION_CONFLICT",
               absl::StrCat("transaction kept conflicting: ", last.message()));
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
    if (state.rfind("08", 0) == 0 || state == "57P01" || state == "57P03") {
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
