// Posts one billing minute for a large running fleet on a durable throwaway
// PostgreSQL (fsync and synchronous_commit on) and compares the rate with a
// raw COPY of the same number of rows into a plain table, in the same run.
//
//   ledger_minute [--instances=100000] [--gpus=1]
//   ledger_minute --instances=12500 --gpus=8
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "bench_cluster.h"

ABSL_FLAG(int, instances, 100'000, "running instances");
ABSL_FLAG(int, gpus, 1, "GPUs per instance");
ABSL_FLAG(int, tenants, 1'000, "tenants the instances belong to");
ABSL_FLAG(int, repeats, 3, "minutes billed (and COPYs run), one after the other");
ABSL_FLAG(int, history_minutes, 0,
          "minutes the fleet has already run and been billed before the timed ones (billed "
          "by the same code in set-up, then a CHECKPOINT: the first timed minute is the first "
          "after a checkpoint, the next ones are not); 0: a fresh ledger");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The fleet: tenants with a paid wallet, and instances RUNNING since the
// start of `minute` (bulk SQL: this is set-up, not what is measured).
void Populate(const std::string& url, int tenants, int instances, int gpus, int64_t minute) {
  pqxx::connection c(url);
  pqxx::work txn(c);
  const std::string at = absl::StrCat("to_timestamp(", minute * 60, ")");
  txn.exec(absl::StrCat(
      "INSERT INTO tenants (id, name, created_at) SELECT 'ten-' || g, 'bench-' || g, ", at,
      " FROM generate_series(1, ", tenants, ") g"));
  txn.exec(absl::StrCat(
      "INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id, "
      "to_account_id, amount_micros, kind, tenant_id, at) "
      "SELECT 'topup:bench-' || t.id, 0, md5(t.id), "
      "(SELECT id FROM ledger_accounts WHERE kind = 'payment_clearing'), a.id, "
      "1000000000000, 'topup', t.id, ", at,
      " FROM tenants t JOIN ledger_accounts a ON a.tenant_id = t.id AND a.kind = 'paid_wallet'"));
  txn.exec(absl::StrCat(
      "INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state, "
      "request_id, request_fingerprint, created_at, updated_at, running_since) "
      "SELECT 'ins-' || g, 'ten-' || (1 + g % ", tenants, "), 'b' || g, ", gpus,
      ", 'RTX 4090', 'ubuntu', 'RUNNING', 'r' || g, 'f', ", at, ", ", at, ", ", at,
      " FROM generate_series(1, ", instances, ") g"));
  txn.exec(absl::StrCat(
      "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
      "SELECT id, ", at, ", 'STARTING', 'RUNNING', 'bench' FROM instances"));
  txn.exec("CREATE TABLE copy_baseline (idempotency_key text, leg smallint, "
           "content_hash text, from_account_id bigint, to_account_id bigint, "
           "amount_micros bigint, kind text, tenant_id text, instance_id text, "
           "usage_minute bigint, gpu_model text, at timestamptz)");
  // The rows the ledger writes, in their own narrow shape (the columns of
  // ledger_charges, migration 0030), into a plain table: a stricter
  // baseline than the 12-column rows above.
  txn.exec("CREATE TABLE copy_narrow (LIKE ledger_charges)");
  txn.commit();
  pqxx::nontransaction vacuum(c);
  vacuum.exec("VACUUM ANALYZE");
  // WAL segments for the timed minutes. A fresh cluster has none to
  // recycle, so whichever minute (ledger or COPY) crosses into a new 16 MB
  // segment first writes it full of zeros (10-15 ms, a fifth of a 12,500-row
  // ledger minute). A server in steady operation recycles old segments at
  // each checkpoint; so does the bench: about 100 MB of WAL in set-up, then
  // a checkpoint, leaves recycled segments for the timed minutes of both.
  vacuum.exec("CREATE TABLE wal_warmup AS SELECT g, repeat('x', 100) AS pad "
              "FROM generate_series(1, 700000) g");
  vacuum.exec("DROP TABLE wal_warmup");
  vacuum.exec("CHECKPOINT");
}

// COPY of `rows` rows shaped like minute charges into a plain table, in one
// committed transaction: 12 columns as a ledger_transfers leg.
double CopyRows(const std::string& url, int rows, int round) {
  pqxx::connection c(url);
  const auto start = Clock::now();
  pqxx::work txn(c);
  const std::vector<std::string> columns = {
      "idempotency_key", "leg", "content_hash", "from_account_id", "to_account_id",
      "amount_micros", "kind", "tenant_id", "instance_id", "usage_minute", "gpu_model", "at"};
  pqxx::stream_to stream(txn, "copy_baseline", columns);
  for (int i = 0; i < rows; ++i) {
    const std::string id = absl::StrCat("ins-", i);
    stream << std::make_tuple(absl::StrCat("charge:", id, ":", round), 1,
                              "0123456789abcdef0123456789abcdef", 5, 1, 33000, "charge",
                              absl::StrCat("ten-", i % 1000), id, round, "RTX 4090",
                              "2026-11-29 00:00:00+00");
  }
  stream.complete();
  txn.commit();
  return Seconds(start);
}

// The same number of rows in ledger_charges' own 11 columns, into a plain
// table without key or index.
double CopyNarrowRows(const std::string& url, int rows, int round) {
  pqxx::connection c(url);
  const auto start = Clock::now();
  pqxx::work txn(c);
  const std::vector<std::string> columns = {
      "instance_no", "tenant_no", "minute", "gpu_count", "unit_price", "trial_account",
      "trial_micros", "main_account", "main_micros", "revenue_account", "at"};
  pqxx::stream_to stream(txn, "copy_narrow", columns);
  for (int i = 0; i < rows; ++i) {
    stream << std::make_tuple(i + 1, 1 + i % 1000, 29'000'000 + round, 1, 33000,
                              std::optional<int>(), 0, 5, 33000, 1, "2026-11-29 00:00:00+00");
  }
  stream.complete();
  txn.commit();
  return Seconds(start);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int instances = absl::GetFlag(FLAGS_instances);
  const int gpus = absl::GetFlag(FLAGS_gpus);
  sv::bench::BenchCluster cluster("billing", /*durable=*/true);  // A real ledger.
  if (!cluster.ok()) return 1;
  sv::store::Database& db = cluster.db();
  const int history = absl::GetFlag(FLAGS_history_minutes);
  const int64_t minute = sv::billing::MinuteOf(absl::Now()) - 10;
  Populate(cluster.url(), absl::GetFlag(FLAGS_tenants), instances, gpus, minute - history);

  sv::store::Store store(db);
  sv::FakeClock clock(absl::Now());
  sv::billing::BillingOptions options;
  options.batch_rows_max = 1'000'000;
  options.first_run_lookback = absl::Minutes(history + 60);
  sv::billing::Billing billing(db, store, clock, options);
  {
    // Sets the cursor, and with --history_minutes bills the history.
    const auto start = Clock::now();
    if (!billing.BillMinutesBefore(minute, clock.Now()).ok()) return 1;
    if (history > 0) {
      const double billed_s = Seconds(start);
      pqxx::connection c(cluster.url());
      pqxx::nontransaction n(c);
      n.exec("VACUUM ANALYZE ledger_charges");
      n.exec("CHECKPOINT");
      std::printf("history: %d minutes x %d instances billed in %.1f s; ledger_charges %s, "
                  "its primary key %s; then VACUUM and CHECKPOINT\n",
                  history, instances, billed_s,
                  n.exec("SELECT pg_size_pretty(pg_relation_size('ledger_charges'))")[0][0]
                      .c_str(),
                  n.exec("SELECT pg_size_pretty(pg_relation_size('ledger_charges_pkey'))")[0][0]
                      .c_str());
    }
  }

  std::printf("billing one minute: %d running instances x %d GPU(s), %d tenants, "
              "durable PostgreSQL (fsync on, synchronous_commit on)\n",
              instances, gpus, absl::GetFlag(FLAGS_tenants));
  std::printf("%-8s %10s %10s %11s %13s %8s %18s %12s %8s\n", "minute", "postings",
              "ledger s", "postings/s", "COPY rows/s", "ratio", "narrow COPY r/s",
              "ratio to it", "WAL MB");
  // The WAL the minute wrote (the billing run's own; nothing else runs):
  // unlike the timings it does not depend on the machine's load.
  pqxx::connection wal_conn(cluster.url());
  auto wal_lsn = [&] {
    pqxx::nontransaction n(wal_conn);
    return n.exec("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0].as<double>();
  };
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const double wal_before = wal_lsn();
    const auto start = Clock::now();
    auto result = billing.BillMinutesBefore(minute + r + 1, clock.Now());
    const double ledger_s = Seconds(start);
    const double wal_mb = (wal_lsn() - wal_before) / (1024.0 * 1024.0);
    if (!result.ok()) {
      std::fprintf(stderr, "billing failed: %s\n", result.status().ToString().c_str());
      return 1;
    }
    const double copy_s = CopyRows(cluster.url(), static_cast<int>(result->postings), r);
    const double narrow_s = CopyNarrowRows(cluster.url(), static_cast<int>(result->postings), r);
    const double rate = result->postings / ledger_s;
    const double copy_rate = result->postings / copy_s;
    const double narrow_rate = result->postings / narrow_s;
    std::printf("%-8d %10lld %10.3f %11.0f %13.0f %8.2f %18.0f %12.2f %8.1f\n", r + 1,
                static_cast<long long>(result->postings), ledger_s, rate, copy_rate,
                rate / copy_rate, narrow_rate, rate / narrow_rate, wal_mb);
    std::fflush(stdout);
  }
  if (history > 0) {
    std::printf("late-event recheck: skipped with --history_minutes (it would recheck the "
                "history too)\n");
  } else {
    // The late-event recheck's worst case: every instance has an event it
    // has not seen (the fleet's RUNNING starts), so every billed minute of
    // every instance is recomputed and compared; nothing is owed.
    const auto start = Clock::now();
    auto legs = billing.RecheckLateEvents(clock.Now());
    std::printf("late-event recheck of all %d instances x %d billed minutes: %.3f s, %s\n",
                instances, absl::GetFlag(FLAGS_repeats), Seconds(start),
                legs.ok() ? absl::StrCat(*legs, " adjustment legs").c_str()
                          : legs.status().ToString().c_str());
  }
  auto failures = billing.Audit();
  std::printf("audit: %s\n", failures.ok() && failures->empty() ? "ok" : "FAILED");
  // SV_BENCH_PAUSE_S keeps the cluster up that long, to EXPLAIN the batch.
  if (const char* pause = std::getenv("SV_BENCH_PAUSE_S")) {
    std::printf("url: %s\n", cluster.url().c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(std::atoi(pause)));
  }
  return 0;
}
