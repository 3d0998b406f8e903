#ifndef SV_STORE_DATABASE_H_
#define SV_STORE_DATABASE_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
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
  // A lost connection (server restart, failover) is retried with backoff for
  // this long before a call fails with UNAVAILABLE; only work that did not
  // reach COMMIT is retried.
  absl::Duration reconnect_window = absl::Seconds(3);
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

  // Opens connections until `count` (at most the pool's bound) are open, so
  // that the first burst of requests after a start does not pay for
  // connection setup on its own path. Returns the first error; connections
  // opened before it stay in the pool.
  absl::Status Warm(int count);

  // Runs `body` in a READ COMMITTED transaction and commits when it returns
  // OK. Retries the whole body on serialization failures and deadlocks, and
  // on a connection lost before COMMIT (with fresh connections, for up to
  // reconnect_window), so `body` must be safe to run more than once.
  // Database errors become statuses: UNAVAILABLE (connection; reason
  // COMMIT_IN_DOUBT when the connection broke during COMMIT, so the outcome
  // is unknown), DEADLINE_EXCEEDED (timeouts), ABORTED (retries exhausted),
  // INTERNAL (anything else). Inside a FenceScope the transaction first checks
  // the leader epoch (FAILED_PRECONDITION / NOT_LEADER when deposed).
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
  // Connections dropped as broken, and transactions retried after a lost
  // connection, since start (for /metrics).
  int64_t broken_connections() const { return broken_connections_.load(); }
  int64_t reconnect_retries() const { return reconnect_retries_.load(); }

 private:
  class Lease;
  absl::Status Acquire(std::unique_ptr<pqxx::connection>* out);
  void Release(std::unique_ptr<pqxx::connection> connection);
  absl::Status Open(std::unique_ptr<pqxx::connection>* out);
  // Open for a connection already counted in open_count_; uncounts it (and
  // wakes a waiter) when the open fails.
  absl::Status OpenCounted(std::unique_ptr<pqxx::connection>* out);
  // Closes every idle connection: after one broke, the others to the same
  // server are likely broken too (restart, failover).
  void DropIdle();

  DatabaseOptions options_;
  std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  int open_count_ = 0;
  std::atomic<int64_t> broken_connections_{0};
  std::atomic<int64_t> reconnect_retries_{0};
};

// ---- Fencing of leader-only work (docs/reliability.md) ----------------------
//
// The loops that only the leader may run (scheduling, billing, node health,
// SLA judgement) do their writes inside a FenceScope. While one is alive on a
// thread, every Database::Transact on that thread first reads the leader
// epoch under a shared row lock (SELECT ... FROM leader_fence FOR SHARE) and
// fails with FAILED_PRECONDITION / NOT_LEADER unless it is still `epoch`. A
// new leader bumps the epoch with an UPDATE of that row, which waits for the
// old leader's fenced transactions in flight; every later one is rejected.
// So a deposed leader's late writes never commit.
class FenceScope {
 public:
  explicit FenceScope(int64_t epoch);
  ~FenceScope();
  FenceScope(const FenceScope&) = delete;
  FenceScope& operator=(const FenceScope&) = delete;

  // The epoch the current thread is fenced with, if any.
  static std::optional<int64_t> Current();

 private:
  std::optional<int64_t> previous_;
};

// Tells leader-only loops whether this replica leads now.
class LeaderGate {
 public:
  virtual ~LeaderGate() = default;
  // The epoch of this replica's term, or nullopt when it does not lead.
  virtual std::optional<int64_t> LeaderEpoch() const = 0;
};

// One turn of leader-only work: ok() when this replica leads (the thread is
// then fenced with the epoch for the turn's life). A null gate means a single
// process with no election (tools, library tests): every turn runs unfenced.
class LeaderTurn {
 public:
  explicit LeaderTurn(const LeaderGate* gate);
  LeaderTurn(const LeaderTurn&) = delete;
  LeaderTurn& operator=(const LeaderTurn&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
  std::optional<FenceScope> fence_;
};

// Runs `sql` as the prepared statement `name` on the transaction's
// connection, so the server parses and plans it once per connection, not
// once per call. libpqxx registers the definition with the connection and
// prepares it with the server on first use; registering the same name with
// the same text again is a no-op (a different text for a name throws).
template <typename... Args>
pqxx::result ExecPrepared(pqxx::work& txn, const std::string& name, const std::string& sql,
                          Args&&... args) {
  txn.conn().prepare(name, sql);
  return txn.exec_prepared(name, std::forward<Args>(args)...);
}

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
