// sv.v1.SchedulerAdminService: operators list nodes with their free GPUs,
// cordon, uncordon and drain them, and set tenants' quotas.
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "common/status.h"
#include "control/scheduling.h"
#include "spdlog/spdlog.h"
#include "store/scheduling_store.h"
#include "sv/v1/admin.grpc.pb.h"

namespace sv::api::internal {
namespace {

constexpr int kNodePageSizeDefault = 100;
constexpr int kNodePageSizeMax = 1000;
constexpr int kNodeNameLengthMax = 256;
constexpr int kQuotaGpusMax = 1000000;
constexpr int kQuotaPendingMax = 1000;
constexpr int kQuotaInstancesMax = 1000;
constexpr char kNodePageTokenPrefix[] = "nodes1.";
constexpr int kPriorityMax = 1000;
constexpr size_t kForgetReasonLengthMax = 500;

v1::FleetNodeState ToProto(store::NodeState state) {
  switch (state) {
    case store::NodeState::kReady: return v1::FLEET_NODE_READY;
    case store::NodeState::kCordoned: return v1::FLEET_NODE_CORDONED;
    case store::NodeState::kDraining: return v1::FLEET_NODE_DRAINING;
    case store::NodeState::kDown: return v1::FLEET_NODE_DOWN;
  }
  return v1::FLEET_NODE_STATE_UNSPECIFIED;
}

void ToProto(const store::NodeUsage& u, v1::FleetNode* out) {
  out->set_id(u.node.id);
  out->set_name(u.node.name);
  out->set_zone(u.node.zone);
  out->set_pod(u.node.pod);
  out->set_leaf_switch(u.node.leaf_switch);
  out->set_gpu_count(u.node.gpu_count);
  out->set_free_gpu_count(u.free_gpu_count);
  out->set_state(ToProto(u.node.state));
  out->set_instance_count(u.instance_count);
  out->set_simulated(u.node.simulated);
  if (u.node.state == store::NodeState::kDown) out->set_state_when_back(ToProto(u.state_when_back));
}

v1::InstanceState InstanceStateOf(const std::string& name) {
  v1::InstanceState state = v1::INSTANCE_STATE_UNSPECIFIED;
  v1::InstanceState_Parse(name, &state);
  return state;
}

absl::Status RequireOperator(const store::Principal& who) {
  if (who.role == store::Role::kOperator) return absl::OkStatus();
  return Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
               "only an operator may manage nodes and quotas");
}

absl::Status CheckNodeName(const std::string& name) {
  if (name.empty()) {
    return Error(absl::StatusCode::kInvalidArgument, "MISSING_NAME", "name is required");
  }
  if (name.size() > kNodeNameLengthMax) {
    return Error(absl::StatusCode::kNotFound, "NODE_NOT_FOUND", "no node has that name");
  }
  return absl::OkStatus();
}

// The token is the last name of the page, so nodes added meanwhile never
// shift a page.
absl::StatusOr<std::string> DecodeNodePageToken(const std::string& token) {
  if (token.empty()) return std::string();
  std::string name;
  if (!absl::StartsWith(token, kNodePageTokenPrefix) ||
      !absl::WebSafeBase64Unescape(token.substr(sizeof(kNodePageTokenPrefix) - 1), &name) ||
      name.empty() || !IsValidUtf8(name) ||
      !CheckFreeText("page_token", name, "INVALID_PAGE_TOKEN", false).ok()) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                 "page_token is not one this list returned");
  }
  return name;
}

