#ifndef SV_STORE_EMBEDDED_POSTGRES_H_
#define SV_STORE_EMBEDDED_POSTGRES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace sv::store {

struct EmbeddedPostgresOptions {
  // Folder that holds the cluster (created if missing). Reused across starts.
  std::string data_dir;
  // TCP port on 127.0.0.1; 0 picks a free one at each start.
  int port = 0;
  // Throwaway clusters for tests may trade durability for speed. Never set
  // for the dev server's real state.
  bool durable = true;
  std::string database = "sv";
  // Extra `-c name=value` settings for the server.
  std::vector<std::string> settings;
};

// A private PostgreSQL cluster run from the system's binaries
// (/usr/lib/postgresql/<version>/bin). PostgreSQL refuses to run as root, so
// when this process is root the cluster runs as the `postgres` user.
class EmbeddedPostgres {
 public:
  explicit EmbeddedPostgres(EmbeddedPostgresOptions options);
  ~EmbeddedPostgres();  // Stops the cluster if this object started it.
  EmbeddedPostgres(const EmbeddedPostgres&) = delete;
  EmbeddedPostgres& operator=(const EmbeddedPostgres&) = delete;

  // Initialises the cluster on first use, starts it, and creates the
  // database. A server left running by a crashed earlier process on the same
  // folder is stopped first.
  absl::Status Start();
  absl::Status Stop();

  // libpq URL of the database, valid after Start().
  std::string url() const;
  int port() const { return port_; }

 private:
  absl::Status Init();
  std::vector<std::string> AsOwner(std::vector<std::string> argv) const;

  EmbeddedPostgresOptions options_;
  std::string bin_dir_;
  int port_ = 0;
  bool running_ = false;
};

// Runs argv (no shell), appends its output to `log_path` if non-empty, and
// returns its exit status (or an error if it could not be started).
absl::Status RunProgram(const std::vector<std::string>& argv,
                        const std::string& log_path, int* exit_code);

// Asks the kernel for a free TCP port on 127.0.0.1.
int PickFreePort();

}  // namespace sv::store

#endif  // SV_STORE_EMBEDDED_POSTGRES_H_
