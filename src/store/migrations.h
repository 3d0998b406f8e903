#ifndef SV_STORE_MIGRATIONS_H_
#define SV_STORE_MIGRATIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "store/database.h"

namespace sv::store {

struct Migration {
  int version;
  std::string name;
  std::string sql;
};

// The migrations compiled into this binary, in version order.
const std::vector<Migration>& EmbeddedMigrations();

// Applies every migration newer than the database's schema version, each in
// its own transaction. A session advisory lock makes concurrent starts of
// several svd safe: one applies, the others wait and then find nothing to do.
// Fails with FAILED_PRECONDITION when an applied migration's text changed or
// the database is newer than this binary.
absl::Status ApplyMigrations(Database& db);

}  // namespace sv::store

#endif  // SV_STORE_MIGRATIONS_H_
