#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "api/agent_service.h"
#include "api/audit_batch.h"
#include "api/credential_cache.h"
#include "api/authz_interceptor.h"
#include "api/tenant_stop_enforcer.h"
#include "api/webhooks.h"
#include "api/metrics_interceptor.h"
#include "api/services.h"
#include "api/sla_service.h"
#include "metrics/metrics.h"
#include "server/http_server.h"
#include "server/rest_gateway.h"
#include "server/web_assets.h"
#include "billing/billing.h"
#include "common/clock.h"
#include "control/leadership.h"
#include "control/loops.h"
#include "server/bootstrap.h"
#include "server/tls.h"
#include "server/ops_metrics.h"
#include "sim/fleet.h"
#include "sla/fleet_utilization.h"
#include "sla/policy.h"
#include "sla/runtime.h"
#include "spdlog/spdlog.h"
#include "store/database.h"
#include "store/embedded_postgres.h"
#include "store/migrations.h"
#include "store/notification_listener.h"
#include "store/store.h"

namespace sv::server {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitStartFailed = 3;
constexpr int kMessageBytesMax = 4 << 20;
constexpr absl::Duration kShutdownGrace = absl::Seconds(10);

// Keeps retrying for a short while: a database that is still starting up is
// not a reason for svd to give up at once.
absl::Status ConnectWithRetry(store::Database& db) {
  absl::Status status;
  for (int attempt = 0; attempt < 30; ++attempt) {
    status = db.Ping();
    if (status.ok()) return status;
    spdlog::warn("server: database not reachable yet: {}", std::string(status.message()));
    absl::SleepFor(absl::Seconds(1));
  }
  return status;
}

bool WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int RunServer(const ServerOptions& options) {
  // Signals are taken by sigwait() below, never by a random thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // A fake clock (tests and demos) replaces the real one for everything:
  // loops, the ledger, the SLA monitor and the simulated agents.
  RealClock real_clock;
  std::unique_ptr<FakeClock> fake_clock;
  if (!options.fake_clock_start.empty()) {
    absl::Time start;
    std::string why;
    if (!absl::ParseTime(absl::RFC3339_full, options.fake_clock_start, &start, &why)) {
      spdlog::error("svd: --fake-clock-start is not an RFC 3339 time: {}", why);
      return kExitUsage;
    }
    fake_clock = std::make_unique<FakeClock>(start);
    spdlog::warn("svd: running on a FAKE clock from {} (tests and demos only)",
                 options.fake_clock_start);
  }
  const Clock& clock = fake_clock ? static_cast<const Clock&>(*fake_clock) : real_clock;
  std::unique_ptr<store::EmbeddedPostgres> postgres;
  std::string url = options.database_url;
  if (url.empty()) {
    if (!options.dev) {
      spdlog::error("svd: --database-url is required (or run svd --dev)");
      return kExitUsage;
    }
    postgres = std::make_unique<store::EmbeddedPostgres>(
        store::EmbeddedPostgresOptions{options.state_dir + "/pg", 0, true, "sv", {}});
    if (absl::Status s = postgres->Start(); !s.ok()) {
      spdlog::error("svd: cannot start the embedded PostgreSQL: {}", std::string(s.message()));
      return kExitStartFailed;
    }
    url = postgres->url();
  }

  store::DatabaseOptions db_options;
  db_options.url = url;
  db_options.connections_max = options.database_connections_max;
  db_options.statement_timeout = absl::Milliseconds(options.database_statement_timeout_ms);
  store::Database db(db_options);
  if (absl::Status s = ConnectWithRetry(db); !s.ok()) {
    spdlog::error("svd: cannot reach the database: {}", std::string(s.message()));
    return kExitStartFailed;
  }
  if (absl::Status s = store::ApplyMigrations(db); !s.ok()) {
    spdlog::error("svd: migrations failed: {}", std::string(s.message()));
    return kExitStartFailed;
  }
  // Pools open their connections before the API serves, so the first burst
  // of calls after a start does not set up connections on its path.
  auto warm = [](store::Database& pool) {
    if (absl::Status s = pool.Warm(pool.options().connections_max); !s.ok()) {
      spdlog::warn("svd: opening database connections: {}", std::string(s.message()));
    }
  };
  warm(db);
  // The create and delete batches have a pool of their own, one connection
  // per lane (store.h, SetBatchDatabase).
  store::DatabaseOptions batch_db_options = db_options;
  batch_db_options.connections_max = std::max(1, 2 * options.create_batch_lanes);
  store::Database batch_db(batch_db_options);
  store::Store store(db);
  store.SetCreateBatchLanes(options.create_batch_lanes);
  if (options.create_batch_lanes > 0) {
    warm(batch_db);
    store.SetBatchDatabase(&batch_db);
  }

  std::string admin_key_file = options.admin_key_file;
  if (admin_key_file.empty() && options.dev) admin_key_file = options.state_dir + "/admin.key";
  std::string admin_key, demo_key;
  if (!admin_key_file.empty()) {
    auto key = EnsureKeyFromFile(store, clock, admin_key_file, "operator",
                                 "operator@sv.local", store::Role::kOperator);
    if (!key.ok()) {
      spdlog::error("svd: operator key: {}", std::string(key.status().message()));
      return kExitStartFailed;
    }
    admin_key = *key;
  }
  if (options.dev) {
    auto key = EnsureKeyFromFile(store, clock, options.state_dir + "/demo.key", "demo",
                                 "demo@sv.local", store::Role::kMember);
    if (!key.ok()) {
      spdlog::error("svd: demo key: {}", std::string(key.status().message()));
      return kExitStartFailed;
    }
    demo_key = *key;
  }
  if (options.sim_nodes > 0) {
    absl::Status s = RegisterSimulatedFleet(store, clock, options.sim_nodes,
                                            options.sim_leaves, options.sim_pods);
    if (!s.ok()) {
      spdlog::error("svd: simulated fleet: {}", std::string(s.message()));
      return kExitStartFailed;
    }
  }

  std::vector<agent::Fault> sim_faults;
  if (!options.sim_faults_file.empty()) {
    auto faults = agent::ReadFaultScript(options.sim_faults_file);
    if (!faults.ok()) {
      spdlog::error("svd: {}", std::string(faults.status().message()));
      return kExitUsage;
    }
    sim_faults = *std::move(faults);
  }

  // Leadership has a pool of its own, so a busy API can never delay renewals.
  store::DatabaseOptions leader_db_options = db_options;
  leader_db_options.connections_max = 2;
  store::Database leader_db(leader_db_options);
  control::Leadership leadership(
      leader_db, {options.replica_id, absl::Milliseconds(options.leader_lease_ms),
                  absl::Milliseconds(options.leader_renew_ms)});
  control::LoopOptions loop_options;
  loop_options.scheduling.move_instances = options.move_instances;
  loop_options.scheduling.move_running_min = absl::Seconds(options.move_running_min_s);
  loop_options.scheduling.queue_max = options.queue_max;
  control::ControlLoops loops(store, clock, loop_options);
  loops.SetLeaderGate(&leadership);
  api::AgentApiOptions agent_options;
  agent_options.heartbeat_timeout = absl::Milliseconds(options.node_heartbeat_timeout_ms);
  agent_options.heartbeat_interval = absl::Milliseconds(options.agent_heartbeat_interval_ms);
  agent_options.telemetry_interval = absl::Milliseconds(options.agent_telemetry_interval_ms);
  agent_options.desired_backstop_interval =
      absl::Milliseconds(options.agent_desired_backstop_ms);
  agent_options.confirm_batch_lanes = options.agent_confirm_batch_lanes;
  agent_options.desired_batch_lanes = options.agent_desired_batch_lanes;
  agent_options.auth.per_key = {options.rate_limit_key_rps, options.rate_limit_key_burst};
  agent_options.auth.per_tenant = {options.rate_limit_tenant_rps,
                                   options.rate_limit_tenant_burst};
  agent_options.auth.failures_per_peer = {options.rate_limit_auth_failures_rps,
                                          options.rate_limit_auth_failures_burst};
  api::AgentApi agent_api(store, clock, &loops, agent_options);
  billing::BillingOptions billing_options;
  billing_options.create_credit_minutes = options.billing_create_credit_minutes;
  billing_options.loop_interval = absl::Milliseconds(options.billing_interval_ms);
  billing_options.batch_minutes_max = options.billing_batch_minutes;
  billing_options.metering_lag = absl::Milliseconds(options.billing_lag_ms);
  billing_options.trial_amount_micros = options.trial_amount_micros;
  billing_options.credit_approval_above_micros = options.credit_approval_above_micros;
  billing_options.trial_validity = absl::Hours(24 * options.trial_days);
  billing_options.unpaid_storage_grace = absl::Hours(24 * options.unpaid_storage_grace_days);
  billing_options.invoices_wait_for_sla_judge = true;  // sla_judge below.
  billing::Billing billing(db, store, clock, billing_options);
  billing::BillingLoop billing_loop(billing, clock);
  billing_loop.SetLeaderGate(&leadership);
  api::TenantStopEnforcer tenant_stops(store, clock, billing_options.loop_interval);
  tenant_stops.SetLeaderGate(&leadership);
  api::WebhookOptions webhook_options;
  webhook_options.allow_private_addresses = options.webhook_allow_private;
  webhook_options.interval = absl::Milliseconds(options.webhook_interval_ms);
  webhook_options.give_up_after = absl::Hours(options.webhook_give_up_hours);
  api::WebhookDispatcher webhooks(db, clock, webhook_options);
  webhooks.SetLeaderGate(&leadership);
  api::ApiDependencies api_deps{&store, &clock, &loops};
  api_deps.billing = &billing;
  api_deps.webhooks = webhook_options;
  api_deps.app_registry = options.app_registry;
  api_deps.auth = agent_options.auth;
  // Cached authentication and the revocation signal (docs/security.md).
  api::CredentialRevocation revocation(url, real_clock,
                                       absl::Milliseconds(options.auth_cache_max_age_ms));
  revocation.AddSink(agent_api.revocation_sink());
  revocation.Start();
  // The desired-set signal (migration 0094, docs/agent.md): agent streams
  // read their node's set when it changes rather than polling it.
  std::optional<store::NotificationListener> desired_listener;
  if (options.agent_desired_signal) {
    store::NotificationListenerOptions desired_options;
    desired_options.url = url;
    desired_options.channel = "sv_node_desired";
    desired_listener.emplace(desired_options, real_clock);
    desired_listener->AddSink(agent_api.desired_sink());
    desired_listener->Start();
    // As the revocation listener's: /metrics (served by `http`, declared
    // below and so stopped first) reads it while it lives.
    store::NotificationListener* listener = &*desired_listener;
    metrics::Registry::Default().AddCollector([listener](metrics::Registry& r) {
      r.SetGauge("sv_agent_desired_signal_listening",
                 "1 while the LISTEN connection for desired-set changes is up.", {},
                 listener->listening() ? 1 : 0);
      r.SetGauge("sv_agent_desired_signal_backend_pid",
                 "PostgreSQL backend of the desired-set LISTEN connection.", {},
                 listener->backend_pid());
    });
  }
  api_deps.auth.cache = revocation.cache();
  api::ApiServices api(api_deps);
  sla::SlaOptions sla_options;
  if (!options.sla_definitions_file.empty()) {
    auto definitions = sla::LoadDefinitionsFile(options.sla_definitions_file);
    if (!definitions.ok()) {
      spdlog::error("svd: {}", std::string(definitions.status().message()));
      return kExitUsage;
    }
    sla_options.definitions = *std::move(definitions);
  }
  sla_options.monitor.grace = absl::Milliseconds(options.sla_grace_ms);
  sla_options.checkpoint_interval = absl::Milliseconds(options.sla_checkpoint_interval_ms);
  sla_options.judge_interval = absl::Milliseconds(options.sla_judge_interval_ms);
  // Checkpoints are keyed by the replica's name, and a restart restores its
  // own by that name, so the default is stable across restarts: the host's
  // name. It was "svd" for every replica, and two replicas left at the
  // default overwrote each other's checkpoints: the leader then judged the
  // other's instances silent (three breaches an hour each). Replicas on one
  // host need --replica-id.
  sla_options.replica = options.replica_id;
  if (sla_options.replica.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    sla_options.replica = host[0] != '\0' ? host : "svd";
  }
  sla::Runtime sla_runtime(db, clock, sla_options);
  if (absl::Status s = sla_runtime.Restore(); !s.ok()) {
    spdlog::error("svd: SLA checkpoint: {}", std::string(s.message()));
    return kExitStartFailed;
  }
  sla::CheckpointLoop sla_checkpoints(sla_runtime);
  sla::JudgeLoop sla_judge(sla_runtime, clock);
  sla_judge.SetLeaderGate(&leadership);
  // Fleet GPU utilization for the dashboard, from the same telemetry streams.
  sla::FleetUtilization fleet_utilization(db, clock, sla_options.checkpoint_interval);
  api::SlaApiOptions sla_api_options;
  sla_api_options.fleet_utilization = &fleet_utilization;
  sla_api_options.telemetry_interval = agent_options.telemetry_interval;
  api::SlaApi sla_api(store, clock, sla_runtime, agent_api, api_deps.auth, fake_clock.get(),
                      sla_api_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  const TlsFiles tls{options.tls_cert_file, options.tls_key_file, options.tls_client_ca_file};
  auto credentials = GrpcServerCredentials(tls);
  if (!credentials.ok()) {
    spdlog::error("svd: {}", std::string(credentials.status().message()));
    return kExitUsage;
  }
  if (!tls.enabled() && options.listen_address.rfind("127.0.0.1:", 0) != 0 &&
      options.listen_address.rfind("localhost:", 0) != 0 &&
      options.listen_address.rfind("[::1]:", 0) != 0) {
    spdlog::warn("svd: serving plaintext gRPC on {}; API keys cross the network in the "
                 "clear (use --tls-cert and --tls-key)",
                 options.listen_address);
  }
  builder.AddListeningPort(options.listen_address, *credentials, &port);
  builder.SetMaxReceiveMessageSize(kMessageBytesMax);
  // The synchronous server keeps at most MAX_POLLERS idle threads (gRPC's
  // default: 2) and ends every other thread when its call is done, so under
  // 64 concurrent clients it created and ended about 1,000 threads a second
  // (docs/reliability.md, "Benchmark"). Idle threads cost only their stacks.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 256);
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> hooks;
    hooks.push_back(std::make_unique<api::MetricsInterceptorFactory>());
    // Authorization context and the audit log of every call (docs/security.md);
    // the sink writes to `db`, so creates and deletes may commit their calls'
    // rows in their own transactions.
    hooks.push_back(std::make_unique<api::AuthzInterceptorFactory>(
        api::BatchedDatabaseAuditSink(db, clock), /*in_transaction_audit=*/true));
    builder.experimental().SetInterceptorCreators(std::move(hooks));
  }
  api.RegisterWith(builder);
  agent_api.RegisterWith(builder);
  sla_api.RegisterWith(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("svd: cannot listen on {}", options.listen_address);
    return kExitStartFailed;
  }
  const std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  const std::string endpoint = absl::StrCat(host == "0.0.0.0" ? "127.0.0.1" : host, ":", port);
  std::atomic<bool> shutting_down{false};
  metrics::Registry::Default().AddCollector([&db](metrics::Registry& r) {
    const store::Database::PoolStats pool = db.Stats();
    r.SetGauge("sv_db_pool_connections", "Open database connections.", {}, pool.open);
    r.SetGauge("sv_db_pool_idle_connections", "Idle database connections.", {}, pool.idle);
    r.SetGauge("sv_db_pool_connections_max", "The pool's bound.", {}, pool.max);
  });
  RegisterOpsMetrics(db, leadership, clock);
  HttpServer http(
      options.http_listen_address,
      [&]() -> absl::Status {
        if (shutting_down.load()) return absl::UnavailableError("shutting down");
        return db.Ping();
      },
      options.tls_cert_file, options.tls_key_file);
  http.SetStatus([&] { return LeadershipStatusJson(leadership, shutting_down.load()); });
  http.SetThreads(options.http_threads);
  std::unique_ptr<RestGateway> rest;
  if (!options.http_listen_address.empty()) {
    // REST goes through this very gRPC server (rest_gateway.h).
    auto gateway = RestGateway::Create(
        RestRoutes(), server->InProcessChannel(grpc::ChannelArguments()),
        /*require_all_methods=*/false);
    if (!gateway.ok()) {
      spdlog::error("svd: REST routes: {}", std::string(gateway.status().message()));
      return kExitStartFailed;
    }
    rest = *std::move(gateway);
    rest->Mount(http.raw());
    MountWebConsole(http.raw());
    if (absl::Status s = http.Start(); !s.ok()) {
      spdlog::error("svd: {}", std::string(s.message()));
      return kExitStartFailed;
    }
    if (!options.http_port_file.empty() && !WritePortFile(options.http_port_file, http.port())) {
      spdlog::error("svd: cannot write {}", options.http_port_file);
      return kExitStartFailed;
    }
  }
  if (options.dev) {
    std::string path = options.svctl_config.empty() ? DefaultSvctlConfigPath()
                                                    : options.svctl_config;
    if (absl::Status s = WriteSvctlConfig(path, endpoint, demo_key, admin_key); !s.ok()) {
      spdlog::warn("svd: {}", std::string(s.message()));
    }
  }
  // The gRPC port file comes last: tests take it as the sign svd is up.
  if (!options.port_file.empty() && !WritePortFile(options.port_file, port)) {
    spdlog::error("svd: cannot write {}", options.port_file);
    return kExitStartFailed;
  }
  leadership.Start();
  loops.Start();
  billing_loop.Start();
  tenant_stops.Start();
  webhooks.Start();
  sla_checkpoints.Start();
  fleet_utilization.Start();
  sla_judge.Start();
  agent_api.StartMonitor();
  sim::FleetOptions fleet_options;
  fleet_options.endpoint = endpoint;
  fleet_options.nodes = sim::StandardFleet(options.sim_nodes, options.sim_leaves,
                                           options.sim_pods);
  fleet_options.faults = sim_faults;
  fleet_options.reconnect_backoff_max = absl::Milliseconds(options.sim_reconnect_backoff_max_ms);
  sim::SimulatedFleet fleet(
      fleet_options,
      [&](const std::string& node) { return agent_api.CreateNodeCredential(node); }, clock);
  if (absl::Status s = fleet.Start(); !s.ok()) {
    spdlog::error("svd: simulated agents: {}", std::string(s.message()));
    return kExitStartFailed;
  }
  spdlog::info("svd: serving gRPC on {}", endpoint);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("svd: got signal {}, shutting down", signal_number);
  shutting_down = true;  // /readyz turns 503 so balancers stop sending work.
  server->GetHealthCheckService()->Shutdown();
  fleet.Stop();
  agent_api.Stop();  // Agent streams would otherwise hold the grace period.
  sla_api.Stop();
  // Leader-only loops stop first and the lease is handed back at once, so
  // another replica takes over while this one drains its requests.
  billing_loop.Stop();
  tenant_stops.Stop();
  webhooks.Stop();
  loops.Stop();
  sla_judge.Stop();
  leadership.Stop();
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoNanoseconds(kShutdownGrace));
  server->Wait();
  sla_checkpoints.Stop();  // The final checkpoint, after every stream ended.
  fleet_utilization.Stop();
  http.Stop();
  // The LISTEN connections close before the database stops: left open,
  // they would take its shutdown for a lost connection, warn and dial it
  // again. Both stop within one ping (200 ms).
  if (desired_listener) desired_listener->RequestStop();
  revocation.RequestStop();
  if (desired_listener) desired_listener->Stop();
  revocation.Stop();
  if (postgres) {
    if (absl::Status s = postgres->Stop(); !s.ok()) {
      spdlog::warn("svd: stopping PostgreSQL: {}", std::string(s.message()));
    }
  }
  spdlog::info("svd: stopped");
  return kExitOk;
}

}  // namespace sv::server
