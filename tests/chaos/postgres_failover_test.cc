// PostgreSQL restarts and failover under svd, on clusters of this test's
// own: (1) the server is killed (immediate stop) and restarted in the
// middle of a load; (2) a streaming replica made with pg_basebackup -R is
// promoted after the primary stops, and svd, given a multi-host URL with
// target_session_attrs=read-write, finds it. In both, svd recovers by
// itself within seconds and no acknowledged write is lost.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/embedded_postgres.h"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/chaos/chaos_util.h"
#include "tests/integration/harness.h"
#include "tests/integration/janitor.h"

namespace sv::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string BinDir() {
  for (int v = 17; v >= 13; --v) {
    const std::string dir = absl::StrCat("/usr/lib/postgresql/", v, "/bin");
    if (fs::exists(dir + "/pg_ctl")) return dir;
  }
  return "/usr/lib/postgresql/15/bin";
}

// PostgreSQL refuses to run as root; as root, tools run as `postgres`.
int RunAsOwner(std::vector<std::string> argv) {
  if (geteuid() == 0) argv.insert(argv.begin(), {"runuser", "-u", "postgres", "--"});
  int code = -1;
  absl::Status s = store::RunProgram(argv, "", &code);
  return s.ok() ? code : -1;
}

std::string MakeDir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  chmod(dir.c_str(), 0755);
  // Its clusters are stopped and it is removed should this process die.
  janitor::WatchDir(dir, /*remove=*/true);
  return dir;
}

// One create, retried with its request_id until an answer or `within`.
grpc::Status CreateWithRetry(const std::string& endpoint, const std::string& token,
                             const std::string& request_id, absl::Duration within,
                             v1::Instance* out, int gpus = 1) {
  auto stub = v1::InstanceService::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(gpus);
  request.set_request_id(request_id);
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(within);
  grpc::Status status;
  do {
    auto context = Context(token);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    status = stub->CreateInstance(context.get(), request, out);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (Clock::now() < deadline);
  return status;
}

double MetricValue(int http_port, const std::string& name) {
  httplib::Client client("127.0.0.1", http_port);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  const size_t at = res->body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(res->body.substr(at + name.size() + 2));
}

// A durable cluster of the test's own under `dir`: an immediate stop is a
// crash, so acknowledged means on disk.
store::EmbeddedPostgresOptions DurableCluster(const std::string& dir,
                                              std::vector<std::string> settings = {}) {
  store::EmbeddedPostgresOptions options;
  options.data_dir = dir + "/data";
  options.port = store::PickFreePort();
  options.durable = true;
  options.database = "sv";
  options.settings = std::move(settings);
  return options;
}

TEST(PostgresFailoverTest, RestartUnderLoadRecoversWithinSecondsAndLosesNothing) {
  const std::string dir = MakeDir("sv-chaos-pg-");
  const store::EmbeddedPostgresOptions pg_options = DurableCluster(dir, {"max_connections=200"});
  store::EmbeddedPostgres pg(pg_options);
  ASSERT_TRUE(pg.Start().ok());

  SvdOptions options{pg.url(), 8, 2,
                     {"--billing-interval-ms", "200", "--rate-limit-key-rps", "0",
                      "--rate-limit-tenant-rps", "0", "--trial-amount-micros", "1000000000"}};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "restart");
  ASSERT_FALSE(token.empty());
  // The probe's own tenant: the load's keeps 70% of its creates and may
  // reach its limit of 1,000 unfinished instances before the probe.
  const std::string probe_token = CreateTenant(svd, "probe");
  ASSERT_FALSE(probe_token.empty());
  const std::string endpoint = svd.endpoint();
  chaos::LoadOptions load_options;
  load_options.tenant_tokens = {token};
  load_options.clients = 6;
  load_options.creates_per_client = 0;
  load_options.gpu_count_max = 2;
  chaos::Load load(load_options, [&](int) { return endpoint; });
  load.Start();
  std::this_thread::sleep_for(std::chrono::seconds(2));

  ASSERT_EQ(RunAsOwner({BinDir() + "/pg_ctl", "-D", pg_options.data_dir, "-m", "immediate",
                        "-w", "stop"}),
            0);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // The outage.
  ASSERT_TRUE(pg.Start().ok());
  const auto up = Clock::now();
  v1::Instance probe;
  grpc::Status probed =
      CreateWithRetry(endpoint, probe_token, "probe-after-restart", absl::Seconds(30), &probe);
  const double recovery_s = std::chrono::duration<double>(Clock::now() - up).count();
  ASSERT_TRUE(probed.ok()) << probed.error_message();
  std::printf("postgres restart: first create %.2f s after the server was back\n", recovery_s);
  EXPECT_LT(recovery_s, 10.0) << "svd did not recover within seconds";
  std::this_thread::sleep_for(std::chrono::seconds(2));
  load.Stop();
  EXPECT_GT(MetricValue(svd.http_port(), "sv_db_broken_connections"), 0);
  EXPECT_EQ(svd.Stop(), 0);

  auto acknowledged = load.acknowledged();
  acknowledged.push_back({probe.id(), probe_token, "probe-after-restart", false});
  EXPECT_EQ(load.unanswered(), 0);
  const auto failures = chaos::CheckInvariants(pg.url(), acknowledged);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  std::printf("postgres restart: %zu acknowledged creates, all present\n", acknowledged.size());
  EXPECT_TRUE(pg.Stop().ok());
  std::error_code ec;
  fs::remove_all(dir, ec);
  janitor::ForgetDir(dir);
}

