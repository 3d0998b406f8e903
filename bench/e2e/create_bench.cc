// bench_e2e_create: end-to-end CreateInstance throughput and latency against
// a real svd and a real (durable) PostgreSQL, with 64 concurrent clients;
// then, against the same PostgreSQL server, `pgbench -N` with the same
// client count as the database's own ceiling. Prints creates/s, p50, p99 and
// the ratio to pgbench's transactions per second.
//
// Knobs: SV_BENCH_CLIENTS (64), SV_BENCH_SECONDS (10), SV_BENCH_NODES (64),
// SV_BENCH_PROFILE=1 (loads pg_stat_statements and prints, per create, the
// statements run, the transactions committed and the wait events sampled),
// SV_BENCH_SVD_ARGS (extra svd flags, split on spaces; e.g.
// "--auth-cache-max-age-ms 0" measures without the credential cache),
// SV_BENCH_DELETE (1: each create is followed by a delete of it, so the
// fleet never fills and every create is placed; 0: creates only, one tenant
// per client, so the fleet fills and later creates are accepted as PENDING
// with a queue reason, which measures CreateInstance alone), SV_BENCH_SVD (the
// svd binary to run instead of this build's, to compare two builds in
// alternating runs).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "store/embedded_postgres.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? std::atoi(v) : fallback;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string RunOutput(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  pclose(pipe);
  return out;
}

std::string PgBin() {
  for (int v = 17; v >= 13; --v) {
    std::string dir = absl::StrCat("/usr/lib/postgresql/", v, "/bin");
    if (fs::exists(dir + "/pgbench")) return dir;
  }
  return "/usr/lib/postgresql/15/bin";
}

}  // namespace

