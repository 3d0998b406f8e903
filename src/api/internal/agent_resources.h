#ifndef SV_API_INTERNAL_AGENT_RESOURCES_H_
#define SV_API_INTERNAL_AGENT_RESOURCES_H_

// The volume, library and port parts of the agent protocol (agent.proto:
// InstanceAssignment volumes and ports, MountReport, RegisterNode network
// fields), kept out of agent_service.cc. See docs/storage.md.

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "store/agent_store.h"
#include "store/database.h"
#include "sv/v1/agent.pb.h"

namespace sv::api::internal {

// Mounts and ports of an assignment, as the agent receives them.
void AddAssignmentResources(const store::AgentAssignment& a, v1::InstanceAssignment* out);
bool SameAssignmentResources(const store::AgentAssignment& a, const store::AgentAssignment& b);

// Adds the (instance, volume) pairs of a desired set sent to the agent.
void RememberSentMounts(const std::vector<store::AgentAssignment>& sent,
                        std::set<std::pair<std::string, std::string>>& ever_sent);

// Adds the (instance, volume) pairs of every attachment of the instances
// placed on this node: a connection's start counts them as sent, since an
// earlier connection may have had them mounted (the agent's reports say).
absl::Status RememberEarlierMounts(store::Database& db, const std::string& node_id,
                                   std::set<std::pair<std::string, std::string>>& ever_sent);

// Completes, for this node, detaches of volumes that were never in a
// desired set sent to its agent in this session (attached and detached
// between two polls): the agent cannot have mounted them.
absl::Status SettleUnsentDetaches(store::Database& db, const std::string& node_id,
                                  const std::set<std::pair<std::string, std::string>>& ever_sent,
                                  absl::Time now);

// Records the node's address (advertised, else the peer's IP from
// `grpc_peer`, e.g. "ipv4:10.0.0.5:43122") and its node port range.
absl::Status RecordNodeNetwork(store::Database& db, const std::string& node_id,
                               const v1::RegisterNode& registration,
                               const std::string& grpc_peer);

// A MountReport from the node's agent.
absl::Status HandleMountReport(store::Database& db, const std::string& node_id,
                               const v1::MountReport& report, absl::Time now);

}  // namespace sv::api::internal

#endif  // SV_API_INTERNAL_AGENT_RESOURCES_H_
