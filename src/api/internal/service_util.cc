#include "api/internal/service_util.h"

#include "api/errors.h"
#include "api/validation.h"
#include "billing/billing.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"
#include "spdlog/spdlog.h"

namespace sv::api::internal {

using google::protobuf::util::TimeUtil;

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

void ToProto(const store::InstanceRecord& r, v1::Instance* out) {
  out->set_id(r.id);
  out->set_tenant_id(r.tenant_id);
  out->set_name(r.spec.name);
  out->set_gpu_count(r.spec.gpu_count);
  out->set_gpu_model(r.spec.gpu_model);
  out->set_image(r.spec.image);
  out->set_max_leaves(r.spec.max_leaves);
  out->set_movable(r.movable);
  out->set_state(static_cast<v1::InstanceState>(static_cast<int>(r.state) + 1));
  out->set_state_reason(r.state_reason);
  out->set_request_id(r.request_id);
  *out->mutable_create_time() = ToProto(r.created_at);
  *out->mutable_update_time() = ToProto(r.updated_at);
  for (const auto& p : r.placement) {
    auto* np = out->add_placement();
    np->set_node_id(p.node_id);
    np->set_node_name(p.node_name);
    np->set_leaf_switch(p.leaf_switch);
    np->set_pod(p.pod);
    for (int g : p.gpu_indices) np->add_gpu_indices(g);
  }
}

absl::Status CheckInstanceId(const std::string& id) {
  if (id.empty()) {
    return Error(absl::StatusCode::kInvalidArgument, "MISSING_ID", "id is required");
  }
  if (!LooksLikeId(id, "ins")) {
    // A malformed id can name no instance; answer as for an unknown one.
    return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
                 "instance " + id.substr(0, 64) + " not found");
  }
  return absl::OkStatus();
}

// Logs the outcome of a call with the caller and request id, then converts it.
grpc::Status Finish(const char* method, const store::Principal* who,
                    const std::string& request_id, const absl::Status& status) {
  const std::string tenant = who ? who->tenant_id : "-";
  if (status.ok()) {
    spdlog::debug("api: {} ok tenant={} request_id={}", method, tenant, request_id);
  } else if (status.code() == absl::StatusCode::kInternal ||
             status.code() == absl::StatusCode::kUnavailable) {
    spdlog::error("api: {} failed tenant={} request_id={}: {}", method, tenant, request_id,
                  status.ToString());
  } else {
    spdlog::info("api: {} rejected tenant={} request_id={}: {}", method, tenant,
                 request_id, status.ToString());
  }
  return ToGrpcStatus(status);
}

void GrantTrialAtSignup(const ApiDependencies& deps, const std::string& user_id) {
  if (deps.billing == nullptr || deps.clock == nullptr) return;
  if (absl::Status s = deps.billing->EnsureTrialGrant(user_id, deps.clock->Now()); !s.ok()) {
    spdlog::warn("api: trial grant for new user {} left to its first request: {}", user_id,
                 s.ToString());
  }
}

}  // namespace sv::api::internal