// Agents cannot heartbeat into a database that is away. An outage longer
// than the node heartbeat timeout (a Patroni failover takes 30 s and more)
// used to end with the new term's first health check judging every node
// whose agent had not heartbeated in the second since the server came
// back: marked down, its instances stopped, the fleet emptied. The agents'
// streams end in the outage, and each registers again at the end of its
// reconnect wait, up to svagent's 10 s. Scaled down: heartbeats every 8 s,
// a 10 s timeout, a 22 s outage; the new term comes about a second after
// the server, when most agents have neither registered nor heartbeated
// again (without the rule, 7 of the 8 instances were stopped).
TEST(PostgresFailoverTest, AnOutageLongerThanTheHeartbeatTimeoutDownsNoNode) {
  const std::string dir = MakeDir("sv-chaos-pg-");
  const store::EmbeddedPostgresOptions pg_options = DurableCluster(dir);
  store::EmbeddedPostgres pg(pg_options);
  ASSERT_TRUE(pg.Start().ok());

  SvdOptions options{pg.url(), 8, 2,
                     {"--node-heartbeat-timeout-ms", "10000", "--agent-heartbeat-interval-ms",
                      "8000", "--sim-reconnect-backoff-max-ms", "10000"}};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "outage");
  ASSERT_FALSE(token.empty());
  for (int i = 0; i < 8; ++i) {
    v1::Instance created;
    // A whole node each: a node marked down stops one of them.
    grpc::Status status = CreateWithRetry(svd.endpoint(), token, absl::StrCat("outage-", i),
                                          absl::Seconds(10), &created, 8);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_TRUE(WaitFor([&] {
    return chaos::QueryInt(pg.url(), "SELECT count(*) FROM instances WHERE state = 'RUNNING'") ==
           8;
  }));

  ASSERT_EQ(RunAsOwner({BinDir() + "/pg_ctl", "-D", pg_options.data_dir, "-m", "immediate",
                        "-w", "stop"}),
            0);
  std::this_thread::sleep_for(std::chrono::seconds(22));  // Over twice the timeout.
  ASSERT_TRUE(pg.Start().ok());
  // Past a new term's first health checks and a full timeout after them.
  std::this_thread::sleep_for(std::chrono::seconds(13));

  EXPECT_EQ(chaos::QueryInt(pg.url(), "SELECT count(*) FROM nodes WHERE state = 'down'"), 0)
      << "nodes were marked down for heartbeats the database could not take";
  EXPECT_EQ(chaos::QueryInt(pg.url(), "SELECT count(*) FROM instances WHERE state = 'RUNNING'"),
            8);
  EXPECT_EQ(svd.Stop(), 0);
  EXPECT_TRUE(pg.Stop().ok());
  std::error_code ec;
  fs::remove_all(dir, ec);
  janitor::ForgetDir(dir);
}

