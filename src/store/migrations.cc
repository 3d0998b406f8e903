#include "store/migrations.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::store {
namespace {

// Arbitrary constant shared by every svd: "sv" migrations lock.
constexpr int64_t kMigrationLockKey = 0x5356'0001;

absl::Status ApplyLocked(pqxx::connection& connection) {
  {
    pqxx::work txn(connection);
    txn.exec(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " sql_sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
    txn.commit();
  }
  std::map<int, std::string> applied;
  {
    pqxx::work txn(connection);
    for (const auto& row : txn.exec("SELECT version, sql_sha256 FROM schema_migrations")) {
      applied[row[0].as<int>()] = row[1].as<std::string>();
    }
  }
  const auto& migrations = EmbeddedMigrations();
  if (!applied.empty() && !migrations.empty() &&
      applied.rbegin()->first > migrations.back().version) {
    return Error(absl::StatusCode::kFailedPrecondition, "SCHEMA_TOO_NEW",
                 absl::StrCat("database schema version ", applied.rbegin()->first,
                              " is newer than this svd (", migrations.back().version,
                              "); upgrade svd"));
  }
  for (const Migration& m : migrations) {
    const std::string digest = Sha256Hex(m.sql);
    auto it = applied.find(m.version);
    if (it != applied.end()) {
      if (it->second != digest) {
        return Error(absl::StatusCode::kFailedPrecondition, "MIGRATION_CHANGED",
                     absl::StrCat("migration ", m.name,
                                  " differs from the one applied to this database"));
      }
      continue;
    }
    pqxx::work txn(connection);
    txn.exec(m.sql);
    txn.exec_params("INSERT INTO schema_migrations (version, name, sql_sha256) "
                    "VALUES ($1, $2, $3)",
                    m.version, m.name, digest);
    txn.commit();
    spdlog::info("store: applied migration {}", m.name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyMigrations(Database& db) {
  return db.WithConnection([](pqxx::connection& connection) {
    {
      pqxx::nontransaction lock(connection);
      // Migrations may take longer than a request; lift the timeout here.
      lock.exec("SET statement_timeout = 0");
      lock.exec(absl::StrCat("SELECT pg_advisory_lock(", kMigrationLockKey, ")"));
    }
    absl::Status status;
    try {
      status = ApplyLocked(connection);
    } catch (...) {
      status = StatusFromCurrentException();
    }
    try {
      pqxx::nontransaction unlock(connection);
      unlock.exec(absl::StrCat("SELECT pg_advisory_unlock(", kMigrationLockKey, ")"));
    } catch (...) {
      // Closing the connection releases the lock anyway.
    }
    return status;
  });
}

}  // namespace sv::store