int main() {
  const int clients = EnvInt("SV_BENCH_CLIENTS", 64);
  const int seconds = EnvInt("SV_BENCH_SECONDS", 10);
  const int nodes = EnvInt("SV_BENCH_NODES", 64);
  char dir_pattern[] = "/tmp/sv-bench-e2e-XXXXXX";
  const std::string dir = mkdtemp(dir_pattern);
  fs::permissions(dir, fs::perms::all, fs::perm_options::add);

  sv::store::EmbeddedPostgresOptions pg_options;
  pg_options.data_dir = dir + "/pg";
  pg_options.durable = true;  // A benchmark of real commits.
  pg_options.database = "sv";
  pg_options.settings = {"max_connections=300", "shared_buffers=256MB"};
  const bool profile = EnvInt("SV_BENCH_PROFILE", 0) != 0;
  const bool with_delete = EnvInt("SV_BENCH_DELETE", 1) != 0;
  if (profile) {
    pg_options.settings.push_back("shared_preload_libraries=pg_stat_statements");
    pg_options.settings.push_back("pg_stat_statements.track=all");
    pg_options.settings.push_back("pg_stat_statements.track_planning=on");
  }
  sv::store::EmbeddedPostgres pg(pg_options);
  if (absl::Status s = pg.Start(); !s.ok()) {
    std::fprintf(stderr, "bench: PostgreSQL: %s\n", s.ToString().c_str());
    return 1;
  }

  const std::string port_file = dir + "/port";
  const std::string key_file = dir + "/admin.key";
  const pid_t svd = fork();
  if (svd == 0) {
    const std::string log = dir + "/svd.log";
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), STDERR_FILENO);
    std::vector<std::string> args = {
        SV_SVD_PATH, "--database-url", pg.url(), "--listen", "127.0.0.1:0", "--port-file",
        port_file, "--admin-key-file", key_file, "--sim-nodes", std::to_string(nodes),
        "--sim-leaves", "8", "--state-dir", dir + "/state", "--rate-limit-key-rps", "0",
        "--rate-limit-tenant-rps", "0", "--db-connections", "64",
        "--billing-create-credit-minutes", "0", "--log-level", "warn"};
    if (const char* extra = std::getenv("SV_BENCH_SVD_ARGS"); extra != nullptr) {
      std::istringstream words(extra);
      for (std::string word; words >> word;) args.push_back(word);
    }
    const char* svd_path = std::getenv("SV_BENCH_SVD");
    if (svd_path == nullptr || *svd_path == '\0') svd_path = SV_SVD_PATH;
    args[0] = svd_path;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(svd_path, argv.data());
    _exit(127);
  }
  std::string port;
  for (int i = 0; i < 600 && (port.empty() || port.back() != '\n'); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    port = ReadFile(port_file);
  }
  if (port.empty()) {
    std::fprintf(stderr, "bench: svd did not start; see %s/svd.log\n", dir.c_str());
    kill(svd, SIGKILL);
    return 1;
  }
  std::string admin_key = ReadFile(key_file);
  while (!admin_key.empty() && admin_key.back() == '\n') admin_key.pop_back();
  const std::string endpoint = "127.0.0.1:" + port.substr(0, port.size() - 1);

  // One tenant per 8 clients, so per-tenant quotas do not bind; without
  // deletes one per client, so each tenant's pending quota (1,000) holds
  // its creates of a run.
  std::vector<std::string> tokens;
  {
    auto admin = sv::v1::AdminService::NewStub(
        grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
    for (int t = 0; t < std::max(1, with_delete ? clients / 8 : clients); ++t) {
      grpc::ClientContext context;
      context.AddMetadata("authorization", "Bearer " + admin_key);
      sv::v1::CreateTenantRequest request;
      request.set_name(absl::StrCat("bench-", t));
      request.set_owner_email(absl::StrCat("bench-", t, "@example.com"));
      sv::v1::CreateTenantResponse response;
      grpc::Status s = admin->CreateTenant(&context, request, &response);
      if (!s.ok()) {
        std::fprintf(stderr, "bench: CreateTenant: %s\n", s.error_message().c_str());
        kill(svd, SIGKILL);
        return 1;
      }
      tokens.push_back(response.api_key());
    }
  }

  const std::string as_owner = geteuid() == 0 ? "runuser -u postgres -- " : "";
  const std::string conn = absl::StrCat("-h 127.0.0.1 -p ", pg.port(), " -U postgres");
  auto psql = [&](const std::string& sql) {
    return RunOutput(absl::StrCat(as_owner, PgBin(), "/psql -X -A -t -F ' | ' -q ", conn,
                                  " sv -c \"", sql, "\" 2>&1"));
  };
  const std::string commits_sql =
      "SELECT xact_commit FROM pg_stat_database WHERE datname = 'sv'";
  int64_t commits_before = 0;
  if (profile) {
    psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    psql("SELECT pg_stat_statements_reset()");
    commits_before = std::atoll(psql(commits_sql).c_str());
  }
  // Wait events of the server's backends, sampled every 20 ms during the load.
  std::map<std::string, int> waits;
  std::thread sampler;

  // Each create asks for 1 GPU and deletes it at once after, so the fleet
  // never fills: every create is placed, the path a real create takes.
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::vector<double> latencies_ms;
  // (second of the run the create started in, latency): the profile's
  // latency per second shows whether slow creates follow the queue's growth
  // or come in bursts.
  std::vector<std::pair<int, double>> timeline_ms;
  std::atomic<int> errors{0};
  std::atomic<int> answered_pending{0};
  std::vector<std::thread> threads;
  const auto started = Clock::now();
  if (profile) {
    sampler = std::thread([&] {
      while (!stop.load()) {
        std::istringstream rows(psql(
            "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), state FROM "
            "pg_stat_activity WHERE datname = 'sv' AND backend_type = 'client backend' AND "
            "pid <> pg_backend_pid()"));
        std::string line;
        while (std::getline(rows, line)) {
          if (line.find(" | ") != std::string::npos) ++waits[line];
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      // A channel per 8 clients: like many client processes, not one.
      auto channel = grpc::CreateCustomChannel(
          endpoint, grpc::InsecureChannelCredentials(), [&] {
            grpc::ChannelArguments args;
            args.SetInt("sv_bench_channel", c / 8);
            return args;
          }());
      auto stub = sv::v1::InstanceService::NewStub(channel);
      std::vector<double> mine;
      std::vector<int> mine_at;
      for (int n = 0; !stop.load(); ++n) {
        sv::v1::CreateInstanceRequest request;
        request.mutable_instance()->set_gpu_count(1);
        request.set_request_id(absl::StrCat("b", c, "-", n));
        sv::v1::Instance created;
        grpc::ClientContext context;
        context.AddMetadata("authorization", "Bearer " + tokens[c % tokens.size()]);
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        const auto t0 = Clock::now();
        grpc::Status s = stub->CreateInstance(&context, request, &created);
        mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        mine_at.push_back(static_cast<int>(
            std::chrono::duration<double>(t0 - started).count()));
        if (!s.ok()) {
          ++errors;
          continue;
        }
        if (created.state() == sv::v1::PENDING) ++answered_pending;
        if (!with_delete) continue;
        grpc::ClientContext del_context;
        del_context.AddMetadata("authorization", "Bearer " + tokens[c % tokens.size()]);
        del_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        sv::v1::DeleteInstanceRequest del;
        del.set_id(created.id());
        sv::v1::Instance deleted;
        if (!stub->DeleteInstance(&del_context, del, &deleted).ok()) ++errors;
      }
      std::lock_guard<std::mutex> lock(mutex);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
      for (size_t i = 0; i < mine.size(); ++i) timeline_ms.emplace_back(mine_at[i], mine[i]);
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  if (sampler.joinable()) sampler.join();
  if (profile) {
    const double creates = std::max<size_t>(1, latencies_ms.size());
    const int64_t commits_after = std::atoll(psql(commits_sql).c_str());
    std::printf("profile: %.0f creates%s; %.2f commits per create%s\n", creates,
                with_delete ? " (+ as many deletes)" : "",
                (commits_after - commits_before) / creates, with_delete ? "+delete" : "");
    // "top" statements are the ones svd sent; "in" ones ran inside a
    // function or trigger (their time is part of the top statement's).
    std::printf("profile: statements per create+delete (calls/create | ms total | top or "
                "in | sql):\n%s",
                psql(absl::StrCat("SELECT round(calls::numeric / ", creates,
                                  ", 2), round(total_exec_time), CASE WHEN toplevel THEN 'top' "
                                  "ELSE 'in' END, left(regexp_replace(query, "
                                  "'\\s+', ' ', 'g'), 150) FROM pg_stat_statements ORDER BY "
                                  "toplevel DESC, calls DESC LIMIT 60"))
                    .c_str());
    // Where PostgreSQL's time went: the statements by total execution time,
    // nested ones (inside the batch functions and triggers) included.
    std::printf("profile: statements by total time (ms executing | ms planning | plans "
                "| calls/create | ms per call | top or in | sql):\n%s",
                psql(absl::StrCat("SELECT round(total_exec_time), round(total_plan_time), "
                                  "plans, round(calls::numeric / ",
                                  creates, ", 2), round((total_exec_time / greatest(calls, 1))::numeric, 3), "
                                  "CASE WHEN toplevel THEN 'top' ELSE 'in' END, "
                                  "left(regexp_replace(query, '\\s+', ' ', 'g'), 300) FROM "
                                  "pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC "
                                  "LIMIT 40"))
                    .c_str());
    std::printf("profile: creates by the second they started in (second | creates | p50 ms | "
                "p99 ms | max ms | over 100 ms):\n");
    std::map<int, std::vector<double>> by_second;
    for (const auto& [second, ms] : timeline_ms) by_second[second].push_back(ms);
    for (auto& [second, v] : by_second) {
      std::sort(v.begin(), v.end());
      const auto over = std::count_if(v.begin(), v.end(), [](double ms) { return ms > 100; });
      std::printf("  %3d %6zu %8.1f %8.1f %8.1f %6ld\n", second, v.size(), v[v.size() / 2],
                  v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back(),
                  static_cast<long>(over));
    }
    // Without the first 3 s, in which the fleet fills (creates only) and the
    // simulated agents start what was placed.
    std::vector<double> later;
    for (const auto& [second, ms] : timeline_ms) {
      if (second >= 3) later.push_back(ms);
    }
    std::sort(later.begin(), later.end());
    if (!later.empty()) {
      std::printf("profile: creates started from second 3 on: %zu, p50 %.1f ms, p99 %.1f ms\n",
                  later.size(), later[later.size() / 2],
                  later[std::min(later.size() - 1, later.size() * 99 / 100)]);
    }
    std::printf("profile: backend states sampled (wait event | state: samples):\n");
    for (const auto& [k, n] : waits) std::printf("  %-60s %d\n", k.c_str(), n);
  }
  kill(svd, SIGTERM);
  waitpid(svd, nullptr, 0);

  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto at = [&](double q) {
    return latencies_ms.empty()
               ? 0.0
               : latencies_ms[std::min(latencies_ms.size() - 1,
                                       static_cast<size_t>(q * latencies_ms.size()))];
  };
  const double creates_per_s = latencies_ms.size() / elapsed;

  // pgbench -N (no updates of the small tables) with the same clients.
  RunOutput(absl::StrCat(as_owner, PgBin(), "/pgbench -i -q -s 10 ", conn, " sv 2>&1"));
  const std::string out = RunOutput(absl::StrCat(as_owner, PgBin(), "/pgbench -N -c ",
                                                 clients, " -j 2 -T ", seconds, " ", conn,
                                                 " sv 2>&1"));
  std::smatch match;
  double pgbench_tps = 0;
  if (std::regex_search(out, match, std::regex(R"(tps = ([0-9.]+))"))) {
    pgbench_tps = std::stod(match[1]);
  }
  std::printf("e2e CreateInstance (%s), %d clients, %.1f s:\n",
              with_delete ? "each followed by a DeleteInstance"
                          : "creates only; placed until the fleet is full, then queued",
              clients, elapsed);
  std::printf("  creates/s      %10.0f   (errors: %d; answered PENDING: %d)\n", creates_per_s,
              errors.load(), answered_pending.load());
  std::printf("  p50 latency    %10.2f ms\n", at(0.50));
  std::printf("  p99 latency    %10.2f ms\n", at(0.99));
  std::printf("pgbench -N, %d clients, same server:\n  tps            %10.0f\n", clients,
              pgbench_tps);
  std::printf("ratio creates/s : pgbench tps = %.3f   (goals: >= 3000/s, p99 <= 50 ms, "
              ">= 0.5)\n",
              pgbench_tps > 0 ? creates_per_s / pgbench_tps : 0.0);
  if (pgbench_tps == 0) std::printf("pgbench output:\n%s\n", out.c_str());
  (void)pg.Stop();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
