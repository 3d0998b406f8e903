// libFuzzer target: the node-agent protocol (sv.v1.AgentService) from both
// ends. The first byte picks a direction; the rest are protobuf wire bytes.
//  - svd's side: an AgentMessage as a node sends it, through the checks svd
//    runs before the database (api/internal/agent_messages.h): the
//    registration, every later message's bounds, and the credential form.
//  - svagent's side: a ServerMessage as svd sends it; each instance of a
//    desired set becomes a RuntimeInstance (agent/assignment.h) and the
//    docker driver's command line (DockerRunArgs).
// Nothing may crash; what the checks accept must be within the limits, and
// a docker command line keeps its shape whatever the strings hold.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "agent/assignment.h"
#include "agent/runtime_driver.h"
#include "api/internal/agent_messages.h"
#include "common/status.h"
#include "google/protobuf/stubs/logging.h"
#include "sv/v1/agent.pb.h"

namespace {

namespace internal = sv::api::internal;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void ServerSide(const std::string& bytes) {
  sv::v1::AgentMessage m;
  if (!m.ParseFromString(bytes)) return;
  if (m.has_register_()) {
    const auto& r = m.register_();
    absl::Status valid = internal::ValidateRegistration(r);
    if (valid.ok()) {
      Check(!r.node_name().empty() && r.node_name().size() <= internal::kAgentLabelLengthMax);
      Check(r.gpu_count() >= 1 && r.gpu_count() <= 8);
      Check(r.running_instance_ids_size() <= internal::kAgentRunningIdsMax);
    } else {
      Check(sv::ReasonOf(valid) == "INVALID_REGISTRATION");
    }
    // A node name doubles as a credential string in this check: any text.
    auto credential = internal::ParseNodeCredential(r.node_name());
    if (credential) {
      Check(credential->id.rfind("ncr-", 0) == 0);
      Check(credential->id.size() == 4 + internal::kNodeCredentialIdLength);
      Check(credential->secret.size() == internal::kNodeCredentialSecretLength);
    }
  }
  absl::Status checked = internal::CheckStreamMessage(m);
  if (checked.ok()) {
    Check(m.has_heartbeat() || m.has_report() || m.has_mounts() || m.has_reports());
    if (m.has_heartbeat()) {
      Check(m.heartbeat().running_instance_ids_size() <= internal::kAgentRunningIdsMax);
    }
    if (m.has_mounts()) Check(m.mounts().mounts_size() <= internal::kAgentReportMountsMax);
    if (m.has_reports()) {
      // Accepted whole or not at all: every report of an accepted batch has
      // a state.
      Check(m.reports().reports_size() <= internal::kAgentReportBatchMax);
      for (const auto& r : m.reports().reports()) {
        Check(r.state() != sv::v1::AGENT_INSTANCE_STATE_UNSPECIFIED &&
              sv::v1::AgentInstanceState_IsValid(r.state()));
      }
    }
  } else {
    Check(!sv::ReasonOf(checked).empty());
  }
}

void AgentSide(const std::string& bytes) {
  sv::v1::ServerMessage m;
  if (!m.ParseFromString(bytes) || !m.has_desired()) return;
  for (const auto& a : m.desired().instances()) {
    sv::agent::RuntimeInstance instance = sv::agent::InstanceFromAssignment(a);
    Check(instance.instance_id == a.instance_id() && instance.image == a.image());
    Check(static_cast<int>(instance.volumes.size()) == a.volumes_size());
    Check(static_cast<int>(instance.ports.size()) == a.ports_size());
    Check(static_cast<int>(instance.gpu_indices.size()) == a.gpu_indices_size());
    std::vector<std::string> args = sv::agent::DockerRunArgs(instance);
    const size_t expected = 6 + (instance.gpu_indices.empty() ? 0 : 2) +
                            2 * instance.ports.size() + 2 * instance.volumes.size() + 1;
    Check(args.size() == expected);
    Check(args[0] == "run" && args.back() == instance.image);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Strings that are not UTF-8 fail to parse, as on svd; without the log.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    AgentSide(bytes);
  } else {
    ServerSide(bytes);
  }
  return 0;
}
