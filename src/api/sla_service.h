#ifndef SV_API_SLA_SERVICE_H_
#define SV_API_SLA_SERVICE_H_

// The SLA monitor's gRPC services (proto/sv/v1/sla.proto, docs/sla.md):
// SlaTelemetryService (agents stream telemetry, node credential),
// SlaService (a tenant's windows and evidence), SlaAdminService (report and
// per-tenant overrides), and DevClockService (only with a fake clock).

#include <grpcpp/server_builder.h>

#include <memory>

#include "api/agent_service.h"
#include "api/auth.h"
#include "common/clock.h"
#include "sla/fleet_utilization.h"
#include "sla/runtime.h"
#include "store/store.h"

namespace sv::api {

struct SlaApiOptions {
  // How long a stream trusts its map of the node's GPUs to instances; a
  // sample for an unmapped GPU refreshes it sooner (at most every 250 ms).
  absl::Duration holders_ttl = absl::Seconds(1);
  // Takes every GPU sample's utilization per node and hour (dashboard);
  // may be null.
  sla::FleetUtilization* fleet_utilization = nullptr;
  // How often agents send telemetry (svd --agent-telemetry-interval-ms): a
  // silence in an idle streak is judged against it.
  absl::Duration telemetry_interval = absl::Seconds(10);
};

class SlaApi {
 public:
  // `fake_clock` non-null (svd --fake-clock-start) also serves DevClockService.
  SlaApi(store::Store& store, const Clock& clock, sla::Runtime& runtime, AgentApi& agents,
         AuthOptions auth, FakeClock* fake_clock, SlaApiOptions options = {});
  ~SlaApi();

  void RegisterWith(grpc::ServerBuilder& builder);
  // Ends every telemetry stream (agents reconnect); call before the gRPC
  // server shuts down.
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sv::api

#endif  // SV_API_SLA_SERVICE_H_
