#ifndef SV_API_INTERNAL_INSTANCE_EXTRAS_H_
#define SV_API_INTERNAL_INSTANCE_EXTRAS_H_

// Ports, library mounts, app and volumes of instances in the API, and the
// create path shared by CreateInstance and LaunchApp. Private to src/api.

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/impl/codegen/service_type.h>

#include "absl/status/status.h"
#include "api/auth.h"
#include "api/services.h"
#include "store/store.h"
#include "sv/v1/instance.pb.h"

namespace sv::api::internal {

// Reads ports and library mounts of a create request into spec.extras;
// INVALID_ARGUMENT with a reason when they are malformed.
absl::Status ReadInstanceExtras(const v1::Instance& in, store::InstanceSpec& spec);

// A digest of the extras, joined to the create fingerprint.
std::string ExtrasFingerprint(const store::InstanceExtras& extras);

// Fills ports (with node ports and URLs), library mounts, app and volumes.
absl::Status AddInstanceExtras(store::Store& store, const std::string& tenant_id,
                               const std::vector<v1::Instance*>& instances);

// The create path: quota admission, trial grant and credit gate, the create
// transaction (with spec.extras), immediate placement and the answer.
// `ranked`, if set, is false when the answer is a new row no queue pass has
// seen yet (so it has no queue position to read). `audit` (with `audited`)
// is the call's audit row to commit with the instance (InTransactionAuditRow);
// `audited` says whether it was, and then the call must end OK.
absl::Status CreateInstanceFor(const ApiDependencies& deps, const store::Principal& who,
                               store::InstanceSpec spec, std::string request_id,
                               v1::Instance* response, bool* ranked = nullptr,
                               std::optional<store::AuditRow> audit = std::nullopt,
                               bool* audited = nullptr);

// Service factories (volume_service.cc, marketplace_service.cc).
std::unique_ptr<grpc::Service> NewVolumeService(const ApiDependencies& deps,
                                                const Authenticator& auth);
std::unique_ptr<grpc::Service> NewLibraryService(const ApiDependencies& deps,
                                                 const Authenticator& auth);
std::unique_ptr<grpc::Service> NewLibraryAdminService(const ApiDependencies& deps,
                                                      const Authenticator& auth);
std::unique_ptr<grpc::Service> NewMarketplaceService(const ApiDependencies& deps,
                                                     const Authenticator& auth);
std::unique_ptr<grpc::Service> NewMarketplaceAdminService(const ApiDependencies& deps,
                                                          const Authenticator& auth);

}  // namespace sv::api::internal

#endif  // SV_API_INTERNAL_INSTANCE_EXTRAS_H_
