#ifndef SV_API_INTERNAL_AGENT_MESSAGES_H_
#define SV_API_INTERNAL_AGENT_MESSAGES_H_

// The checks svd runs on what a node agent sends before anything touches
// the database: the credential's form, the registration, and each message
// on an established stream. Kept apart from agent_service.cc so that
// tests/fuzz/agent_message_fuzz.cc drives exactly these functions.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "sv/v1/agent.pb.h"

namespace sv::api::internal {

inline constexpr int kAgentRunningIdsMax = 64;
inline constexpr size_t kAgentLabelLengthMax = 63;
inline constexpr int kNodeCredentialIdLength = 14;
inline constexpr int kNodeCredentialSecretLength = 40;
inline constexpr int kAgentReportMountsMax = 256;
// Reports in one InstanceReports message (agent.proto).
inline constexpr int kAgentReportBatchMax = 64;

// A node credential is "svn_<id part>_<secret>"; the row id is "ncr-<id part>".
struct ParsedNodeCredential {
  std::string id;
  std::string secret;
};
std::optional<ParsedNodeCredential> ParseNodeCredential(const std::string& text);

// The first message of a stream: INVALID_REGISTRATION unless every field
// is within bounds.
absl::Status ValidateRegistration(const v1::RegisterNode& r);

// A later message of a stream: OK for a heartbeat, report or mount report
// within bounds; otherwise the error svd answers with (ServerMessage.error):
// TOO_MANY_INSTANCES, INVALID_REPORT, TOO_MANY_MOUNTS, ALREADY_REGISTERED,
// TELEMETRY_MOVED or EMPTY_MESSAGE.
absl::Status CheckStreamMessage(const v1::AgentMessage& m);

}  // namespace sv::api::internal

#endif  // SV_API_INTERNAL_AGENT_MESSAGES_H_
