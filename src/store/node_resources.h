#ifndef SV_STORE_NODE_RESOURCES_H_
#define SV_STORE_NODE_RESOURCES_H_

// What a node agent needs besides GPUs to run an instance: the mounts
// (attached volumes, public library items) and the node ports of its
// declared ports. svd hands node ports out here, from the node's range,
// under a per-node lock and the unique (node_id, node_port) key, so two
// instances never share one. See docs/storage.md and docs/marketplace.md.

#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace sv::store {

struct AgentAssignment;

// Host paths the agents mount from (documented in docs/storage.md).
inline constexpr char kVolumeHostRoot[] = "/var/lib/sv/volumes/";
inline constexpr char kLibraryHostRoot[] = "/var/lib/sv/library/";
inline constexpr char kLibraryMountRoot[] = "/public/";

struct AssignedMount {
  std::string volume_id;  // Empty for a library mount.
  std::string source;
  std::string target;
  bool read_only = false;
  bool operator==(const AssignedMount&) const = default;
};

struct AssignedPort {
  int container_port = 0;
  int node_port = 0;
  std::string protocol = "tcp";
  bool operator==(const AssignedPort&) const = default;
};

// Fills mounts, ports and SSH keys of the node's assignments, inside the transaction
// that computes them: binds node-local volumes placed for the first time to
// this node and allocates missing node ports.
absl::Status LoadAssignmentResources(pqxx::work& txn, const std::string& node_id,
                                     absl::Time now, std::vector<AgentAssignment>& desired);

// The agent of `node_id` reports the mounts an instance has there (after a
// start or a hot attach/detach). Attachments the report completes become
// ATTACHED, detaches finish, moves waiting for them proceed. `error` is
// recorded as the reason of the changes still waiting.
struct ReportedMount {
  std::string volume_id;
  std::string target;
};
absl::Status ConfirmMounts(pqxx::work& txn, const std::string& node_id,
                           const std::string& instance_id,
                           const std::vector<ReportedMount>& mounts, const std::string& error,
                           absl::Time now);

// Only the detach part of ConfirmMounts: detaches of volumes not in
// `mounted` are done on this node.
absl::Status ConfirmDetachesOnly(pqxx::work& txn, const std::string& node_id,
                                 const std::string& instance_id,
                                 const std::vector<ReportedMount>& mounted, absl::Time now);

// Records where the node's ports are reached and the range svd may use
// (0, 0: keep the default range).
absl::Status SetNodeNetwork(pqxx::work& txn, const std::string& node_id,
                            const std::string& address, int port_min, int port_max);

}  // namespace sv::store

#endif  // SV_STORE_NODE_RESOURCES_H_
