#include "api/internal/service_util.h"
#include "api/validation.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "api/api_keys.h"
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
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("CreateTenant", nullptr, "", who.status());
    return Finish("CreateTenant", &*who, "", Create(*who, *request, response));
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

  ApiDependencies deps_;
  const Authenticator& auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewAdminService(const ApiDependencies& deps,
                                               const Authenticator& auth) {
  return std::make_unique<AdminServiceImpl>(deps, auth);
}
}  // namespace sv::api::internal
