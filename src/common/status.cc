#include "common/status.h"

#include "absl/strings/cord.h"

namespace sv {
namespace {
constexpr char kReasonPayloadUrl[] = "type.sv.dev/sv.reason";
}  // namespace

absl::Status Error(absl::StatusCode code, absl::string_view reason,
                   absl::string_view message) {
  absl::Status status(code, message);
  status.SetPayload(kReasonPayloadUrl, absl::Cord(reason));
  return status;
}

std::string ReasonOf(const absl::Status& status) {
  auto payload = status.GetPayload(kReasonPayloadUrl);
  if (!payload.has_value()) return "";
  return std::string(*payload);
}

}  // namespace sv
