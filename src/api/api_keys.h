#ifndef SV_API_API_KEYS_H_
#define SV_API_API_KEYS_H_

#include <optional>
#include <string>

namespace sv::api {

// An API key is "sv_<id part>_<secret>". The id part names the key row
// ("key-<id part>"); only the SHA-256 of the secret is stored.
struct GeneratedKey {
  std::string key_id;
  std::string plaintext;
  std::string secret_sha256;
};

GeneratedKey NewApiKey();

struct ParsedKey {
  std::string key_id;
  std::string secret;
};

// Returns nothing when `plaintext` does not have the shape of an sv key.
std::optional<ParsedKey> ParseApiKey(const std::string& plaintext);

}  // namespace sv::api

#endif  // SV_API_API_KEYS_H_
