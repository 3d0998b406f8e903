#ifndef SV_BENCH_SLA_COMMON_H_
#define SV_BENCH_SLA_COMMON_H_

// A throwaway durable PostgreSQL with sv's migrations, and fleet rows made
// in bulk with SQL, for the SLA benchmarks.

#include <chrono>
#include <memory>
#include <string>

#include "store/database.h"
#include "store/embedded_postgres.h"

namespace sv::bench {

struct BenchDatabase {
  std::string dir;
  std::unique_ptr<store::EmbeddedPostgres> pg;
  std::unique_ptr<store::Database> db;
  ~BenchDatabase();
};

// Exits the process with a message on failure.
std::unique_ptr<BenchDatabase> StartDatabase(const char* name);

// `tenants` tenants (ten-0...), `instances` RUNNING 8-GPU instances
// (ins-000000...) spread over them, each holding all GPUs of its own node
// (node-000000...) when `nodes` is true.
void Populate(const std::string& url, int tenants, int instances, bool nodes);

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace sv::bench

#endif  // SV_BENCH_SLA_COMMON_H_
