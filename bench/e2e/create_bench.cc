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
// alternating runs). The clients' channels connect before the clock
// starts, as pgbench's tps leaves out its connections. Interrupted (or with
// its output piped into a reader that quits), it still stops svd and
// PostgreSQL.

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
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

// CPU seconds spent so far, by who spent it: svd, PostgreSQL's processes,
// this program (the load's clients), its reaped children (pgbench), and the
// whole machine (busy and total, from /proc/stat). Per create or per pgbench
// transaction, these say where a phase's CPU went whatever else the shared
// machine ran (docs/reliability.md, "Benchmark").
struct CpuSample {
  double svd = 0, postgres = 0, client = 0, children = 0, machine_busy = 0, machine_total = 0;
  double svd_switches = 0;
};

CpuSample SampleCpu(pid_t svd, pid_t postmaster) {
  CpuSample s;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (DIR* proc = opendir("/proc"); proc != nullptr) {
    while (dirent* e = readdir(proc)) {
      const pid_t pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
      const size_t open = stat.find('('), close = stat.rfind(')');
      if (open == std::string::npos || close == std::string::npos) continue;
      const std::string comm = stat.substr(open + 1, close - open - 1);
      std::istringstream rest(stat.substr(close + 2));
      std::string field;
      double own = 0, reaped = 0;
      pid_t parent = 0;
      // After the comm: state is field 3, the parent 4; utime and stime 14
      // and 15, the reaped children's (cutime, cstime) 16 and 17: the
      // postmaster's hold the backends that exited (pgbench's, at its end).
      for (int f = 3; f <= 17 && rest >> field; ++f) {
        if (f == 4) parent = std::atoi(field.c_str());
        if (f == 14 || f == 15) own += std::atof(field.c_str());
        if (f == 16 || f == 17) reaped += std::atof(field.c_str());
      }
      if (pid == svd) {
        s.svd += own / tick;
      } else if (pid == postmaster || parent == postmaster) {
        s.postgres += (own + reaped) / tick;
      }
    }
    closedir(proc);
  }
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  s.client = seconds(self.ru_utime) + seconds(self.ru_stime);
  s.children = seconds(children.ru_utime) + seconds(children.ru_stime);
  // svd's context switches, summed over its threads (the threads a call
  // is handed between: gRPC's, the batch writers', the loops').
  if (DIR* tasks = opendir(absl::StrCat("/proc/", svd, "/task").c_str()); svd > 0 && tasks) {
    while (dirent* t = readdir(tasks)) {
      if (t->d_name[0] == '.') continue;
      std::istringstream status(ReadFile(absl::StrCat("/proc/", svd, "/task/", t->d_name,
                                                      "/status")));
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
            line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
          s.svd_switches += std::atof(line.substr(line.find(':') + 1).c_str());
        }
      }
    }
    closedir(tasks);
  }
  std::istringstream machine(ReadFile("/proc/stat"));
  std::string cpu_label;
  machine >> cpu_label;
  double v[8] = {};
  for (double& x : v) machine >> x;
  // user nice system idle iowait irq softirq steal
  s.machine_total = (v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]) / tick;
  s.machine_busy = s.machine_total - (v[3] + v[4]) / tick;
  return s;
}

// The children an interrupted bench must not leave running: svd, and the
// postmaster, which shuts down at once on SIGQUIT (its data directory is
// left in /tmp).
std::atomic<pid_t> svd_child{0};
std::atomic<pid_t> postmaster_child{0};

void StopChildrenAndExit(int signo) {
  if (pid_t p = svd_child.load(); p > 0) kill(p, SIGKILL);
  if (pid_t p = postmaster_child.load(); p > 0) kill(p, SIGQUIT);
  _exit(128 + signo);
}

}  // namespace