TEST(PostgresFailoverTest, PromotedStreamingReplicaTakesOverThroughAMultiHostUrl) {
  const std::string dir = MakeDir("sv-chaos-ha-");
  store::EmbeddedPostgresOptions primary_options;
  primary_options.data_dir = dir + "/primary";
  primary_options.port = store::PickFreePort();
  primary_options.durable = true;
  primary_options.database = "sv";
  primary_options.settings = {"max_connections=100", "wal_level=replica", "max_wal_senders=4"};
  auto primary = std::make_unique<store::EmbeddedPostgres>(primary_options);
  ASSERT_TRUE(primary->Start().ok());

  // The standby: a base backup with -R (standby.signal and primary_conninfo).
  const std::string standby_dir = dir + "/standby";
  fs::create_directory(standby_dir);
  chmod(standby_dir.c_str(), 0700);
  if (geteuid() == 0) {
    ASSERT_EQ(std::system(("chown postgres: " + standby_dir).c_str()), 0);
  }
  ASSERT_EQ(RunAsOwner({BinDir() + "/pg_basebackup", "-D", standby_dir, "-R", "-X", "stream",
                        "-c", "fast", "-h", "127.0.0.1", "-p",
                        std::to_string(primary->port()), "-U", "postgres"}),
            0);
  store::EmbeddedPostgresOptions standby_options;
  standby_options.data_dir = standby_dir;
  standby_options.port = store::PickFreePort();
  standby_options.durable = true;
  standby_options.database = "postgres";  // Exists already; a standby cannot create one.
  standby_options.settings = {"max_connections=100"};
  store::EmbeddedPostgres standby(standby_options);
  ASSERT_TRUE(standby.Start().ok());

  const std::string url = absl::StrCat("postgresql://postgres@127.0.0.1:", primary->port(),
                                       ",127.0.0.1:", standby.port(),
                                       "/sv?target_session_attrs=read-write&connect_timeout=3");
  SvdProcess svd(SvdOptions{url, 4, 1, {"--rate-limit-key-rps", "0"}});
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "failover");
  ASSERT_FALSE(token.empty());
  std::vector<chaos::Acknowledged> acknowledged;
  for (int i = 0; i < 5; ++i) {
    v1::Instance created;
    const std::string rid = absl::StrCat("before-", i);
    ASSERT_TRUE(CreateWithRetry(svd.endpoint(), token, rid, absl::Seconds(5), &created).ok());
    acknowledged.push_back({created.id(), token, rid, false});
  }

  // The primary goes away (a clean stop sends all WAL to the standby
  // first), and the standby is promoted.
  primary.reset();
  const auto failed_at = Clock::now();
  ASSERT_EQ(RunAsOwner({BinDir() + "/pg_ctl", "-D", standby_dir, "-w", "promote"}), 0);
  v1::Instance after;
  grpc::Status status =
      CreateWithRetry(svd.endpoint(), token, "after-promotion", absl::Seconds(30), &after);
  const double recovery_s = std::chrono::duration<double>(Clock::now() - failed_at).count();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::printf("failover: first create %.2f s after the primary stopped\n", recovery_s);
  EXPECT_LT(recovery_s, 15.0);
  acknowledged.push_back({after.id(), token, "after-promotion", false});
  // The leader lease lives on in the new primary: svd keeps leading and
  // placing. The instance gets placed there.
  bool placed = false;
  for (int i = 0; i < 100 && !placed; ++i) {
    placed = chaos::QueryInt(absl::StrCat("host=127.0.0.1 port=", standby.port(),
                                          " user=postgres dbname=sv"),
                             "SELECT count(*) FROM instances WHERE id = '" + after.id() +
                                 "' AND state <> 'PENDING'") == 1;
    if (!placed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(placed) << "the instance created after the failover was never placed";
  EXPECT_EQ(svd.Stop(), 0);
  const std::string new_primary =
      absl::StrCat("host=127.0.0.1 port=", standby.port(), " user=postgres dbname=sv");
  const auto failures = chaos::CheckInvariants(new_primary, acknowledged);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  EXPECT_TRUE(standby.Stop().ok());
  std::error_code ec;
  fs::remove_all(dir, ec);
  janitor::ForgetDir(dir);
}

}  // namespace
}  // namespace sv::testing
