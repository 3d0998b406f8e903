// AdminService: tenants (create, look up, suspend, resume) and operators.
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

  grpc::Status AddOperator(grpc::ServerContext* context, const v1::AddOperatorRequest* request,
                           v1::AddOperatorResponse* response) override {
    return Serve(auth_, *context, "AddOperator", [&](const store::Principal& who) {
      return AddOperatorUser(who, *request, response);
    });
  }

  grpc::Status ListOperators(grpc::ServerContext* context, const v1::ListOperatorsRequest*,
                             v1::ListOperatorsResponse* response) override {
    return Serve(auth_, *context, "ListOperators", [&](const store::Principal&) {
      store::SecurityStore security(deps_.store->database());
      SV_ASSIGN_OR_RETURN(auto operators, security.ListOperators(deps_.clock->Now()));
      for (const auto& row : operators) OperatorToProto(row, response->add_operators());
      return absl::OkStatus();
    });
  }

  grpc::Status RemoveOperator(grpc::ServerContext* context,
                              const v1::RemoveOperatorRequest* request,
                              v1::RemoveOperatorResponse* response) override {
    return Serve(auth_, *context, "RemoveOperator", [&](const store::Principal& who) {
      return RemoveOperatorUser(who, *request, response);
    });
  }

 private:
  absl::Status Create(const store::Principal& who, const v1::CreateTenantRequest& request,
                      v1::CreateTenantResponse* response) {
    // admin.tenants is checked by the Authenticator (authz_table.cc).
    SV_RETURN_IF_ERROR(ValidateName("name", request.name()));
    const std::string& email = request.owner_email();
    SV_RETURN_IF_ERROR(ValidateEmail("owner_email", email));
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

  static void OperatorToProto(const store::OperatorRow& row, v1::OperatorUser* out) {
    out->set_user_id(row.user_id);
    out->set_email(row.email);
    *out->mutable_create_time() = ToProto(row.created_at);
    out->set_bootstrap(row.bootstrap);
    out->set_active_key_count(row.active_keys);
    out->set_read_only(row.read_only);
  }

  absl::Status AddOperatorUser(const store::Principal& who, const v1::AddOperatorRequest& request,
                               v1::AddOperatorResponse* response) {
    SV_RETURN_IF_ERROR(ValidateEmail("email", request.email()));
    GeneratedKey key = NewApiKey();
    store::NewApiKeyRow row{key.key_id, "", "", key.salt, key.secret_hash, "initial",
                            store::KeyScope::kFull, std::nullopt};
    store::SecurityStore security(deps_.store->database());
    SV_ASSIGN_OR_RETURN(auto added,
                        security.AddOperator(who.tenant_id, request.email(), request.read_only(),
                                             who.user_id, Operator(who), row,
                                             deps_.clock->Now()));
    OperatorToProto(added, response->mutable_operator_user());
    response->set_api_key(key.plaintext);
    spdlog::info("api: operator {} added {}operator {} ({})", Operator(who),
                 added.read_only ? "read-only " : "", added.user_id, added.email);
    return absl::OkStatus();
  }

  absl::Status RemoveOperatorUser(const store::Principal& who,
                                  const v1::RemoveOperatorRequest& request,
                                  v1::RemoveOperatorResponse* response) {
    if (request.user_id().empty()) {
      return Error(absl::StatusCode::kInvalidArgument, "MISSING_ID",
                   "user_id is required (an operator's usr-... id)");
    }
    if (!LooksLikeId(request.user_id(), "usr")) {  // Names nothing.
      return Error(absl::StatusCode::kNotFound, "OPERATOR_NOT_FOUND",
                   absl::StrCat("no operator has the user id '", request.user_id(), "'"));
    }
    SV_RETURN_IF_ERROR(CheckReasonText(request.reason()));
    store::SecurityStore security(deps_.store->database());
    SV_ASSIGN_OR_RETURN(int revoked,
                        security.RemoveOperator(request.user_id(), who.user_id, Operator(who),
                                                request.reason(), deps_.clock->Now()));
    // The revocations reach every svd's cache through NOTIFY; this one
    // forgets at once.
    auth_.ForgetCachedCredentials();
    response->set_keys_revoked(revoked);
    spdlog::info("api: operator {} removed operator {} ({} keys revoked): {}", Operator(who),
                 request.user_id(), revoked, request.reason());
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
