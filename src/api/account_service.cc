#include "api/internal/service_util.h"
#include "api/validation.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"
#include "sv/v1/account.grpc.pb.h"

namespace sv::api::internal {
namespace {

class AccountServiceImpl final : public v1::AccountService::Service {
 public:
  AccountServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

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
    response->set_tenant_role(static_cast<v1::TenantRole>(static_cast<int>(who->tenant_role) + 1));
    response->set_read_only_operator(who->platform_admin() && who->read_only_operator);
    response->set_key_scope(who->scope == store::KeyScope::kReadOnly ? v1::KEY_SCOPE_READ_ONLY
                                                                      : v1::KEY_SCOPE_FULL);
    store::SecurityStore security(deps_.store->database());
    auto standing = security.GetStanding(who->tenant_id);
    if (!standing.ok()) return Finish("GetCurrentAccount", &*who, "", standing.status());
    if (standing->suspended()) {
      response->set_tenant_suspended(true);
      response->set_suspension_reason(standing->suspensions[0].reason);
    }
    return Finish("GetCurrentAccount", &*who, "", absl::OkStatus());
  }

 private:
  ApiDependencies deps_;
  const Authenticator& auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewAccountService(const ApiDependencies& deps,
                                                 const Authenticator& auth) {
  return std::make_unique<AccountServiceImpl>(deps, auth);
}
}  // namespace sv::api::internal
