#include "api/services.h"

#include "api/api_keys.h"
#include "api/auth.h"
#include "api/errors.h"
#include "api/validation.h"
#include "common/ids.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"
#include "spdlog/spdlog.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"

namespace sv::api {
namespace {

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

class InstanceServiceImpl final : public v1::InstanceService::Service {
 public:
  InstanceServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

  grpc::Status CreateInstance(grpc::ServerContext* context,
                              const v1::CreateInstanceRequest* request,
                              v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("CreateInstance", nullptr, request->request_id(), who.status());
    return Finish("CreateInstance", &*who, request->request_id(),
                  Create(*who, *request, response));
  }

  grpc::Status GetInstance(grpc::ServerContext* context, const v1::GetInstanceRequest* request,
                           v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetInstance", nullptr, "", who.status());
    absl::Status status = CheckInstanceId(request->id());
    if (status.ok()) {
      auto record = deps_.store->GetInstance(who->tenant_id, request->id());
      status = record.status();
      if (record.ok()) ToProto(*record, response);
    }
    return Finish("GetInstance", &*who, "", status);
  }

  grpc::Status ListInstances(grpc::ServerContext* context,
                             const v1::ListInstancesRequest* request,
                             v1::ListInstancesResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListInstances", nullptr, "", who.status());
    return Finish("ListInstances", &*who, "", List(*who, *request, response));
  }

  grpc::Status DeleteInstance(grpc::ServerContext* context,
                              const v1::DeleteInstanceRequest* request,
                              v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("DeleteInstance", nullptr, "", who.status());
    absl::Status status = CheckInstanceId(request->id());
    if (status.ok()) {
      auto record = deps_.store->DeleteInstance(who->tenant_id, request->id(),
                                                deps_.clock->Now());
      status = record.status();
      if (record.ok()) {
        ToProto(*record, response);
        spdlog::info("api: deleted {} tenant={}", record->id, who->tenant_id);
        if (deps_.loops) deps_.loops->Kick();  // Freed GPUs may fit the queue.
      }
    }
    return Finish("DeleteInstance", &*who, "", status);
  }

 private:
  absl::Status Create(const store::Principal& who, const v1::CreateInstanceRequest& request,
                      v1::Instance* response) {
    const v1::Instance& in = request.instance();
    store::InstanceSpec spec{in.name(), in.gpu_count(), in.gpu_model(), in.image()};
    SV_ASSIGN_OR_RETURN(spec, NormalizeInstanceSpec(spec));
    std::string request_id = request.request_id();
    if (request_id.empty()) {
      request_id = NewUuid();  // No retry protection was asked for.
    } else {
      SV_RETURN_IF_ERROR(ValidateRequestId(request_id));
    }
    SV_ASSIGN_OR_RETURN(auto record,
                        deps_.store->CreateInstance(who.tenant_id, spec, request_id,
                                                    InstanceFingerprint(spec),
                                                    deps_.clock->Now()));
    if (record.state == store::InstanceState::kPending && deps_.loops != nullptr) {
      // Place at once when capacity allows, so the answer already shows the
      // placement; if the pass fails the loop retries it shortly.
      absl::Status placed = deps_.loops->PlaceNow();
      if (!placed.ok()) {
        spdlog::warn("api: placement after create failed tenant={} request_id={}: {}",
                     who.tenant_id, request_id, placed.ToString());
        deps_.loops->Kick();
      }
      auto reread = deps_.store->GetInstance(who.tenant_id, record.id);
      if (reread.ok()) record = *std::move(reread);
    }
    spdlog::info("api: instance {} gpus={} state={} tenant={} request_id={}", record.id,
                 record.spec.gpu_count, store::InstanceStateName(record.state),
                 who.tenant_id, request_id);
    ToProto(record, response);
    return absl::OkStatus();
  }

