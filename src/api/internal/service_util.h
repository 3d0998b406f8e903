#ifndef SV_API_INTERNAL_SERVICE_UTIL_H_
#define SV_API_INTERNAL_SERVICE_UTIL_H_

// Helpers shared by the service implementations of src/api; private to it.

#include <grpcpp/impl/codegen/service_type.h>
#include <grpcpp/support/status.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "api/auth.h"
#include "api/services.h"
#include "google/protobuf/timestamp.pb.h"
#include "store/store.h"
#include "sv/v1/instance.pb.h"

namespace sv::api::internal {

google::protobuf::Timestamp ToProto(absl::Time t);
void ToProto(const store::InstanceRecord& r, v1::Instance* out);

// NOT_FOUND for a malformed id (no instance can have it), INVALID_ARGUMENT
// for an empty one.
absl::Status CheckInstanceId(const std::string& id);

// Logs the outcome of a call with the caller and request id, then converts it.
grpc::Status Finish(const char* method, const store::Principal* who,
                    const std::string& request_id, const absl::Status& status);

// Authenticates the call (and authorizes it: the method comes from the
// interceptor), runs `body` with the caller, and finishes the call with the
// body's status.
template <typename Body>
grpc::Status Serve(const Authenticator& auth, grpc::ServerContext& context, const char* method,
                   Body body) {
  auto who = auth.Authenticate(context);
  if (!who.ok()) return Finish(method, nullptr, "", who.status());
  return Finish(method, &*who, "", body(*who));
}

// Grants a new user's trial credit when the user is created (a new tenant's
// owner, an added member), so a tenant's first creates do not write the
// grant: each grant updates the platform's one promotion account, and
// grants inside create batches queued every batch behind that row's lock
// (docs/billing.md, "Trial grant"). Best effort: a failure is logged and
// the user's first create or balance read, or the billing loop, grants it.
void GrantTrialAtSignup(const ApiDependencies& deps, const std::string& user_id);

// Factories, one per service file.
std::unique_ptr<grpc::Service> NewInstanceService(const ApiDependencies& deps,
                                                  const Authenticator& auth);
std::unique_ptr<grpc::Service> NewAccountService(const ApiDependencies& deps,
                                                 const Authenticator& auth);
std::unique_ptr<grpc::Service> NewAdminService(const ApiDependencies& deps,
                                               const Authenticator& auth);
std::unique_ptr<grpc::Service> NewSchedulerAdminService(const ApiDependencies& deps,
                                                        const Authenticator& auth);
std::unique_ptr<grpc::Service> NewBillingService(const ApiDependencies& deps,
                                                 const Authenticator& auth);
std::unique_ptr<grpc::Service> NewBillingAdminService(const ApiDependencies& deps,
                                                      const Authenticator& auth);

}  // namespace sv::api::internal

#endif  // SV_API_INTERNAL_SERVICE_UTIL_H_
