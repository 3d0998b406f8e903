#ifndef SV_AGENT_AUTHORIZED_KEYS_H_
#define SV_AGENT_AUTHORIZED_KEYS_H_

// The authorized_keys file of each instance on this node: the tenant's SSH
// public keys, which svd sends with the instance (InstanceAssignment.
// authorized_keys). A driver hands the file to the instance (docker: bound
// read-only at /root/.ssh/authorized_keys; process: its path in
// SV_SSH_AUTHORIZED_KEYS_FILE) and rewrites it in place when the tenant's
// keys change, so a deleted key stops working in running instances. See
// docs/security.md, "SSH keys".

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sv::agent {

inline constexpr char kAuthorizedKeysTarget[] = "/root/.ssh/authorized_keys";

class AuthorizedKeysFiles {
 public:
  explicit AuthorizedKeysFiles(std::string root) : root_(std::move(root)) {}

  // <root>/<instance id>/authorized_keys.
  std::string PathOf(const std::string& instance_id) const;
  // Writes the instance's file (0600, in a 0700 directory) and returns its
  // path. An existing file is rewritten in place (same inode), so a bind
  // mount of it shows the new keys.
  absl::StatusOr<std::string> Write(const std::string& instance_id,
                                    const std::vector<std::string>& keys) const;
  // Rewrites an existing file only; FAILED_PRECONDITION when the instance
  // was started without one (it has no mount to show keys in).
  absl::Status Update(const std::string& instance_id,
                      const std::vector<std::string>& keys) const;
  // Removes the instance's file and directory; a missing one is fine.
  void Remove(const std::string& instance_id) const;

 private:
  std::string root_;
};

}  // namespace sv::agent

#endif  // SV_AGENT_AUTHORIZED_KEYS_H_
