#ifndef SV_API_INTERNAL_DASHBOARD_SERVICE_H_
#define SV_API_INTERNAL_DASHBOARD_SERVICE_H_

#include <grpcpp/impl/codegen/service_type.h>

#include <memory>

#include "api/auth.h"
#include "api/services.h"

namespace sv::api::internal {

// DashboardAdminService (proto/sv/v1/dashboard.proto): read-only aggregates
// for the operator's billing dashboard.
std::unique_ptr<grpc::Service> NewDashboardAdminService(const ApiDependencies& deps,
                                                        const Authenticator& auth);

}  // namespace sv::api::internal

#endif  // SV_API_INTERNAL_DASHBOARD_SERVICE_H_
