#include "api/errors.h"

#include "common/status.h"
#include "sv/v1/error.pb.h"

namespace sv::api {

namespace {

// Failures of the machinery (the database, the driver, a bug) carry text
// meant for operators: SQL, constraint and column names, host names. The
// client gets a fixed sentence per reason instead; the full status is in
// svd's log (service_util.cc Finish logs it). See docs/security.md.
std::string ClientMessage(const absl::Status& status, const std::string& reason) {
  if (reason == "DATABASE_UNAVAILABLE" || reason == "DATABASE_READ_ONLY") {
    return "the database is unavailable; retry shortly";
  }
  if (reason == "TRANSACTION_CONFLICT") return "the request conflicted with another; retry it";
  if (reason == "COMMIT_IN_DOUBT") {
    return "the outcome is unknown; retry with the same request_id";
  }
  if (reason == "DATABASE_TIMEOUT") return "a database statement timed out";
  switch (status.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return "internal error (" + reason + ")";
    default:
      return std::string(status.message());
  }
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  std::string reason = sv::ReasonOf(status);
  if (reason.empty()) reason = absl::StatusCodeToString(status.code());
  const std::string message = ClientMessage(status, reason);
  sv::v1::ErrorInfo info;
  info.set_reason(reason);
  info.set_domain(kErrorDomain);
  sv::v1::RpcStatus details;
  details.set_code(static_cast<int>(code));
  details.set_message(message);
  const int64_t retry_ms = sv::RetryAfterMsOf(status);
  if (retry_ms >= 0) {
    (*info.mutable_metadata())["retry_after_ms"] = std::to_string(retry_ms);
  }
  details.add_details()->PackFrom(info);
  if (retry_ms >= 0) {
    sv::v1::RetryInfo retry;
    retry.mutable_retry_delay()->set_seconds(retry_ms / 1000);
    retry.mutable_retry_delay()->set_nanos(static_cast<int32_t>(retry_ms % 1000) * 1000000);
    details.add_details()->PackFrom(retry);
  }
  return grpc::Status(code, message, details.SerializeAsString());
}

const char* GrpcCodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? kNames[i] : "UNKNOWN";
}

std::string ReasonOf(const grpc::Status& status) {
  sv::v1::RpcStatus details;
  if (status.error_details().empty() || !details.ParseFromString(status.error_details())) {
    return "";
  }
  for (const auto& any : details.details()) {
    sv::v1::ErrorInfo info;
    if (any.UnpackTo(&info)) return info.reason();
  }
  return "";
}

}  // namespace sv::api
