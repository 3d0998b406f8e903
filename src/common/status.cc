#include "common/status.h"

#include "absl/strings/cord.h"

namespace sv {
namespace {
constexpr char kReasonPayloadUrl[] = "type.sv.dev/sv.reason";
constexpr char kRetryPayloadUrl[] = "type.sv.dev/sv.retry_after_ms";
}  // namespace

absl::Status Error(absl::StatusCode code, absl::string_view reason,
                   absl::string_view message) {
  absl::Status status(code, message);
  status.SetPayload(kReasonPayloadUrl, absl::Cord(reason));
  return status;
}

absl::Status CheckReasonText(const std::string& reason) {
  if (reason.empty() || reason.size() > 500) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_REASON",
                 "reason must be 1 to 500 characters: the tenant is shown it");
  }
  for (unsigned char c : reason) {
    if (c < 0x20 || c == 0x7f) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_REASON",
                   "reason must be one line of printable text");
    }
  }
  return absl::OkStatus();
}

absl::Status WithRetryAfter(absl::Status status, int64_t retry_after_ms) {
  status.SetPayload(kRetryPayloadUrl, absl::Cord(std::to_string(retry_after_ms)));
  return status;
}

int64_t RetryAfterMsOf(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryPayloadUrl);
  if (!payload.has_value()) return -1;
  return std::stoll(std::string(*payload));
}

std::string ReasonOf(const absl::Status& status) {
  auto payload = status.GetPayload(kReasonPayloadUrl);
  if (!payload.has_value()) return "";
  return std::string(*payload);
}

}  // namespace sv
