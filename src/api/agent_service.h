#ifndef SV_API_AGENT_SERVICE_H_
#define SV_API_AGENT_SERVICE_H_

// svd's side of the node-agent protocol (sv.v1.AgentService), the operator's
// NodeCredentialService, and the fleet monitor: nodes that miss heartbeats go
// down and idle instances are auto-stopped. Telemetry has its own stream
// (SlaTelemetryService, api/sla_service.h).

#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/auth.h"
#include "common/clock.h"
#include "control/loops.h"
#include "store/notification_listener.h"
#include "store/store.h"

namespace sv::api {

struct AgentApiOptions {
  absl::Duration heartbeat_timeout = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Seconds(5);    // Told to agents.
  absl::Duration telemetry_interval = absl::Seconds(10);   // Told to agents.
  // How often an agent stream reads its node's desired set while the
  // desired-set signal (desired_sink) is down, and while it is up.
  absl::Duration desired_poll_interval = absl::Milliseconds(500);
  absl::Duration desired_backstop_interval = absl::Seconds(30);
  absl::Duration monitor_interval = absl::Seconds(1);
  // Start confirmations of different nodes written in one transaction, at
  // most this many in flight (store::AgentStore::SetConfirmBatchLanes; 0:
  // one transaction per node report).
  int confirm_batch_lanes = 0;
  // The same for the desired-set reads (SetDesiredBatchLanes).
  int desired_batch_lanes = 0;
  // The operators' NodeCredentialService calls are held to the same rate
  // limits as every other API call (the flags); it used the defaults.
  AuthOptions auth;
};

class AgentApi {
 public:
  AgentApi(store::Store& store, const Clock& clock, control::ControlLoops* loops,
           AgentApiOptions options);
  ~AgentApi();

  void RegisterWith(grpc::ServerBuilder& builder);
  void StartMonitor();
  // Ends every agent stream (agents reconnect to whichever svd answers) and
  // the monitor; call before shutting the gRPC server down.
  void Stop();

  // For a node-agent stream of another service (SlaTelemetryService): the
  // node its credential (authorization: Bearer svn_...) is for, or
  // UNAUTHENTICATED with a reason; UNAVAILABLE while svd stops. The stream
  // is then ended like the agent streams when its credential is revoked (on
  // any replica) or svd stops. Pair with EndNodeStream.
  absl::StatusOr<std::string> AuthenticateNodeStream(grpc::ServerContext* context);
  void EndNodeStream(grpc::ServerContext* context);

  // Mints a node credential; returns the plaintext (only its hash is kept).
  absl::StatusOr<std::string> CreateNodeCredential(const std::string& node_name);

  // Feed of the revocation signal (api/credential_cache.h): a revoked node
  // credential's open streams end on this replica.
  store::NotificationSink* revocation_sink();

  // Feed of the desired-set signal (migration 0094, channel
  // sv_node_desired): the streams of the nodes it names read their set at
  // once. Without a feed, they poll.
  store::NotificationSink* desired_sink();

  struct Impl;  // Private to agent_service.cc.

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sv::api

#endif  // SV_API_AGENT_SERVICE_H_
