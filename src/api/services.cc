#include "api/services.h"

#include <vector>

#include "api/auth.h"
#include "api/internal/instance_extras.h"
#include "api/internal/dashboard_service.h"
#include "api/internal/security_util.h"
#include "api/internal/service_util.h"

namespace sv::api {

struct ApiServices::Impl {
  explicit Impl(const ApiDependencies& deps) : auth(*deps.store, *deps.clock, deps.auth) {
    services.push_back(internal::NewInstanceService(deps, auth));
    services.push_back(internal::NewAccountService(deps, auth));
    services.push_back(internal::NewAdminService(deps, auth));
    services.push_back(internal::NewSchedulerAdminService(deps, auth));
    services.push_back(internal::NewBillingService(deps, auth));
    services.push_back(internal::NewBillingAdminService(deps, auth));
    services.push_back(internal::NewApiKeyService(deps, auth));
    services.push_back(internal::NewUserService(deps, auth));
    services.push_back(internal::NewAuditService(deps, auth));
    services.push_back(internal::NewBudgetService(deps, auth));
    services.push_back(internal::NewSshKeyService(deps, auth));
    services.push_back(internal::NewWebhookService(deps, auth));
    services.push_back(internal::NewDashboardAdminService(deps, auth));
    services.push_back(internal::NewVolumeService(deps, auth));
    services.push_back(internal::NewLibraryService(deps, auth));
    services.push_back(internal::NewLibraryAdminService(deps, auth));
    services.push_back(internal::NewMarketplaceService(deps, auth));
    services.push_back(internal::NewMarketplaceAdminService(deps, auth));
  }
  Authenticator auth;
  std::vector<std::unique_ptr<grpc::Service>> services;
};

ApiServices::ApiServices(ApiDependencies deps) : impl_(std::make_unique<Impl>(deps)) {
  assert(deps.store != nullptr && deps.clock != nullptr);
}

ApiServices::~ApiServices() = default;

void ApiServices::RegisterWith(grpc::ServerBuilder& builder) {
  for (auto& service : impl_->services) builder.RegisterService(service.get());
}

}  // namespace sv::api
