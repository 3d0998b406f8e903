// svd: the sv control-plane server. See docs/operations.md.
#include "absl/synchronization/mutex.h"
#include "CLI/CLI.hpp"
#include "api/validation.h"
#include "billing/billing.h"
#include "server/logging.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  // Debian builds Abseil without NDEBUG, so every absl::Mutex (gRPC's)
  // keeps a lock graph for deadlock detection and aborts on a cycle; it cost
  // svd about 2% of its CPU under load (docs/reliability.md, "Benchmark").
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  sv::server::ServerOptions o;
  std::string log_level = "info";
  std::string log_format = "text";
  CLI::App app{"svd - the sv GPU cloud control plane server"};
  app.add_flag("--dev", o.dev,
               "Embedded default: private PostgreSQL under --state-dir, a simulated "
               "fleet, and svctl configured");
  app.add_option("--listen", o.listen_address, "gRPC listen address (host:port; port 0 picks one)")
      ->capture_default_str();
  app.add_option("--database-url", o.database_url, "libpq URL of PostgreSQL")
      ->envname("SV_DATABASE_URL");
  app.add_option("--state-dir", o.state_dir, "Folder for the embedded cluster and keys")
      ->capture_default_str();
  app.add_option("--db-connections", o.database_connections_max,
                 "Most open database connections")
      ->check(CLI::Range(1, 512))
      ->capture_default_str();
  app.add_option("--db-statement-timeout-ms", o.database_statement_timeout_ms,
                 "Timeout of every SQL statement")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--create-batch-lanes", o.create_batch_lanes,
                 "Most create (and delete) transactions in flight at once; creates arriving "
                 "together share one, and a second starts only when 64 calls wait or the "
                 "first has run 100 ms (0: one transaction per create)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--sim-nodes", o.sim_nodes,
                 "Simulated 8-GPU nodes to register (default 16 with --dev, else 0)")
      ->check(CLI::Range(0, 20000));
  app.add_option("--sim-leaves", o.sim_leaves, "Leaf switches of the simulated fleet")
      ->check(CLI::Range(1, 2000))
      ->capture_default_str();
  app.add_option("--sim-pods", o.sim_pods, "Pods of the simulated fleet")
      ->check(CLI::Range(1, 200))
      ->capture_default_str();
  app.add_option("--sim-faults", o.sim_faults_file,
                 "Fault script for the simulated agents (see docs/agent.md)");
  app.add_option("--sim-reconnect-backoff-max-ms", o.sim_reconnect_backoff_max_ms,
                 "Longest wait of a simulated agent between reconnects (svagent: 10000)")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--node-heartbeat-timeout-ms", o.node_heartbeat_timeout_ms,
                 "A node silent this long is declared down")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str();
  app.add_option("--agent-heartbeat-interval-ms", o.agent_heartbeat_interval_ms,
                 "Heartbeat interval told to agents")
      ->check(CLI::Range(50, 600000))
      ->capture_default_str();
  app.add_option("--agent-telemetry-interval-ms", o.agent_telemetry_interval_ms,
                 "Telemetry batch interval told to agents")
      ->check(CLI::Range(50, 3600000))
      ->capture_default_str();
  app.add_option("--agent-desired-signal", o.agent_desired_signal,
                 "Send agents their desired set when a change is signalled (LISTEN "
                 "sv_node_desired) instead of polling every 500 ms")
      ->capture_default_str();
  app.add_option("--agent-desired-backstop-ms", o.agent_desired_backstop_ms,
                 "With the signal up, read each node's desired set this often anyway")
      ->check(CLI::Range(500, 3600000))
      ->capture_default_str();
  app.add_option("--agent-confirm-batch-lanes", o.agent_confirm_batch_lanes,
                 "Most start-confirmation transactions in flight at once; the reports of "
                 "nodes arriving together share one, and a second starts only when 64 "
                 "wait or the first has run 100 ms (0: one transaction per node report)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--agent-desired-batch-lanes", o.agent_desired_batch_lanes,
                 "Most desired-set read transactions in flight at once; the reads of nodes "
                 "arriving together share one, as the start confirmations do (0: one "
                 "transaction per read)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--move-instances", o.move_instances,
                 "Move instances whose tenants allow it (svctl movable) to free whole nodes "
                 "for a waiting instance of 8 GPUs or more")
      ->capture_default_str();
  app.add_option("--queue-max", o.queue_max,
                 "Waiting instances a queue pass reads in queue order (and the first 8 of "
                 "each tenant missing from them)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--move-running-min-s", o.move_running_min_s,
                 "An instance must have run this long since its last start before it may move")
      ->check(CLI::Range(0, 7 * 24 * 3600))
      ->capture_default_str();
  app.add_option("--admin-key-file", o.admin_key_file,
                 "Operator bootstrap key: read from this file, or generated into it");
  app.add_option("--svctl-config", o.svctl_config,
                 "Where --dev writes svctl's config (default ~/.config/svctl/config.json)");
  app.add_option("--port-file", o.port_file, "Write the bound gRPC port here");
  app.add_option("--http-listen", o.http_listen_address,
                 "HTTP address for /metrics, /healthz and /readyz (empty: off)")
      ->capture_default_str();
  app.add_option("--http-port-file", o.http_port_file, "Write the bound HTTP port here");
  app.add_option("--http-threads", o.http_threads,
                 "Threads serving HTTP; each open connection (idle keep-alive included) holds one")
      ->check(CLI::Range(4, 4096))
      ->capture_default_str();
  app.add_option("--rate-limit-key-rps", o.rate_limit_key_rps,
                 "Requests per second per API key (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rate-limit-key-burst", o.rate_limit_key_burst, "Burst per API key")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rate-limit-tenant-rps", o.rate_limit_tenant_rps,
                 "Requests per second per tenant (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rate-limit-tenant-burst", o.rate_limit_tenant_burst, "Burst per tenant")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rate-limit-auth-failures-rps", o.rate_limit_auth_failures_rps,
                 "Failed authentications per second per peer address (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rate-limit-auth-failures-burst", o.rate_limit_auth_failures_burst,
                 "Burst of failed authentications per peer address")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--auth-cache-max-age-ms", o.auth_cache_max_age_ms,
                 "Longest life of a cached API key lookup; revocations reach every "
                 "replica's cache through LISTEN/NOTIFY (0: no cache)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--tls-cert", o.tls_cert_file,
                 "PEM certificate chain for gRPC and HTTP (with --tls-key; else plaintext)");
  app.add_option("--tls-key", o.tls_key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", o.tls_client_ca_file,
                 "PEM CA bundle; when set, gRPC clients must present a certificate it signed");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--log-format", log_format,
                 "text, or json (one object per line with tenant and request_id)")
      ->check(CLI::IsMember({"text", "json"}))
      ->envname("SV_LOG_FORMAT")
      ->capture_default_str();
  app.add_option("--billing-create-credit-minutes", o.billing_create_credit_minutes,
                 "A create needs credit for this many minutes of the instance (0: no check)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--billing-interval-ms", o.billing_interval_ms, "Period of the billing loop")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str();
  app.add_option("--billing-batch-minutes", o.billing_batch_minutes,
                 "Most minutes one metering transaction covers when billing catches up")
      ->check(CLI::Range(1, 1440))
      ->capture_default_str();
  app.add_option("--billing-lag-ms", o.billing_lag_ms,
                 "A minute is billed this long after it ends (late RUNNING events)")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--trial-amount-micros", o.trial_amount_micros,
                 "Trial credit granted once per tenant, micro-yuan")
      ->check(CLI::Range(0LL, 1'000'000'000LL))
      ->capture_default_str();
  app.add_option("--credit-approval-above-micros", o.credit_approval_above_micros,
                 "Operator credits above this (or that take one operator's unapproved credits "
                 "of 24 hours above it) need a second operator's approval; -1: none do")
      ->check(CLI::Range(-1LL, 10'000'000'000'000LL))
      ->capture_default_str();
  app.add_option("--trial-days", o.trial_days, "Days until a trial grant expires")
      ->check(CLI::Range(1, 3650))
      ->capture_default_str();
  app.add_flag("--webhook-allow-private", o.webhook_allow_private,
               "Let tenants' webhooks reach loopback and private addresses (dev, tests)");
  app.add_option("--webhook-give-up-hours", o.webhook_give_up_hours,
                 "A webhook failing this long without a delivery is turned off (0: never)")
      ->check(CLI::Range(0, 8760))
      ->capture_default_str();
  app.add_option("--webhook-interval-ms", o.webhook_interval_ms,
                 "How often notices are looked for to send to tenants' webhooks")
      ->check(CLI::Range(50, 600000))
      ->capture_default_str();
  app.add_option("--app-registry", o.app_registry,
                 "Registry host of tenants' private images (HOST/TENANT_ID/...); a priced "
                 "app's image must be in its publisher's namespace there")
      ->check([](const std::string& host) {
        return sv::api::IsRegistryHost(host)
                   ? std::string()
                   : std::string("must be a registry host: lower-case, with a '.' or ':', "
                                 "or localhost");
      })
      ->capture_default_str();
  app.add_option("--unpaid-storage-grace-days", o.unpaid_storage_grace_days,
                 "A volume whose storage goes unpaid this many days is deleted (0: kept)")
      ->check(CLI::Range(0, 3650))
      ->capture_default_str();
  app.add_option("--sla-definitions", o.sla_definitions_file,
                 "SLA definitions, a JSON file (docs/sla.md); default: design.md's");
  app.add_option("--sla-grace-ms", o.sla_grace_ms,
                 "Late telemetry counts this long after an hour ends; then it is judged")
      ->check(CLI::Range(0, 86400000))
      ->capture_default_str();
  app.add_option("--sla-checkpoint-interval-ms", o.sla_checkpoint_interval_ms,
                 "How often open SLA windows are checkpointed to PostgreSQL")
      ->check(CLI::Range(50, 3600000))
      ->capture_default_str();
  app.add_option("--sla-judge-interval-ms", o.sla_judge_interval_ms,
                 "How often the SLA judge looks for closed hours")
      ->check(CLI::Range(50, 3600000))
      ->capture_default_str();
  app.add_option("--fake-clock-start", o.fake_clock_start,
                 "TESTS AND DEMOS ONLY: run on a fake clock from this RFC 3339 time, moved "
                 "by DevClockService.AdvanceClock (docs/testing.md)");
  app.add_option("--leader-lease-ms", o.leader_lease_ms,
                 "Leader lease: a leader silent this long is replaced (docs/reliability.md)")
      ->check(CLI::Range(500, 600000))
      ->capture_default_str();
  app.add_option("--leader-renew-ms", o.leader_renew_ms,
                 "How often the leader renews its lease and followers campaign")
      ->check(CLI::Range(100, 60000))
      ->capture_default_str();
  app.add_option("--replica-id", o.replica_id,
                 "This replica's name in the leader lease (default: host-pid-random)")
      ->envname("SV_REPLICA_ID");
  auto* audit = app.add_subcommand(
      "audit", "Check every ledger invariant against --database-url; exit 1 on a failure");
  audit->fallthrough();
  bool sim_nodes_given = false;
  app.callback([&] { sim_nodes_given = app.count("--sim-nodes") > 0; });
  CLI11_PARSE(app, argc, argv);
  if (*audit) {
    if (o.database_url.empty()) {
      spdlog::error("svd audit: --database-url is required");
      return 2;
    }
    return sv::billing::RunAuditCommand(o.database_url);
  }
  if (o.dev && !sim_nodes_given) o.sim_nodes = 16;
  sv::server::ConfigureLogging(log_format, log_level);
  if (o.sim_nodes > 0 && !o.tls_cert_file.empty()) {
    // The simulated agents dial in plaintext; with TLS they could never
    // register, and the fleet would silently stay empty.
    spdlog::error("svd: --sim-nodes cannot be combined with --tls-cert (simulated agents "
                  "connect in plaintext); run the simulated fleet without TLS");
    return 2;
  }
  return sv::server::RunServer(o);
}
