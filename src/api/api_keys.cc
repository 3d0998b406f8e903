#include "api/api_keys.h"

#include "absl/strings/str_cat.h"
#include "common/ids.h"

namespace sv::api {
namespace {
constexpr int kIdPartLength = 14;
constexpr int kSecretLength = 40;

bool IsBase32(const std::string& s) {
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '2' && c <= '7'))) return false;
  }
  return true;
}
}  // namespace

std::string SaltedSecretHash(const std::string& salt, const std::string& secret) {
  return Sha256Hex(absl::StrCat(salt, ":", Sha256Hex(secret)));
}

void HashKey(const std::string& secret, std::string* salt, std::string* secret_hash) {
  *salt = RandomToken(32);
  *secret_hash = SaltedSecretHash(*salt, secret);
}

GeneratedKey NewApiKey() {
  std::string id_part = RandomToken(kIdPartLength);
  std::string secret = RandomToken(kSecretLength);
  GeneratedKey key{absl::StrCat("key-", id_part), absl::StrCat("sv_", id_part, "_", secret),
                   "", ""};
  HashKey(secret, &key.salt, &key.secret_hash);
  return key;
}

std::optional<ParsedKey> ParseApiKey(const std::string& plaintext) {
  const size_t expected = 3 + kIdPartLength + 1 + kSecretLength;
  if (plaintext.size() != expected || plaintext.compare(0, 3, "sv_") != 0 ||
      plaintext[3 + kIdPartLength] != '_') {
    return std::nullopt;
  }
  std::string id_part = plaintext.substr(3, kIdPartLength);
  std::string secret = plaintext.substr(4 + kIdPartLength);
  if (!IsBase32(id_part) || !IsBase32(secret)) return std::nullopt;
  return ParsedKey{absl::StrCat("key-", id_part), secret};
}

}  // namespace sv::api
