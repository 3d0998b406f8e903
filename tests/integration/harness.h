#ifndef SV_TESTS_INTEGRATION_HARNESS_H_
#define SV_TESTS_INTEGRATION_HARNESS_H_

// Shared fixtures for integration tests: a throwaway PostgreSQL cluster per
// test binary, a fresh database per test, and real svd processes.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "store/embedded_postgres.h"
#include "store/store.h"
#include "sv/v1/agent.pb.h"

namespace sv::testing {

// The cluster shared by all tests of one binary; started on first use and
// stopped at exit.
store::EmbeddedPostgres& SharedPostgres();

// Creates an empty database on the shared cluster and returns its URL.
std::string CreateTestDatabase();

// A fresh test database with the migrations applied, opened in the test's
// process (tests of the store and the loops without svd) with at most
// `connections_max` connections (0: the pool's default); its address goes
// to `url` unless that is nullptr. nullptr (and a test failure) if the
// migrations fail.
std::unique_ptr<store::Database> CreateMigratedDatabase(std::string* url,
                                                        int connections_max = 0);

// Calls `done` every 50 ms until it returns true (then true) or 30 s have
// passed (then its last answer): a failure bound, not a timing assertion.
bool WaitFor(const std::function<bool()>& done);

// Runs `sql` in its own committed transaction on the database at `url`.
void ExecSql(const std::string& url, const std::string& sql);

// Waits (as WaitFor) until a session of the database at `url` waits for a
// lock: a test holding rows in a transaction commits only once the call
// under test is blocked on them.
bool WaitForLockWaiter(const std::string& url);

struct SvdOptions {
  std::string database_url;
  int sim_nodes = 16;
  int sim_leaves = 2;
  std::vector<std::string> extra_args;
  // svd's default is 10 minutes; tests that are not about billing create
  // large instances on the trial credit alone, so they skip the credit gate.
  int billing_create_credit_minutes = 0;
  // A second Start() listens on the port of the first (agents reconnect to
  // a fixed endpoint).
  bool keep_port_on_restart = false;
  // `svd --dev`, as deploy/dev.sh runs it: its own PostgreSQL under the
  // state folder instead of database_url, and svctl's config written
  // under svctl_config_home().
  bool dev = false;
};

// A real svd child process listening on a free port.
class SvdProcess {
 public:
  explicit SvdProcess(SvdOptions options);
  ~SvdProcess();  // SIGTERM, then SIGKILL if it lingers.

  // Starts svd and waits until it listens; returns false on failure.
  bool Start();
  // Sends SIGTERM and waits; returns svd's exit code.
  int Stop();
  // SIGKILL, as in a crash.
  void Kill();

  std::string endpoint() const;
  int http_port() const { return http_port_; }
  const std::string& admin_key() const { return admin_key_; }
  const std::string& log_path() const { return log_path_; }
  // With SvdOptions::dev: where svd wrote svctl/config.json (svctl's
  // XDG_CONFIG_HOME).
  std::string svctl_config_home() const { return work_dir_ + "/config"; }
  std::string state_dir() const { return work_dir_ + "/state"; }
  std::shared_ptr<grpc::Channel> channel();

 private:
  SvdOptions options_;
  std::string work_dir_;
  std::string admin_key_file_;
  std::string log_path_;
  std::string admin_key_;
  pid_t pid_ = -1;
  int port_ = 0;
  int http_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

// One sample of svd's /metrics: the value of `series` (its name and labels,
// as rendered), 0 for a series not rendered yet, -1 when /metrics does not
// answer.
double MetricSample(SvdProcess& svd, const std::string& series);

// A fresh tenant created through the admin API; returns its API key.
std::string CreateTenant(SvdProcess& svd, const std::string& name);

// The id of the tenant named `name`, from the operators' balances ("" and
// a test failure when there is none).
std::string TenantIdByName(SvdProcess& svd, const std::string& name);

// An operator's top-up of that tenant (payment `payment_id`); a failure is
// a test failure.
void TopUpTenant(SvdProcess& svd, const std::string& name, const std::string& payment_id,
                 int64_t amount_micros);

// Context with the bearer token and a 30 s deadline.
std::unique_ptr<grpc::ClientContext> Context(const std::string& token);

// The first message of an agent stream: an 8 x RTX 4090 node on the process
// driver in zone z, pod p, leaf l.
v1::AgentMessage AgentRegistration(const std::string& node_name);

// Registers `count` simulated 8 x RTX 4090 nodes "node-0".. straight in the
// store (tests of the store and billing layers, without agents): zone z1,
// pod p1, node n on leaf "leaf-<n % leaves>".
absl::Status AddSimulatedNodes(store::Store& store, int count, int leaves, absl::Time now);

// Runs a program, returns exit code, captures stdout and stderr.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
RunResult RunCapture(const std::vector<std::string>& argv,
                     const std::vector<std::string>& env);

std::string SvdPath();
std::string SvctlPath();

}  // namespace sv::testing

#endif  // SV_TESTS_INTEGRATION_HARNESS_H_
