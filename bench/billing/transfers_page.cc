// What one ListTransfers page costs a tenant with a long history, against
// the plain query that sorts the tenant's whole history to find the page
// (what ListTransfers did before migration 0080), in the same run.
//
//   transfers_page [--instances=200] [--minutes=1440] [--repeats=20]
//
// The history is real: the instances run for --minutes and the billing loop's
// own call posts every minute (one catch-up call), so the charges are rows of
// ledger_charges exactly as production writes them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "bench_cluster.h"

ABSL_FLAG(int, instances, 200, "the tenant's instances, all running for --minutes");
ABSL_FLAG(int, minutes, 1'440, "minutes of history");
ABSL_FLAG(int, repeats, 20, "timed reads of each kind (the median is printed)");
ABSL_FLAG(int, page_size, 100, "transfers per page");

namespace {

using Clock = std::chrono::steady_clock;

double MedianMs(int repeats, const std::function<void()>& read) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    read();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int instances = absl::GetFlag(FLAGS_instances);
  const int minutes = absl::GetFlag(FLAGS_minutes);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const int page_size = absl::GetFlag(FLAGS_page_size);
  sv::bench::BenchCluster cluster("transfers", /*durable=*/false);
  if (!cluster.ok()) return 1;
  sv::store::Database& db = cluster.db();

  // One tenant, funded, with instances RUNNING since `start` (bulk SQL:
  // set-up, not what is measured).
  const int64_t now_minute = sv::billing::MinuteOf(absl::Now());
  const int64_t start_minute = now_minute - minutes;
  {
    pqxx::connection c(cluster.url());
    pqxx::work txn(c);
    const std::string at = absl::StrCat("to_timestamp(", start_minute * 60, ")");
    txn.exec(absl::StrCat("INSERT INTO tenants (id, name, created_at) VALUES "
                          "('ten-1', 'bench', ", at, ")"));
    txn.exec(absl::StrCat(
        "INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id, "
        "to_account_id, amount_micros, kind, tenant_id, at) "
        "SELECT 'topup:bench-' || g, 0, md5(g::text), "
        "(SELECT id FROM ledger_accounts WHERE kind = 'payment_clearing'), a.id, "
        "1000000000000, 'topup', 'ten-1', ", at, " + g * interval '1 hour' "
        "FROM ledger_accounts a, generate_series(0, ", minutes / 60, ") g "
        "WHERE a.tenant_id = 'ten-1' AND a.kind = 'paid_wallet'"));
    txn.exec(absl::StrCat(
        "INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state, "
        "request_id, request_fingerprint, created_at, updated_at, running_since) "
        "SELECT 'ins-' || g, 'ten-1', 'b' || g, 8, 'RTX 4090', 'ubuntu', 'RUNNING', "
        "'r' || g, 'f', ", at, ", ", at, ", ", at, " FROM generate_series(1, ", instances,
        ") g"));
    txn.exec(absl::StrCat(
        "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
        "SELECT id, ", at, ", 'STARTING', 'RUNNING', 'bench' FROM instances"));
    txn.commit();
  }
  sv::store::Store store(db);
  sv::FakeClock clock(absl::Now());
  sv::billing::BillingOptions options;
  options.batch_rows_max = 1'000'000;
  options.first_run_lookback = absl::Minutes(minutes + 10);
  sv::billing::Billing billing(db, store, clock, options);
  auto posted = billing.BillMinutesBefore(now_minute, clock.Now());
  if (!posted.ok()) {
    std::fprintf(stderr, "billing failed: %s\n", posted.status().ToString().c_str());
    return 1;
  }
  {
    pqxx::connection c(cluster.url());
    pqxx::nontransaction vacuum(c);
    vacuum.exec("VACUUM ANALYZE");
  }
  std::printf("one tenant: %d instances x %d minutes, %lld charges posted, %d top-ups\n",
              instances, minutes, static_cast<long long>(posted->postings), minutes / 60 + 1);

  // The baseline: the tenant's transfers and charges through the view in
  // one order, sorted whole to find the page.
  pqxx::connection baseline_conn(cluster.url());
  auto baseline = [&](bool newest_first) {
    pqxx::work txn(baseline_conn);
    const std::string dir = newest_first ? " DESC" : "";
    auto rows = txn.exec_params(
        absl::StrCat("SELECT t.idempotency_key, t.leg, t.amount_micros FROM "
                     "ledger_all_transfers t WHERE t.tenant_id = $1 ORDER BY t.at", dir,
                     ", t.src", dir, ", t.src_no", dir, ", t.src_minute", dir, ", t.leg", dir,
                     " LIMIT $2"),
        "ten-1", page_size);
    if (static_cast<int>(rows.size()) != page_size) std::abort();
  };
  std::string middle_cursor;
  auto page = [&](bool newest_first, const std::string& after) {
    sv::billing::TransferFilter filter;
    filter.limit = page_size;
    filter.newest_first = newest_first;
    filter.after = after;
    auto got = billing.ListTransfers("ten-1", filter);
    if (!got.ok() || static_cast<int>(got->size()) != page_size) std::abort();
    return got->back().cursor;
  };
  // A cursor from the middle of the history: pages walked to it.
  {
    std::string cursor;
    const int pages = std::max(1, minutes * instances / page_size / 2);
    for (int p = 0; p < std::min(pages, 50); ++p) cursor = page(false, cursor);
    middle_cursor = cursor;
  }
  const double base_oldest = MedianMs(repeats, [&] { baseline(false); });
  const double base_newest = MedianMs(repeats, [&] { baseline(true); });
  const double first_oldest = MedianMs(repeats, [&] { page(false, ""); });
  const double first_newest = MedianMs(repeats, [&] { page(true, ""); });
  const double next_oldest = MedianMs(repeats, [&] { page(false, middle_cursor); });
  std::printf("%-40s %10s %18s\n", ("read (page of " + std::to_string(page_size) + ")").c_str(),
              "median ms", "ratio to baseline");
  std::printf("%-40s %10.2f %18s\n", "baseline, oldest first (whole sort)", base_oldest, "1");
  std::printf("%-40s %10.2f %18s\n", "baseline, newest first (whole sort)", base_newest, "1");
  std::printf("%-40s %10.2f %18.4f\n", "ListTransfers, first page, oldest", first_oldest,
              first_oldest / base_oldest);
  std::printf("%-40s %10.2f %18.4f\n", "ListTransfers, first page, newest", first_newest,
              first_newest / base_newest);
  std::printf("%-40s %10.2f %18.4f\n", "ListTransfers, page 51 (after a cursor)", next_oldest,
              next_oldest / base_oldest);
  // SV_BENCH_PAUSE_S keeps the cluster up that long, to EXPLAIN the reads.
  if (const char* pause = std::getenv("SV_BENCH_PAUSE_S")) {
    std::printf("url: %s\n", cluster.url().c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(std::atoi(pause)));
  }
  return 0;
}
