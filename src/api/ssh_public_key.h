#ifndef SV_API_SSH_PUBLIC_KEY_H_
#define SV_API_SSH_PUBLIC_KEY_H_

// Checks an OpenSSH public key line ("ssh-ed25519 AAAA... comment") before
// it is handed to instances' authorized_keys (docs/security.md, "SSH keys").

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sv::api {

struct SshPublicKey {
  std::string type;         // e.g. "ssh-ed25519".
  std::string line;         // Normalized: type, base64, comment (if any).
  std::string comment;
  std::string fingerprint;  // "SHA256:" + unpadded base64, as ssh-keygen -l.
};

// INVALID_ARGUMENT / INVALID_SSH_KEY unless `text` (surrounding blanks
// allowed) is one public key line of a supported type (ed25519, ECDSA
// P-256/384/521, their FIDO variants, or RSA of at least 2048 bits) whose
// base64 part decodes to a key blob of that type. Options before the type
// (authorized_keys syntax such as command="...") are refused: they would
// run on every instance of the tenant.
absl::StatusOr<SshPublicKey> ParseSshPublicKey(std::string_view text);

// A key name from the key's comment ("alice@laptop" -> "alice-laptop"), or
// "key-" and the fingerprint's first characters when nothing is left.
std::string DefaultSshKeyName(const SshPublicKey& key);

// Lower-case letters, digits and inner dashes, 1-63 characters.
bool ValidSshKeyName(std::string_view name);

}  // namespace sv::api

#endif  // SV_API_SSH_PUBLIC_KEY_H_