  absl::Status List(const store::Principal& who, const v1::ListInstancesRequest& request,
                    v1::ListInstancesResponse* response) {
    SV_ASSIGN_OR_RETURN(int page_size, NormalizePageSize(request.page_size()));
    SV_ASSIGN_OR_RETURN(auto cursor,
                        DecodePageToken(request.page_token(), request.show_deleted()));
    // Ask for one extra row to learn whether another page follows.
    SV_ASSIGN_OR_RETURN(auto records,
                        deps_.store->ListInstances(who.tenant_id, cursor, page_size + 1,
                                                   request.show_deleted()));
    const bool more = static_cast<int>(records.size()) > page_size;
    if (more) records.resize(page_size);
    for (const auto& r : records) ToProto(r, response->add_instances());
    if (more) {
      const auto& last = records.back();
      response->set_next_page_token(EncodePageToken(
          {absl::ToUnixMicros(last.created_at), last.id}, request.show_deleted()));
    }
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
};

class AccountServiceImpl final : public v1::AccountService::Service {
 public:
  explicit AccountServiceImpl(const Authenticator& auth) : auth_(auth) {}

  grpc::Status GetCurrentAccount(grpc::ServerContext* context,
                                 const v1::GetCurrentAccountRequest*,
                                 v1::Account* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetCurrentAccount", nullptr, "", who.status());
    response->set_user_id(who->user_id);
    response->set_user_email(who->user_email);
    response->set_tenant_id(who->tenant_id);
    response->set_tenant_name(who->tenant_name);
    response->set_api_key_id(who->api_key_id);
    response->set_role(who->role == store::Role::kOperator ? v1::OPERATOR : v1::MEMBER);
    return Finish("GetCurrentAccount", &*who, "", absl::OkStatus());
  }

 private:
  const Authenticator& auth_;
};

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

  grpc::Status CreateTenant(grpc::ServerContext* context,
                            const v1::CreateTenantRequest* request,
                            v1::CreateTenantResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("CreateTenant", nullptr, "", who.status());
    return Finish("CreateTenant", &*who, "", Create(*who, *request, response));
  }

 private:
  absl::Status Create(const store::Principal& who, const v1::CreateTenantRequest& request,
                      v1::CreateTenantResponse* response) {
    if (who.role != store::Role::kOperator) {
      return Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
                   "only an operator may create tenants");
    }
    SV_RETURN_IF_ERROR(ValidateName("name", request.name()));
    const std::string& email = request.owner_email();
    if (email.size() < 3 || email.size() > 254 || email.find('@') == std::string::npos ||
        email.find_first_of(" \t\r\n") != std::string::npos) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_EMAIL",
                   "owner_email must be an e-mail address of at most 254 characters");
    }
    GeneratedKey key = NewApiKey();
    SV_ASSIGN_OR_RETURN(auto created,
                        deps_.store->CreateTenant({request.name(), email,
                                                   store::Role::kMember, key.key_id,
                                                   key.secret_sha256},
                                                  deps_.clock->Now()));
    response->mutable_tenant()->set_id(created.tenant.id);
    response->mutable_tenant()->set_name(created.tenant.name);
    *response->mutable_tenant()->mutable_create_time() = ToProto(created.tenant.created_at);
    response->set_user_id(created.user_id);
    response->set_api_key(key.plaintext);
    spdlog::info("api: operator {} created tenant {} ({})", who.user_email, created.tenant.id,
                 created.tenant.name);
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
};

}  // namespace

struct ApiServices::Impl {
  explicit Impl(ApiDependencies deps)
      : auth(*deps.store), instances(deps, auth), accounts(auth), admin(deps, auth) {}
  Authenticator auth;
  InstanceServiceImpl instances;
  AccountServiceImpl accounts;
  AdminServiceImpl admin;
};

ApiServices::ApiServices(ApiDependencies deps) : impl_(std::make_unique<Impl>(deps)) {
  assert(deps.store != nullptr && deps.clock != nullptr);
}

ApiServices::~ApiServices() = default;

void ApiServices::RegisterWith(grpc::ServerBuilder& builder) {
  builder.RegisterService(&impl_->instances);
  builder.RegisterService(&impl_->accounts);
  builder.RegisterService(&impl_->admin);
}

}  // namespace sv::api
