#include "common.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "store/migrations.h"

namespace sv::bench {

BenchDatabase::~BenchDatabase() {
  db.reset();
  if (pg) (void)pg->Stop();
  if (!dir.empty()) (void)std::system(("rm -rf " + dir).c_str());
}

std::unique_ptr<BenchDatabase> StartDatabase(const char* name) {
  auto b = std::make_unique<BenchDatabase>();
  std::string tmpl = absl::StrCat("/tmp/sv-bench-", name, "-XXXXXX");
  b->dir = mkdtemp(tmpl.data());
  chmod(b->dir.c_str(), 0755);
  store::EmbeddedPostgresOptions options;
  options.data_dir = b->dir + "/data";
  options.durable = true;  // fsync and synchronous_commit on: a real ledger.
  options.settings = {"max_wal_size=4GB", "shared_buffers=512MB"};
  b->pg = std::make_unique<store::EmbeddedPostgres>(options);
  if (absl::Status s = b->pg->Start(); !s.ok()) {
    std::fprintf(stderr, "cannot start PostgreSQL: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  store::DatabaseOptions db_options;
  db_options.url = b->pg->url();
  db_options.statement_timeout = absl::Minutes(10);
  db_options.connections_max = 16;
  b->db = std::make_unique<store::Database>(db_options);
  if (absl::Status s = store::ApplyMigrations(*b->db); !s.ok()) {
    std::fprintf(stderr, "migrations: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return b;
}

void Populate(const std::string& url, int tenants, int instances, bool nodes) {
  pqxx::connection c(url);
  pqxx::work txn(c);
  txn.exec(absl::StrCat(
      "INSERT INTO tenants (id, name, created_at) SELECT 'ten-' || t, 'tenant ' || t, now() "
      "FROM generate_series(0, ", tenants - 1, ") t"));
  txn.exec(absl::StrCat(
      "INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state, "
      "request_id, request_fingerprint, created_at, updated_at, running_since) "
      "SELECT 'ins-' || lpad(i::text, 6, '0'), 'ten-' || (i % ", tenants, "), 'i' || i, 8, "
      "'RTX 4090', 'img', 'RUNNING', 'r' || i, 'f', now(), now(), now() "
      "FROM generate_series(0, ", instances - 1, ") i"));
  if (nodes) {
    txn.exec(absl::StrCat(
        "INSERT INTO nodes (id, name, zone, pod, leaf_switch, gpu_model, gpu_count, state, "
        "simulated, last_heartbeat_at, created_at) "
        "SELECT 'nod-' || lpad(i::text, 6, '0'), 'node-' || lpad(i::text, 6, '0'), 'z', 'p', "
        "'leaf-' || (i / 32), 'RTX 4090', 8, 'ready', true, now(), now() "
        "FROM generate_series(0, ", instances - 1, ") i"));
    txn.exec(absl::StrCat(
        "INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, reserved_at) "
        "SELECT 'nod-' || lpad(i::text, 6, '0'), g, 'ins-' || lpad(i::text, 6, '0'), now() "
        "FROM generate_series(0, ", instances - 1, ") i, generate_series(0, 7) g"));
  }
  txn.commit();
}

}  // namespace sv::bench
