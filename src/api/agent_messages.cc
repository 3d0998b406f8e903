#include "api/internal/agent_messages.h"

#include <vector>

#include "absl/strings/str_split.h"
#include "common/status.h"

namespace sv::api::internal {
namespace {

absl::Status BadRegistration(const std::string& why) {
  return Error(absl::StatusCode::kInvalidArgument, "INVALID_REGISTRATION", why);
}

absl::Status CheckReportState(const v1::InstanceReport& r) {
  switch (r.state()) {
    case v1::AGENT_STARTED:
    case v1::AGENT_EXITED:
    case v1::AGENT_START_FAILED:
    case v1::AGENT_STOPPED:
      return absl::OkStatus();
    default:
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_REPORT",
                   "a report needs a state");
  }
}

}  // namespace

std::optional<ParsedNodeCredential> ParseNodeCredential(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '_');
  if (parts.size() != 3 || parts[0] != "svn" || parts[1].size() != kNodeCredentialIdLength ||
      parts[2].size() != kNodeCredentialSecretLength) {
    return std::nullopt;
  }
  return ParsedNodeCredential{"ncr-" + parts[1], parts[2]};
}

absl::Status ValidateRegistration(const v1::RegisterNode& r) {
  if (r.node_name().empty() || r.node_name().size() > kAgentLabelLengthMax) {
    return BadRegistration("node_name must have 1 to 63 characters");
  }
  if (r.gpu_count() < 1 || r.gpu_count() > 8) {
    return BadRegistration("gpu_count must be 1 to 8");
  }
  for (const std::string* label : {&r.gpu_model(), &r.zone(), &r.pod(), &r.leaf_switch()}) {
    if (label->empty() || label->size() > kAgentLabelLengthMax) {
      return BadRegistration("gpu_model, zone, pod and leaf_switch need 1 to 63 characters");
    }
  }
  if (r.running_instance_ids_size() > kAgentRunningIdsMax) {
    return BadRegistration("too many running instances");
  }
  return absl::OkStatus();
}

absl::Status CheckStreamMessage(const v1::AgentMessage& m) {
  switch (m.body_case()) {
    case v1::AgentMessage::kHeartbeat:
      if (m.heartbeat().running_instance_ids_size() > kAgentRunningIdsMax ||
          m.heartbeat().desired_instance_ids_size() > kAgentRunningIdsMax) {
        return Error(absl::StatusCode::kInvalidArgument, "TOO_MANY_INSTANCES",
                     "a heartbeat lists too many running instances");
      }
      return absl::OkStatus();
    case v1::AgentMessage::kReport:
      return CheckReportState(m.report());
    case v1::AgentMessage::kReports:
      // Judged whole before any of it is handled: a batch with one bad
      // report is refused entirely, and the agent's heartbeats still
      // confirm what runs.
      if (m.reports().reports_size() > kAgentReportBatchMax) {
        return Error(absl::StatusCode::kInvalidArgument, "TOO_MANY_REPORTS",
                     "a report batch holds more than 64 reports");
      }
      for (const v1::InstanceReport& r : m.reports().reports()) {
        SV_RETURN_IF_ERROR(CheckReportState(r));
      }
      return absl::OkStatus();
    case v1::AgentMessage::kMounts:
      if (m.mounts().mounts_size() > kAgentReportMountsMax) {
        return Error(absl::StatusCode::kInvalidArgument, "TOO_MANY_MOUNTS",
                     "a mount report lists more than 256 mounts");
      }
      return absl::OkStatus();
    case v1::AgentMessage::kTelemetry:
      // Telemetry moved to SlaTelemetryService.StreamTelemetry (docs/sla.md);
      // an agent that still sends it here is told so and loses nothing else.
      return Error(absl::StatusCode::kFailedPrecondition, "TELEMETRY_MOVED",
                   "send telemetry on sv.v1.SlaTelemetryService/StreamTelemetry");
    case v1::AgentMessage::kRegister:
      return Error(absl::StatusCode::kFailedPrecondition, "ALREADY_REGISTERED",
                   "register is only the first message of a stream");
    default:
      return Error(absl::StatusCode::kInvalidArgument, "EMPTY_MESSAGE",
                   "the message has no body");
  }
}

}  // namespace sv::api::internal
