#ifndef SV_API_INTERNAL_SECURITY_UTIL_H_
#define SV_API_INTERNAL_SECURITY_UTIL_H_

// Factories and helpers of security_service.cc; private to src/api.

#include <grpcpp/impl/codegen/service_type.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "api/auth.h"
#include "api/services.h"
#include "store/database.h"

namespace sv::api::internal {

std::unique_ptr<grpc::Service> NewApiKeyService(const ApiDependencies& deps,
                                                const Authenticator& auth);
std::unique_ptr<grpc::Service> NewUserService(const ApiDependencies& deps,
                                              const Authenticator& auth);
std::unique_ptr<grpc::Service> NewAuditService(const ApiDependencies& deps,
                                               const Authenticator& auth);
std::unique_ptr<grpc::Service> NewBudgetService(const ApiDependencies& deps,
                                                const Authenticator& auth);
// ssh_key_service.cc.
std::unique_ptr<grpc::Service> NewSshKeyService(const ApiDependencies& deps,
                                                const Authenticator& auth);
// webhook_service.cc.
std::unique_ptr<grpc::Service> NewWebhookService(const ApiDependencies& deps,
                                                 const Authenticator& auth);

// The first instant of the calendar month (Asia/Shanghai) that `now` is in.
absl::Time SpendCapMonthStart(absl::Time now);

// RESOURCE_EXHAUSTED / SPEND_CAP_REACHED: the error of a create refused
// because the tenant has a monthly spend cap and this month's charges reached
// it (the create path checks that in its own transaction, sv_create_gate).
absl::Status SpendCapRefusal(int64_t cap_micros, int64_t spent_micros);

}  // namespace sv::api::internal

#endif  // SV_API_INTERNAL_SECURITY_UTIL_H_
