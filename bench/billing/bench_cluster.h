// A throwaway PostgreSQL cluster for the billing benchmarks: a fresh
// directory under /tmp, the project's migrations applied, removed with the
// object. Set-up, not what is measured.
#ifndef SV_BENCH_BILLING_BENCH_CLUSTER_H_
#define SV_BENCH_BILLING_BENCH_CLUSTER_H_

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "store/database.h"
#include "store/embedded_postgres.h"
#include "store/migrations.h"

namespace sv::bench {

class BenchCluster {
 public:
  // `durable`: fsync and synchronous_commit on, as a real ledger runs.
  BenchCluster(const std::string& name, bool durable) {
    std::string dir_template = "/tmp/sv-bench-" + name + "-XXXXXX";
    if (mkdtemp(dir_template.data()) == nullptr) return;
    dir_ = dir_template;
    chmod(dir_.c_str(), 0755);
    store::EmbeddedPostgresOptions options;
    options.data_dir = dir_ + "/data";
    options.durable = durable;
    options.settings = {"max_wal_size=4GB", "shared_buffers=512MB"};
    // SV_BENCH_PG_SETTINGS adds server settings, comma-separated (e.g.
    // "log_min_duration_statement=0" to see every statement and round trip
    // of a billing minute in the cluster's server.log).
    if (const char* extra = std::getenv("SV_BENCH_PG_SETTINGS")) {
      for (absl::string_view s : absl::StrSplit(extra, ',', absl::SkipEmpty())) {
        options.settings.emplace_back(s);
      }
    }
    keep_ = std::getenv("SV_BENCH_KEEP") != nullptr;
    pg_ = std::make_unique<store::EmbeddedPostgres>(options);
    if (absl::Status s = pg_->Start(); !s.ok()) {
      std::fprintf(stderr, "cannot start PostgreSQL: %s\n", s.ToString().c_str());
      return;
    }
    store::DatabaseOptions db_options;
    db_options.url = pg_->url();
    db_options.statement_timeout = absl::Minutes(10);
    db_ = std::make_unique<store::Database>(db_options);
    if (absl::Status s = store::ApplyMigrations(*db_); !s.ok()) {
      std::fprintf(stderr, "migrations failed: %s\n", s.ToString().c_str());
      db_.reset();
    }
  }
  ~BenchCluster() {
    db_.reset();
    if (pg_) (void)pg_->Stop();
    // SV_BENCH_KEEP keeps the cluster's directory (its server.log).
    if (!dir_.empty() && !keep_) std::system(("rm -rf " + dir_).c_str());
  }
  BenchCluster(const BenchCluster&) = delete;
  BenchCluster& operator=(const BenchCluster&) = delete;

  bool ok() const { return db_ != nullptr; }
  std::string url() const { return pg_->url(); }
  store::Database& db() { return *db_; }

 private:
  std::string dir_;
  bool keep_ = false;
  std::unique_ptr<store::EmbeddedPostgres> pg_;
  std::unique_ptr<store::Database> db_;
};

}  // namespace sv::bench

#endif  // SV_BENCH_BILLING_BENCH_CLUSTER_H_