int main() {
  // Output piped into `head` must not kill the bench before it stops svd
  // and PostgreSQL; an interrupt stops them too (see StopChildren).
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, StopChildrenAndExit);
  signal(SIGTERM, StopChildrenAndExit);
  signal(SIGHUP, StopChildrenAndExit);
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
  // Extra server settings, space-separated (e.g. auto_explain's, to see
  // the plans of the statements inside the create and delete functions).
  if (const char* extra = std::getenv("SV_BENCH_PG_SETTINGS"); extra != nullptr) {
    std::istringstream words(extra);
    for (std::string word; words >> word;) pg_options.settings.push_back(word);
  }
  sv::store::EmbeddedPostgres pg(pg_options);
  if (absl::Status s = pg.Start(); !s.ok()) {
    std::fprintf(stderr, "bench: PostgreSQL: %s\n", s.ToString().c_str());
    return 1;
  }

  const std::string port_file = dir + "/port";
  const std::string key_file = dir + "/admin.key";
  postmaster_child = std::atoi(ReadFile(pg_options.data_dir + "/postmaster.pid").c_str());
  const pid_t svd = fork();
  if (svd > 0) svd_child = svd;
  if (svd == 0) {
    const std::string log = dir + "/svd.log";
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), STDERR_FILENO);
    std::vector<std::string> args = {
        SV_SVD_PATH, "--database-url", pg.url(), "--listen", "127.0.0.1:0", "--port-file",
        port_file, "--admin-key-file", key_file, "--sim-nodes", std::to_string(nodes),
        "--sim-leaves", "8", "--state-dir", dir + "/state", "--rate-limit-key-rps", "0",
        "--rate-limit-tenant-rps", "0", "--db-connections",
        std::to_string(EnvInt("SV_BENCH_DB_CONNECTIONS", 64)),
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
    signal(SIGPIPE, SIG_DFL);  // svd sets its own.
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
  // (ms into the run the create started at, latency): the profile's
  // latency per second shows whether slow creates follow the queue's growth
  // or come in bursts.
  std::vector<std::pair<int, double>> timeline_ms;
  std::atomic<int> errors{0};
  std::atomic<int> answered_pending{0};
  // A channel per 8 clients: like many client processes, not one. Each is
  // connected before the clock starts, as pgbench's tps leaves out its
  // initial connections.
  std::vector<std::unique_ptr<sv::v1::InstanceService::Stub>> stubs;
  for (int c = 0; c < clients; c += 8) {
    grpc::ChannelArguments args;
    args.SetInt("sv_bench_channel", c / 8);
    auto channel = grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      std::fprintf(stderr, "bench: could not connect to svd at %s\n", endpoint.c_str());
      kill(svd, SIGKILL);
      return 1;
    }
    stubs.push_back(sv::v1::InstanceService::NewStub(channel));
  }
  const pid_t postmaster = postmaster_child.load();
  const int warmup_seconds = EnvInt("SV_BENCH_WARMUP_SECONDS", 0);
  CpuSample cpu_before = SampleCpu(svd, postmaster);
  auto started = Clock::now();
  std::atomic<bool> warming{warmup_seconds > 0};
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
  // The clients are gRPC's callback API: each has one call in flight at a
  // time, and its next call starts from the last one's callback, on gRPC's
  // few threads. 64 blocking threads cost the shared 2 cores a tenth of
  // what a create costs, which pgbench, a lean C client, does not.
  struct Client {
    int c = 0;
    int n = 0;
    sv::v1::InstanceService::Stub* stub = nullptr;
    std::unique_ptr<grpc::ClientContext> context;
    sv::v1::CreateInstanceRequest request;
    sv::v1::Instance created;
    sv::v1::DeleteInstanceRequest del;
    sv::v1::Instance deleted;
    Clock::time_point t0;
    bool warm = false;  // Started during the warm-up: not counted.
    std::vector<double> mine;
    std::vector<int> mine_at;
  };
  std::vector<Client> pool(clients);
  std::mutex done_mutex;
  std::condition_variable done_cv;
  int running = clients;
  std::function<void(Client&)> next_create;
  auto finish = [&](Client& k) {
    std::lock_guard<std::mutex> lock(done_mutex);
    latencies_ms.insert(latencies_ms.end(), k.mine.begin(), k.mine.end());
    for (size_t i = 0; i < k.mine.size(); ++i) timeline_ms.emplace_back(k.mine_at[i], k.mine[i]);
    if (--running == 0) done_cv.notify_all();
  };
  auto fresh_context = [&](Client& k) {
    k.context = std::make_unique<grpc::ClientContext>();
    k.context->AddMetadata("authorization", "Bearer " + tokens[k.c % tokens.size()]);
    k.context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  };
  next_create = [&](Client& k) {
    if (stop.load()) {
      finish(k);
      return;
    }
    k.request.Clear();
    k.request.mutable_instance()->set_gpu_count(1);
    k.request.set_request_id(absl::StrCat("b", k.c, "-", k.n++));
    k.created.Clear();
    fresh_context(k);
    k.warm = warming.load();
    k.t0 = Clock::now();
    k.stub->async()->CreateInstance(
        k.context.get(), &k.request, &k.created, [&](grpc::Status s) {
          const Clock::time_point t1 = Clock::now();
          if (k.warm) {
            next_create(k);
            return;
          }
          k.mine.push_back(std::chrono::duration<double, std::milli>(t1 - k.t0).count());
          k.mine_at.push_back(static_cast<int>(
              std::chrono::duration<double, std::milli>(k.t0 - started).count()));
          if (!s.ok()) {
            ++errors;
            next_create(k);
            return;
          }
          if (k.created.state() == sv::v1::PENDING) ++answered_pending;
          if (!with_delete) {
            next_create(k);
            return;
          }
          k.del.set_id(k.created.id());
          fresh_context(k);
          k.stub->async()->DeleteInstance(k.context.get(), &k.del, &k.deleted,
                                          [&](grpc::Status d) {
                                            if (!d.ok()) ++errors;
                                            next_create(k);
                                          });
        });
  };
  for (int c = 0; c < clients; ++c) {
    pool[c].c = c;
    pool[c].stub = stubs[c / 8].get();
  }
  for (Client& k : pool) next_create(k);
  if (warmup_seconds > 0) {
    std::this_thread::sleep_for(std::chrono::seconds(warmup_seconds));
    cpu_before = SampleCpu(svd, postmaster);
    started = Clock::now();
    warming = false;
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  {
    std::unique_lock<std::mutex> lock(done_mutex);
    done_cv.wait(lock, [&] { return running == 0; });
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  const CpuSample cpu_after = SampleCpu(svd, postmaster);
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
    for (const auto& [at_ms, ms] : timeline_ms) by_second[at_ms / 1000].push_back(ms);
    for (auto& [second, v] : by_second) {
      std::sort(v.begin(), v.end());
      const auto over = std::count_if(v.begin(), v.end(), [](double ms) { return ms > 100; });
      std::printf("  %3d %6zu %8.1f %8.1f %8.1f %6ld\n", second, v.size(), v[v.size() / 2],
                  v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back(),
                  static_cast<long>(over));
    }
    // The first 3 s by the tenth of a second: what the start of a run costs.
    std::printf("profile: creates started in the first 3 s, by the 100 ms (ms | creates | "
                "p50 ms | max ms):\n");
    std::map<int, std::vector<double>> by_tenth;
    for (const auto& [at_ms, ms] : timeline_ms) {
      if (at_ms < 3000) by_tenth[at_ms / 100].push_back(ms);
    }
    for (auto& [tenth, v] : by_tenth) {
      std::sort(v.begin(), v.end());
      std::printf("  %5d %6zu %8.1f %8.1f\n", tenth * 100, v.size(), v[v.size() / 2], v.back());
    }
    // Without the first 3 s, in which the fleet fills (creates only) and the
    // simulated agents start what was placed.
    std::vector<double> later;
    for (const auto& [at_ms, ms] : timeline_ms) {
      if (at_ms >= 3000) later.push_back(ms);
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
  const CpuSample pgbench_before = SampleCpu(-1, postmaster);
  const std::string out = RunOutput(absl::StrCat(as_owner, PgBin(), "/pgbench -N -c ",
                                                 clients, " -j 2 -T ", seconds, " ", conn,
                                                 " sv 2>&1"));
  const CpuSample pgbench_after = SampleCpu(-1, postmaster);
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
  // CPU per operation: what a create costs the machine, against what a
  // pgbench transaction costs it. Unlike creates/s, these hardly move with
  // what else the shared machine runs.
  const double creates_done = std::max<double>(1, latencies_ms.size());
  const double create_total = (cpu_after.svd - cpu_before.svd) +
                              (cpu_after.postgres - cpu_before.postgres) +
                              (cpu_after.client - cpu_before.client);
  std::printf("CPU ms per create%s: svd %.3f, PostgreSQL %.3f, clients %.3f = %.3f; "
              "machine busy %.0f%% of %d cores (%.2f cores by others)\n",
              with_delete ? " (+ its delete)" : "",
              1000 * (cpu_after.svd - cpu_before.svd) / creates_done,
              1000 * (cpu_after.postgres - cpu_before.postgres) / creates_done,
              1000 * (cpu_after.client - cpu_before.client) / creates_done,
              1000 * create_total / creates_done,
              100 * (cpu_after.machine_busy - cpu_before.machine_busy) /
                  std::max(1e-9, cpu_after.machine_total - cpu_before.machine_total),
              static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)),
              ((cpu_after.machine_busy - cpu_before.machine_busy) - create_total) / elapsed);
  std::printf("svd context switches per create%s: %.1f\n", with_delete ? " (+ its delete)" : "",
              (cpu_after.svd_switches - cpu_before.svd_switches) / creates_done);
  const double txns = std::max(1.0, pgbench_tps * seconds);
  const double pgbench_postgres = pgbench_after.postgres - pgbench_before.postgres;
  const double pgbench_client = pgbench_after.children - pgbench_before.children;
  std::printf("CPU ms per pgbench transaction: PostgreSQL %.3f, pgbench %.3f = %.3f; "
              "CPU ratio (pgbench txn : create) = %.3f\n",
              1000 * pgbench_postgres / txns, 1000 * pgbench_client / txns,
              1000 * (pgbench_postgres + pgbench_client) / txns,
              create_total > 0 ? ((pgbench_postgres + pgbench_client) / txns) /
                                     (create_total / creates_done)
                               : 0.0);
  (void)pg.Stop();
  if (EnvInt("SV_BENCH_KEEP", 0) != 0) {
    std::printf("kept %s (server log: pg/server.log or pg/log)\n", dir.c_str());
    return 0;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
