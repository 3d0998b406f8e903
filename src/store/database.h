#ifndef SV_STORE_DATABASE_H_
#define SV_STORE_DATABASE_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <pqxx/connection>
#include <pqxx/transaction>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace sv::store {

struct DatabaseOptions {
  std::string url;                 // libpq connection string or URI.
  int connections_max = 8;         // Hard bound on open connections.
  absl::Duration acquire_timeout = absl::Seconds(5);
  absl::Duration statement_timeout = absl::Seconds(10);
  absl::Duration lock_timeout = absl::Seconds(5);
  int transaction_retries_max = 8; // For serialization failures and deadlocks.
};

// A bounded pool of PostgreSQL connections. Every connection carries a
// statement timeout and a lock timeout, so no query can hang a request.
class Database {
 public:
  explicit Database(DatabaseOptions options);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Opens one connection to check that the server is reachable.
  absl::Status Ping();

  // Runs `body` in a READ COMMITTED transaction and commits when it returns
  // OK. Retries the whole body on serialization failures and deadlocks, so
  // `body` must be safe to run more than once. Database errors become
  // statuses: UNAVAILABLE (connection), DEADLINE_EXCEEDED (timeouts),
  // ABORTED (retries exhausted), INTERNAL (anything else).
  absl::Status Transact(const std::function<absl::Status(pqxx::work&)>& body);

  // Runs `body` on a dedicated connection outside the pool's transactions,
  // e.g. for session-level advisory locks.
  absl::Status WithConnection(
      const std::function<absl::Status(pqxx::connection&)>& body);

  const DatabaseOptions& options() const { return options_; }

  struct PoolStats {
    int open = 0;   // Connections open, in use or idle.
    int idle = 0;
    int max = 0;
  };
  PoolStats Stats();

 private:
  class Lease;
  absl::Status Acquire(std::unique_ptr<pqxx::connection>* out);
  void Release(std::unique_ptr<pqxx::connection> connection);
  absl::Status Open(std::unique_ptr<pqxx::connection>* out);

  DatabaseOptions options_;
  std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  int open_count_ = 0;
};

// Maps a libpqxx exception in flight to a status; call only inside a catch.
absl::Status StatusFromCurrentException();

// The SQLSTATE of a pqxx::sql_error in flight, or "".
std::string CurrentSqlState();

// Renders an instant as a timestamptz literal parameter ("...+00").
std::string SqlTime(absl::Time t);

// SQL expression turning a timestamptz column into int64 Unix micros.
// Example: "SELECT " + MicrosOf("created_at") + " FROM ...".
std::string MicrosOf(const std::string& column);

inline absl::Time TimeFromMicros(int64_t micros) {
  return absl::FromUnixMicros(micros);
}

}  // namespace sv::store

#endif  // SV_STORE_DATABASE_H_
