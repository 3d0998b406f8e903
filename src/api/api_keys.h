#ifndef SV_API_API_KEYS_H_
#define SV_API_API_KEYS_H_

#include <optional>
#include <string>

namespace sv::api {

// An API key is "sv_<id part>_<secret>". The id part names the key row
// ("key-<id part>"); only a salted hash of the secret is stored:
// hex(SHA-256(salt ":" hex(SHA-256(secret)))) with a random salt
// per key (32 base32 characters). The inner hash lets migration 0010 salt the unsalted digests of
// older keys without knowing their secrets.
struct GeneratedKey {
  std::string key_id;
  std::string plaintext;
  std::string salt;
  std::string secret_hash;
};

GeneratedKey NewApiKey();

// The stored hash of `secret` under `salt`.
std::string SaltedSecretHash(const std::string& salt, const std::string& secret);
// The salted hash of a key's plaintext, with a new salt (bootstrap files).
void HashKey(const std::string& secret, std::string* salt, std::string* secret_hash);

struct ParsedKey {
  std::string key_id;
  std::string secret;
};

// Returns nothing when `plaintext` does not have the shape of an sv key.
std::optional<ParsedKey> ParseApiKey(const std::string& plaintext);

}  // namespace sv::api

#endif  // SV_API_API_KEYS_H_
