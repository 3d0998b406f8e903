// AdminService: tenants (create, look up, suspend, resume).
#include "api/api_keys.h"
#include "api/internal/service_util.h"
#include "api/tenant_stop_enforcer.h"
#include "api/validation.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"
#include "sv/v1/admin.grpc.pb.h"

namespace sv::api::internal {
namespace {

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

  grpc::Status CreateTenant(grpc::ServerContext* context,
                            const v1::CreateTenantRequest* request,
                            v1::CreateTenantResponse* response) override {
    return Serve(auth_, *context, "CreateTenant", [&](const store::Principal& who) {
      return Create(who, *request, response);
    });
  }

  grpc::Status GetTenant(grpc::ServerContext* context, const v1::GetTenantRequest* request,
                         v1::TenantStanding* response) override {
    return Serve(auth_, *context, "GetTenant", [&](const store::Principal&) {
      return Get(*request, response);
    });
  }

  grpc::Status SuspendTenant(grpc::ServerContext* context,
                             const v1::SuspendTenantRequest* request,
                             v1::SuspendTenantResponse* response) override {
    return Serve(auth_, *context, "SuspendTenant", [&](const store::Principal& who) {
      return Suspend(who, *request, response);
    });
  }

  grpc::Status ResumeTenant(grpc::ServerContext* context, const v1::ResumeTenantRequest* request,
                            v1::ResumeTenantResponse* response) override {
    return Serve(auth_, *context, "ResumeTenant", [&](const store::Principal& who) {
      return Resume(who, *request, response);
    });
  }

 private:
  absl::Status Create(const store::Principal& who, const v1::CreateTenantRequest& request,
                      v1::CreateTenantResponse* response) {
    // admin.tenants is checked by the Authenticator (authz_table.cc).
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
                                                   key.salt, key.secret_hash},
                                                  deps_.clock->Now()));
    GrantTrialAtSignup(deps_, created.user_id);
    response->mutable_tenant()->set_id(created.tenant.id);
    response->mutable_tenant()->set_name(created.tenant.name);
    *response->mutable_tenant()->mutable_create_time() = ToProto(created.tenant.created_at);
    response->set_user_id(created.user_id);
    response->set_api_key(key.plaintext);
    spdlog::info("api: operator {} created tenant {} ({})", who.user_email, created.tenant.id,
                 created.tenant.name);
    return absl::OkStatus();
  }

  static void SuspensionToProto(const store::SuspensionRow& row, v1::TenantSuspension* out) {
    *out->mutable_suspend_time() = ToProto(row.suspended_at);
    out->set_suspended_by(row.suspended_by);
    out->set_reason(row.reason);
    if (row.resumed_at.has_value()) {
      *out->mutable_resume_time() = ToProto(*row.resumed_at);
      out->set_resumed_by(row.resumed_by);
      out->set_resume_reason(row.resume_reason);
    }
  }

  static void TenantToProto(const store::TenantStanding& standing, v1::Tenant* out) {
    out->set_id(standing.tenant.id);
    out->set_name(standing.tenant.name);
    *out->mutable_create_time() = ToProto(standing.tenant.created_at);
    if (standing.suspended()) {
      SuspensionToProto(standing.suspensions[0], out->mutable_suspension());
    }
  }

  // Who acted, as suspensions record it.
  static const std::string& Operator(const store::Principal& who) {
    return who.user_email.empty() ? who.api_key_id : who.user_email;
  }

  absl::Status Get(const v1::GetTenantRequest& request, v1::TenantStanding* response) {
    SV_RETURN_IF_ERROR(ValidateTenantId(request.tenant_id()));
    store::SecurityStore security(deps_.store->database());
    SV_ASSIGN_OR_RETURN(auto standing, security.GetStanding(request.tenant_id()));
    TenantToProto(standing, response->mutable_tenant());
    for (const auto& row : standing.suspensions) {
      SuspensionToProto(row, response->add_suspensions());
    }
    return absl::OkStatus();
  }

  absl::Status Suspend(const store::Principal& who, const v1::SuspendTenantRequest& request,
                       v1::SuspendTenantResponse* response) {
    SV_RETURN_IF_ERROR(ValidateTenantId(request.tenant_id()));
    SV_RETURN_IF_ERROR(CheckReasonText(request.reason()));
    store::SecurityStore security(deps_.store->database());
    const absl::Time now = deps_.clock->Now();
    bool opened = false;
    SV_ASSIGN_OR_RETURN(auto standing, security.Suspend(request.tenant_id(), Operator(who),
                                                        request.reason(), now, &opened));
    // Committed: no create or start of the tenant passes from here on, so
    // this stops everything it has. A failure here is retried by the next
    // call and by the stop loop (TenantStopEnforcer).
    SV_ASSIGN_OR_RETURN(int stopped, StopTenantInstances(*deps_.store, request.tenant_id(),
                                                         kSuspensionStopReason, now));
    TenantToProto(standing, response->mutable_tenant());
    response->set_newly_suspended(opened);
    response->set_instances_stopped(stopped);
    spdlog::info("api: operator {} suspended tenant {} ({} instances stopped{}): {}",
                 Operator(who), request.tenant_id(), stopped,
                 opened ? "" : ", already suspended", request.reason());
    return absl::OkStatus();
  }

  absl::Status Resume(const store::Principal& who, const v1::ResumeTenantRequest& request,
                      v1::ResumeTenantResponse* response) {
    SV_RETURN_IF_ERROR(ValidateTenantId(request.tenant_id()));
    SV_RETURN_IF_ERROR(CheckReasonText(request.reason()));
    store::SecurityStore security(deps_.store->database());
    bool ended = false;
    SV_ASSIGN_OR_RETURN(auto standing,
                        security.Resume(request.tenant_id(), Operator(who), request.reason(),
                                        deps_.clock->Now(), &ended));
    TenantToProto(standing, response->mutable_tenant());
    response->set_was_suspended(ended);
    if (ended) {
      spdlog::info("api: operator {} resumed tenant {}: {}", Operator(who), request.tenant_id(),
                   request.reason());
    }
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewAdminService(const ApiDependencies& deps,
                                               const Authenticator& auth) {
  return std::make_unique<AdminServiceImpl>(deps, auth);
}
}  // namespace sv::api::internal
