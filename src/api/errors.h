#ifndef SV_API_ERRORS_H_
#define SV_API_ERRORS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace sv::api {

inline constexpr char kErrorDomain[] = "sv.dev";

// The one place where an absl::Status becomes a grpc::Status. The reason set
// by sv::Error() travels as an ErrorInfo in the standard status details.
grpc::Status ToGrpcStatus(const absl::Status& status);

// "INVALID_ARGUMENT", "NOT_FOUND", ... for logs, metrics and the CLI.
const char* GrpcCodeName(grpc::StatusCode code);

// Reads the ErrorInfo reason back out of a grpc::Status ("" when absent).
std::string ReasonOf(const grpc::Status& status);

}  // namespace sv::api

#endif  // SV_API_ERRORS_H_
