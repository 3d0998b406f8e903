#include "tests/integration/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "store/migrations.h"
#include "tests/integration/janitor.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/billing.grpc.pb.h"

namespace sv::testing {
namespace fs = std::filesystem;

namespace {

std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "XXXXXX";
  char* dir = mkdtemp(pattern.data());
  if (dir == nullptr) std::abort();
  chmod(dir, 0755);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct PostgresHolder {
  PostgresHolder() {
    data_dir = MakeTempDir("sv-test-pg-");
    janitor::WatchDir(data_dir, /*remove=*/true);
    store::EmbeddedPostgresOptions options;
    options.data_dir = data_dir + "/data";
    options.durable = false;
    options.database = "postgres";
    options.settings = {"max_connections=300"};
    postgres = std::make_unique<store::EmbeddedPostgres>(options);
    absl::Status status = postgres->Start();
    if (!status.ok()) {
      fprintf(stderr, "cannot start test PostgreSQL: %s\n", status.ToString().c_str());
      std::abort();
    }
  }
  ~PostgresHolder() {
    postgres.reset();
    std::error_code ec;
    fs::remove_all(data_dir, ec);
    janitor::ForgetDir(data_dir);
  }
  std::string data_dir;
  std::unique_ptr<store::EmbeddedPostgres> postgres;
};

}  // namespace

double MetricSample(SvdProcess& svd, const std::string& series) {
  httplib::Client http("127.0.0.1", svd.http_port());
  http.set_read_timeout(5, 0);
  auto res = http.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return 0;
}

std::string SvdPath() { return SV_SVD_PATH; }
std::string SvctlPath() { return SV_SVCTL_PATH; }

store::EmbeddedPostgres& SharedPostgres() {
  static PostgresHolder* holder = new PostgresHolder();
  static bool registered = [] {
    std::atexit([] { delete holder; });
    return true;
  }();
  (void)registered;
  return *holder->postgres;
}

std::string CreateTestDatabase() {
  static std::atomic<int> counter{0};
  store::EmbeddedPostgres& pg = SharedPostgres();
  std::string name = absl::StrCat("sv_test_", getpid(), "_", counter++);
  pqxx::connection c(absl::StrCat("host=127.0.0.1 port=", pg.port(),
                                  " user=postgres dbname=postgres"));
  pqxx::nontransaction txn(c);
  txn.exec("CREATE DATABASE " + name);
  return absl::StrCat("host=127.0.0.1 port=", pg.port(), " user=postgres dbname=", name);
}

SvdProcess::SvdProcess(SvdOptions options) : options_(std::move(options)) {
  work_dir_ = MakeTempDir("sv-test-svd-");
  admin_key_file_ = work_dir_ + "/admin.key";
  log_path_ = work_dir_ + "/svd.log";
  // Kept for its log, but `svd --dev` keeps its PostgreSQL under it.
  janitor::WatchDir(work_dir_, /*remove=*/false);
}

SvdProcess::~SvdProcess() {
  if (pid_ > 0) Stop();
  janitor::ForgetDir(work_dir_);
  std::error_code ec;
  if (!::testing::Test::HasFailure() && getenv("SV_KEEP_TEST_DIRS") == nullptr) {
    fs::remove_all(work_dir_, ec);
  }
}

bool SvdProcess::Start() {
  const std::string port_file = work_dir_ + "/port";
  fs::remove(port_file);
  std::vector<std::string> args = {SvdPath(),
                                   "--listen",
                                   options_.keep_port_on_restart && port_ > 0
                                       ? "127.0.0.1:" + std::to_string(port_)
                                       : std::string("127.0.0.1:0"),
                                   "--port-file", port_file,
                                   "--admin-key-file", admin_key_file_,
                                   "--sim-nodes", std::to_string(options_.sim_nodes),
                                   "--sim-leaves", std::to_string(options_.sim_leaves),
                                   "--state-dir", state_dir(),
                                   "--http-listen", "127.0.0.1:0",
                                   "--http-port-file", work_dir_ + "/http-port",
                                   "--billing-create-credit-minutes",
                                   std::to_string(options_.billing_create_credit_minutes)};
  if (options_.dev) {
    args.insert(args.end(), {"--dev", "--svctl-config", svctl_config_home() + "/svctl/config.json"});
  } else {
    args.insert(args.end(), {"--database-url", options_.database_url});
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  // Agent streams learn of changes to their node's desired set only from
  // the signal (migration 0094), unless a test says otherwise: a change
  // that some path fails to signal waits for the hour-long backstop, and
  // the test that made it fails instead of passing on the backstop.
  if (std::none_of(options_.extra_args.begin(), options_.extra_args.end(),
                   [](const std::string& a) { return a.rfind("--agent-desired-", 0) == 0; })) {
    args.insert(args.end(), {"--agent-desired-backstop-ms", "3600000"});
  }
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (pid_ > 0) janitor::Watch(pid_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      janitor::Forget(pid_);
      pid_ = -1;
      fprintf(stderr, "svd exited early; log:\n%s\n", ReadFile(log_path_).c_str());
      return false;
    }
    std::string port = ReadFile(port_file);
    if (!port.empty() && port.back() == '\n') {
      port_ = std::stoi(port);
      std::string http_port = ReadFile(work_dir_ + "/http-port");
      http_port_ = http_port.empty() ? 0 : std::stoi(http_port);
      admin_key_ = ReadFile(admin_key_file_);
      while (!admin_key_.empty() && admin_key_.back() == '\n') admin_key_.pop_back();
      channel_ = grpc::CreateChannel(endpoint(), grpc::InsecureChannelCredentials());
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  fprintf(stderr, "svd did not start in time; log:\n%s\n", ReadFile(log_path_).c_str());
  return false;
}

int SvdProcess::Stop() {
  if (pid_ <= 0) return -1;
  // Drop our channel first: an idle client connection that nobody polls
  // holds svd's graceful shutdown for seconds.
  channel_.reset();
  kill(pid_, SIGTERM);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (waitpid(pid_, &status, WNOHANG) != pid_) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  janitor::Forget(pid_);
  pid_ = -1;
  channel_.reset();
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void SvdProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  janitor::Forget(pid_);
  pid_ = -1;
  channel_.reset();
}

std::string SvdProcess::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

std::shared_ptr<grpc::Channel> SvdProcess::channel() { return channel_; }

std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

v1::AgentMessage AgentRegistration(const std::string& node_name) {
  v1::AgentMessage m;
  auto* r = m.mutable_register_();
  r->set_node_name(node_name);
  r->set_gpu_model("RTX 4090");
  r->set_gpu_count(8);
  r->set_zone("z");
  r->set_pod("p");
  r->set_leaf_switch("l");
  r->set_driver("process");
  return m;
}

std::unique_ptr<store::Database> CreateMigratedDatabase(std::string* url, int connections_max) {
  store::DatabaseOptions options;
  options.url = CreateTestDatabase();
  if (url != nullptr) *url = options.url;
  if (connections_max > 0) options.connections_max = connections_max;
  auto db = std::make_unique<store::Database>(options);
  if (absl::Status migrated = store::ApplyMigrations(*db); !migrated.ok()) {
    ADD_FAILURE() << "migrations: " << migrated;
    return nullptr;
  }
  return db;
}

bool WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

void ExecSql(const std::string& url, const std::string& sql) {
  pqxx::connection c(url);
  pqxx::work txn(c);
  txn.exec(sql);
  txn.commit();
}

bool WaitForLockWaiter(const std::string& url) {
  pqxx::connection c(url);
  return WaitFor([&] {
    pqxx::nontransaction n(c);
    return n.exec1("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND wait_event_type = 'Lock'")[0]
               .as<int>() > 0;
  });
}

absl::Status AddSimulatedNodes(store::Store& store, int count, int leaves, absl::Time now) {
  for (int n = 0; n < count; ++n) {
    store::NodeRecord node;
    node.id = absl::StrCat("node-", n);
    node.name = node.id;
    node.zone = "z1";
    node.pod = "p1";
    node.leaf_switch = absl::StrCat("leaf-", n % leaves);
    node.gpu_model = "RTX 4090";
    node.simulated = true;
    if (absl::Status s = store.UpsertNode(node, now); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string CreateTenant(SvdProcess& svd, const std::string& name) {
  v1::AdminService::Stub admin(svd.channel());
  v1::CreateTenantRequest request;
  request.set_name(name);
  request.set_owner_email(name + "@example.com");
  v1::CreateTenantResponse response;
  grpc::Status status = admin.CreateTenant(Context(svd.admin_key()).get(), request, &response);
  if (!status.ok()) {
    ADD_FAILURE() << "CreateTenant " << name << ": " << status.error_message();
    return "";
  }
  return response.api_key();
}

std::string TenantIdByName(SvdProcess& svd, const std::string& name) {
  v1::BillingAdminService::Stub admin(svd.channel());
  v1::ListTenantBalancesResponse tenants;
  grpc::Status status = admin.ListTenantBalances(Context(svd.admin_key()).get(), {}, &tenants);
  if (!status.ok()) {
    ADD_FAILURE() << "ListTenantBalances: " << status.error_message();
    return "";
  }
  for (const auto& t : tenants.balances()) {
    if (t.tenant_name() == name) return t.tenant_id();
  }
  ADD_FAILURE() << "no tenant named " << name;
  return "";
}

void TopUpTenant(SvdProcess& svd, const std::string& name, const std::string& payment_id,
                 int64_t amount_micros) {
  v1::TopUpRequest topup;
  topup.set_tenant_id(TenantIdByName(svd, name));
  topup.set_payment_id(payment_id);
  topup.set_amount_micros(amount_micros);
  v1::BillingAdminService::Stub admin(svd.channel());
  v1::Transfer transfer;
  grpc::Status status = admin.TopUp(Context(svd.admin_key()).get(), topup, &transfer);
  if (!status.ok()) ADD_FAILURE() << "TopUp " << name << ": " << status.error_message();
}

RunResult RunCapture(const std::vector<std::string>& argv,
                     const std::vector<std::string>& env) {
  std::string dir = MakeTempDir("sv-test-run-");
  std::string out_path = dir + "/out", err_path = dir + "/err";
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    std::vector<std::string> args = argv, envs = env;
    std::vector<char*> a, e;
    for (auto& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : envs) e.push_back(s.data());
    e.push_back(nullptr);
    execve(a[0], a.data(), e.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

}  // namespace sv::testing
