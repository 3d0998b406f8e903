#ifndef SV_STORE_SSH_KEY_STORE_H_
#define SV_STORE_SSH_KEY_STORE_H_

// PostgreSQL side of the tenants' SSH public keys (docs/security.md, "SSH
// keys"). The keys reach instances through the agents' desired sets
// (AgentStore::DesiredForNode); a change signals the nodes concerned
// (migration 0108).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::store {

struct SshKeyRow {
  std::string id;
  std::string tenant_id;
  std::string name;
  std::string public_key;  // The normalized OpenSSH line.
  std::string fingerprint;
  std::string created_by;
  absl::Time created_at;
};

// The most keys a tenant may hold.
inline constexpr int kSshKeysPerTenantMax = 64;

class SshKeyStore {
 public:
  explicit SshKeyStore(Database& db) : db_(db) {}

  // Adds the key, or answers with the tenant's key of the same fingerprint
  // when it has the same name (a retry). ALREADY_EXISTS when the
  // fingerprint is registered under another name (SSH_KEY_EXISTS) or the
  // name is another key's (SSH_KEY_NAME_TAKEN); FAILED_PRECONDITION /
  // TOO_MANY_SSH_KEYS at kSshKeysPerTenantMax.
  absl::StatusOr<SshKeyRow> Add(const SshKeyRow& key);
  // Oldest first.
  absl::StatusOr<std::vector<SshKeyRow>> List(const std::string& tenant_id);
  // NOT_FOUND / SSH_KEY_NOT_FOUND unless the tenant has the key.
  absl::StatusOr<SshKeyRow> Delete(const std::string& tenant_id, const std::string& id);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_SSH_KEY_STORE_H_
