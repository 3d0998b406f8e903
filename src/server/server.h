#ifndef SV_SERVER_SERVER_H_
#define SV_SERVER_SERVER_H_

#include <string>

#include "api/validation.h"

namespace sv::server {

struct ServerOptions {
  std::string listen_address = "127.0.0.1:7070";
  std::string database_url;       // Empty with `dev`: start an embedded cluster.
  bool dev = false;
  std::string state_dir = ".sv";  // Embedded cluster, keys and dev state.
  int database_connections_max = 16;
  int database_statement_timeout_ms = 10000;
  // Group commit of creates (store/create_batch.h): batches in flight at
  // most; 0 writes every create in its own transaction.
  int create_batch_lanes = 4;
  // Simulated fleet, registered at start and run by in-process simulated
  // agents that speak the real agent protocol to this svd.
  int sim_nodes = 0;
  int sim_leaves = 2;
  int sim_pods = 1;
  std::string sim_faults_file;  // Fault script for the simulated agents.
  // The simulated agents' longest wait between reconnects (svagent's own
  // default is 10 s, --reconnect-backoff-max-ms).
  int sim_reconnect_backoff_max_ms = 2000;
  // Node agents (docs/agent.md).
  int node_heartbeat_timeout_ms = 30000;
  int agent_heartbeat_interval_ms = 5000;
  int agent_telemetry_interval_ms = 10000;
  // The desired-set signal (docs/agent.md): off, every agent stream reads
  // its node's set every 500 ms; on, at once when it changes, and every
  // agent_desired_backstop_ms besides.
  bool agent_desired_signal = true;
  int agent_desired_backstop_ms = 30000;
  // Start confirmations of many nodes in one transaction (docs/agent.md):
  // at most this many such transactions in flight; 0, one per node report.
  int agent_confirm_batch_lanes = 4;
  // The same for the desired-set reads that tell nodes of new instances.
  int agent_desired_batch_lanes = 4;
  // Moving movable instances to free whole nodes (docs/scheduler.md,
  // "Moving instances"): on or off, and how long an instance must have run
  // before it may move.
  bool move_instances = true;
  int move_running_min_s = 600;
  // Waiting instances a queue pass reads (control/scheduling.h).
  int queue_max = 1000;
  // Operator bootstrap key: read from this file, or generated into it.
  std::string admin_key_file;
  // Where svd --dev writes svctl's config; empty means ~/.config/svctl.
  std::string svctl_config;
  // Token buckets per API key and per tenant (requests/s and burst); 0 = off.
  double rate_limit_key_rps = 100;
  double rate_limit_key_burst = 300;
  double rate_limit_tenant_rps = 300;
  double rate_limit_tenant_burst = 1000;
  double rate_limit_auth_failures_rps = 5;  // Per peer address.
  double rate_limit_auth_failures_burst = 50;
  // Cached API key lookups (docs/security.md, "Cached authentication"):
  // an entry's longest life; 0 turns the cache off.
  int auth_cache_max_age_ms = 30000;
  // TLS (docs/security.md): PEM files; empty cert and key: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;  // Optional: require client certificates.
  // HTTP for /metrics, /healthz and /readyz; empty turns it off.
  std::string http_listen_address;
  std::string http_port_file;
  // Threads serving HTTP connections (HttpServer::SetThreads).
  int http_threads = 64;
  // Written with the bound port once the server listens (for tests).
  std::string port_file;
  // Billing (docs/billing.md): credit a create needs, loop period, metering
  // lag, and the trial grant.
  int billing_create_credit_minutes = 10;
  int billing_interval_ms = 5000;
  int billing_batch_minutes = 1440;  // Most minutes one metering transaction covers.
  int billing_lag_ms = 60000;  // Above the node heartbeat timeout (30 s).
  long long trial_amount_micros = 10'000'000;
  // Credits above this need a second operator (docs/billing.md); -1: none.
  long long credit_approval_above_micros = 1'000'000'000;
  int trial_days = 30;
  // Webhooks (docs/notifications.md): let them reach loopback and private
  // addresses (dev and tests), and how often the loop looks for notices.
  bool webhook_allow_private = false;
  int webhook_interval_ms = 1000;
  int webhook_give_up_hours = 72;
  // The app registry host: tenants' private images are <host>/<tenant id>/
  // and a priced app's image must be in its publisher's (docs/marketplace.md).
  std::string app_registry = api::kDefaultAppRegistry;
  int unpaid_storage_grace_days = 7;  // 0: volumes with unpaid storage are kept.
  // Leader election (docs/reliability.md): the lease, its renewal period and
  // this replica's name in the lease row (default: host-pid-random).
  int leader_lease_ms = 5000;
  int leader_renew_ms = 1000;
  std::string replica_id;
  // SLA monitor (docs/sla.md): definitions file (JSON; empty: design.md's
  // defaults), grace period for late samples, checkpoint and judge periods.
  std::string sla_definitions_file;
  int sla_grace_ms = 300000;
  int sla_checkpoint_interval_ms = 5000;
  int sla_judge_interval_ms = 5000;
  // Tests and demos only: run on a fake clock starting at this RFC 3339
  // instant, moved only by DevClockService.AdvanceClock (docs/testing.md).
  std::string fake_clock_start;
};

// Runs svd until SIGTERM or SIGINT; returns the process exit code.
int RunServer(const ServerOptions& options);

}  // namespace sv::server

#endif  // SV_SERVER_SERVER_H_