class SchedulerAdminServiceImpl final : public v1::SchedulerAdminService::Service {
 public:
  SchedulerAdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), store_(deps.store->database()) {}

  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListFleetNodesRequest* request,
                         v1::ListFleetNodesResponse* response) override {
    return Run("ListNodes", *context, [&](const store::Principal&) {
      return List(*request, response);
    });
  }

  grpc::Status CordonNode(grpc::ServerContext* context, const v1::CordonNodeRequest* request,
                          v1::FleetNode* response) override {
    return Run("CordonNode", *context, [&](const store::Principal& who) {
      return Change(who, request->name(), store::NodeAction::kCordon, response, nullptr);
    });
  }

  grpc::Status UncordonNode(grpc::ServerContext* context,
                            const v1::UncordonNodeRequest* request,
                            v1::FleetNode* response) override {
    return Run("UncordonNode", *context, [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(
          Change(who, request->name(), store::NodeAction::kUncordon, response, nullptr));
      if (deps_.loops != nullptr) deps_.loops->Kick();  // The queue may fit now.
      return absl::OkStatus();
    });
  }

  grpc::Status DrainNode(grpc::ServerContext* context, const v1::DrainNodeRequest* request,
                         v1::DrainNodeResponse* response) override {
    return Run("DrainNode", *context, [&](const store::Principal& who) {
      return Change(who, request->name(), store::NodeAction::kDrain,
                    response->mutable_node(), response);
    });
  }

  grpc::Status ForgetNodeMounts(grpc::ServerContext* context,
                                const v1::ForgetNodeMountsRequest* request,
                                v1::ForgetNodeMountsResponse* response) override {
    return Run("ForgetNodeMounts", *context, [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(CheckNodeName(request->name()));
      if (request->reason().empty() || request->reason().size() > kForgetReasonLengthMax) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_REASON",
                     "reason is required (at most 500 characters): say why nothing on the "
                     "node can still mount a volume");
      }
      int released = 0;
      SV_ASSIGN_OR_RETURN(auto usage,
                          store_.ForgetNodeMounts(request->name(), deps_.clock->Now(), &released));
      ToProto(usage, response->mutable_node());
      response->set_released_count(released);
      spdlog::warn("api: operator {} vouched that down node {} mounts nothing ({}); {} volume "
                   "attachment(s) released",
                   who.user_email, request->name(), request->reason(), released);
      if (released > 0 && deps_.loops != nullptr) deps_.loops->Kick();  // Held starts.
      return absl::OkStatus();
    });
  }

  grpc::Status SetTenantQuota(grpc::ServerContext* context,
                              const v1::SetTenantQuotaRequest* request,
                              v1::TenantQuota* response) override {
    return Run("SetTenantQuota", *context, [&](const store::Principal& who) {
      return SetQuota(who, request->quota(), response);
    });
  }

  grpc::Status GetTenantQuota(grpc::ServerContext* context,
                              const v1::GetTenantQuotaRequest* request,
                              v1::TenantQuota* response) override {
    return Run("GetTenantQuota", *context, [&](const store::Principal&) {
      return GetQuota(request->tenant_id(), response);
    });
  }

  grpc::Status ListFleetInstances(grpc::ServerContext* context,
                                  const v1::ListFleetInstancesRequest* request,
                                  v1::ListFleetInstancesResponse* response) override {
    return Run("ListFleetInstances", *context, [&](const store::Principal&) {
      return FleetInstances(*request, response);
    });
  }

  grpc::Status SetInstancePriority(grpc::ServerContext* context,
                                   const v1::SetInstancePriorityRequest* request,
                                   v1::InstancePriority* response) override {
    return Run("SetInstancePriority", *context, [&](const store::Principal& who) {
      return SetPriority(who, *request, response);
    });
  }

 private:
  // Authenticates, requires the operator role, runs `body`, and converts.
  template <typename Body>
  grpc::Status Run(const char* method, grpc::ServerContext& context, Body body) {
    auto who = auth_.Authenticate(context);
    if (!who.ok()) return Finish(method, nullptr, "", who.status());
    absl::Status status = RequireOperator(*who);
    if (status.ok()) status = body(*who);
    return Finish(method, &*who, "", status);
  }

  absl::Status List(const v1::ListFleetNodesRequest& request,
                    v1::ListFleetNodesResponse* response) {
    if (request.page_size() < 0) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_SIZE",
                   "page_size must not be negative");
    }
    int page_size = request.page_size() == 0 ? kNodePageSizeDefault : request.page_size();
    page_size = std::min(page_size, kNodePageSizeMax);
    SV_ASSIGN_OR_RETURN(std::string after, DecodeNodePageToken(request.page_token()));
    SV_ASSIGN_OR_RETURN(auto nodes, store_.ListNodes(after, page_size + 1));
    const bool more = static_cast<int>(nodes.size()) > page_size;
    if (more) nodes.resize(page_size);
    for (const auto& n : nodes) ToProto(n, response->add_nodes());
    if (more) {
      response->set_next_page_token(kNodePageTokenPrefix +
                                    absl::WebSafeBase64Escape(nodes.back().node.name));
    }
    return absl::OkStatus();
  }

  absl::Status FleetInstances(const v1::ListFleetInstancesRequest& request,
                              v1::ListFleetInstancesResponse* response) {
    SV_ASSIGN_OR_RETURN(int page_size, NormalizePageSize(request.page_size()));
    if (!v1::InstanceState_IsValid(request.state())) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_STATE",
                   "state is not an instance state");
    }
    store::FleetInstanceFilter filter{request.tenant_id(), request.node(), ""};
    if (request.state() != v1::INSTANCE_STATE_UNSPECIFIED) {
      filter.state = v1::InstanceState_Name(request.state());
    }
    // Too long to exist (the store says NOT_FOUND for the others).
    if (filter.tenant_id.size() > 64) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
    }
    if (filter.node_name.size() > kNodeNameLengthMax) {
      return Error(absl::StatusCode::kNotFound, "NODE_NOT_FOUND", "no node has that name");
    }
    // The token says which list it continues: with DELETED rows or not.
    const bool deleted = filter.state == "DELETED";
    SV_ASSIGN_OR_RETURN(auto cursor, DecodePageToken(request.page_token(), deleted));
    SV_ASSIGN_OR_RETURN(auto records,
                        deps_.store->ListFleetInstances(filter, cursor, page_size + 1));
    const bool more = static_cast<int>(records.size()) > page_size;
    if (more) records.resize(page_size);
    for (const auto& r : records) internal::ToProto(r, response->add_instances());
    if (more) {
      response->set_next_page_token(EncodePageToken(
          {absl::ToUnixMicros(records.back().created_at), records.back().id}, deleted));
    }
    return absl::OkStatus();
  }

  absl::Status Change(const store::Principal& who, const std::string& name,
                      store::NodeAction action, v1::FleetNode* node,
                      v1::DrainNodeResponse* drain) {
    SV_RETURN_IF_ERROR(CheckNodeName(name));
    SV_ASSIGN_OR_RETURN(auto outcome, store_.ChangeNode(name, action));
    ToProto(outcome.node, node);
    if (drain != nullptr) {
      for (const auto& i : outcome.instances_to_move) {
        auto* out = drain->add_instances_to_move();
        out->set_instance_id(i.instance_id);
        out->set_tenant_id(i.tenant_id);
        out->set_gpu_count(i.gpu_count);
        out->set_state(InstanceStateOf(i.state));
      }
    }
    spdlog::info("api: operator {} set node {} {} ({} instance(s) on it)", who.user_email,
                 name, v1::FleetNodeState_Name(node->state()),
                 outcome.instances_to_move.size());
    return absl::OkStatus();
  }

  absl::Status SetQuota(const store::Principal& who, const v1::TenantQuota& in,
                        v1::TenantQuota* response) {
    if (in.tenant_id().empty()) {
      return Error(absl::StatusCode::kInvalidArgument, "MISSING_TENANT_ID",
                   "quota.tenant_id is required");
    }
    if (in.gpus_in_use_max() < 0 || in.gpus_in_use_max() > kQuotaGpusMax ||
        in.pending_count_max() < 0 || in.pending_count_max() > kQuotaPendingMax ||
        in.instances_max() < 0 || in.instances_max() > kQuotaInstancesMax) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_QUOTA",
                   "gpus_in_use_max must be 0..1000000, pending_count_max 0..1000 and "
                   "instances_max 0..1000");
    }
    SV_ASSIGN_OR_RETURN(auto row, store_.SetTenantQuota({in.tenant_id(), in.gpus_in_use_max(),
                                                         in.pending_count_max(),
                                                         in.instances_max()},
                                                        deps_.clock->Now()));
    response->set_tenant_id(row.tenant_id);
    response->set_gpus_in_use_max(row.gpus_in_use_max);
    response->set_pending_count_max(row.pending_count_max);
    response->set_instances_max(row.instances_max);
    spdlog::info("api: operator {} set quota of {}: {} GPUs, {} pending", who.user_email,
                 row.tenant_id, row.gpus_in_use_max, row.pending_count_max);
    if (deps_.loops != nullptr) deps_.loops->Kick();  // A raised quota may place more.
    return absl::OkStatus();
  }

  absl::Status SetPriority(const store::Principal& who,
                           const v1::SetInstancePriorityRequest& request,
                           v1::InstancePriority* response) {
    SV_RETURN_IF_ERROR(CheckInstanceId(request.instance_id()));
    if (request.priority() < -kPriorityMax || request.priority() > kPriorityMax) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PRIORITY",
                   "priority must be -1000..1000");
    }
    SV_ASSIGN_OR_RETURN(auto instance,
                        store_.SetInstancePriority(request.instance_id(), request.priority(),
                                                   deps_.clock->Now()));
    response->set_instance_id(instance.instance_id);
    response->set_tenant_id(instance.tenant_id);
    response->set_priority(request.priority());
    response->set_state(InstanceStateOf(instance.state));
    spdlog::info("api: operator {} set priority of {} (tenant {}) to {}", who.user_email,
                 instance.instance_id, instance.tenant_id, request.priority());
    if (deps_.loops != nullptr) deps_.loops->Kick();  // The queue order changed.
    return absl::OkStatus();
  }

  absl::Status GetQuota(const std::string& tenant_id, v1::TenantQuota* response) {
    if (tenant_id.empty()) {
      return Error(absl::StatusCode::kInvalidArgument, "MISSING_TENANT_ID",
                   "tenant_id is required");
    }
    SV_ASSIGN_OR_RETURN(auto row, store_.GetTenantQuota(tenant_id));
    response->set_tenant_id(tenant_id);
    if (row.has_value()) {
      response->set_gpus_in_use_max(row->gpus_in_use_max);
      response->set_pending_count_max(row->pending_count_max);
      response->set_instances_max(row->instances_max);
      return absl::OkStatus();
    }
    scheduler::TenantQuota defaults;
    if (deps_.loops != nullptr) defaults = deps_.loops->scheduling().options().default_quota;
    response->set_gpus_in_use_max(defaults.gpus_in_use_max);
    response->set_pending_count_max(defaults.pending_count_max);
    response->set_is_default(true);
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
  store::SchedulingStore store_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewSchedulerAdminService(const ApiDependencies& deps,
                                                        const Authenticator& auth) {
  return std::make_unique<SchedulerAdminServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
