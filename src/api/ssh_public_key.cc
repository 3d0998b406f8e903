#include "api/ssh_public_key.h"

#include <openssl/sha.h>

#include <array>
#include <cctype>
#include <cstdint>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace sv::api {
namespace {

// The longest real key, RSA of 16,384 bits (OpenSSH's most) with a full
// comment, is about 3,050 bytes. Every key of a tenant goes to every node
// that runs one of its instances, in each desired set: 16 KiB lines (64 of
// them per tenant) made a node's set outgrow the agent's message limit.
constexpr size_t kLineMax = 4096;
constexpr size_t kCommentMax = 255;
constexpr int kRsaBitsMin = 2048;
constexpr int kRsaBitsMax = 16384;

constexpr std::array<std::string_view, 7> kTypes = {
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-rsa",
};

absl::Status Invalid(std::string message) {
  return Error(absl::StatusCode::kInvalidArgument, "INVALID_SSH_KEY", std::move(message));
}

// Reads one SSH wire-format string (uint32 length, then the bytes).
std::optional<std::string_view> ReadString(std::string_view& blob) {
  if (blob.size() < 4) return std::nullopt;
  const uint32_t n = (static_cast<uint32_t>(static_cast<unsigned char>(blob[0])) << 24) |
                     (static_cast<uint32_t>(static_cast<unsigned char>(blob[1])) << 16) |
                     (static_cast<uint32_t>(static_cast<unsigned char>(blob[2])) << 8) |
                     static_cast<uint32_t>(static_cast<unsigned char>(blob[3]));
  blob.remove_prefix(4);
  if (n > blob.size()) return std::nullopt;
  std::string_view out = blob.substr(0, n);
  blob.remove_prefix(n);
  return out;
}

// Bits of an mpint's magnitude.
int MpintBits(std::string_view mpint) {
  while (!mpint.empty() && mpint.front() == '\0') mpint.remove_prefix(1);
  if (mpint.empty()) return 0;
  int bits = static_cast<int>(mpint.size()) * 8;
  for (unsigned char top = static_cast<unsigned char>(mpint.front()); !(top & 0x80); top <<= 1) {
    --bits;
  }
  return bits;
}

}  // namespace

absl::StatusOr<SshPublicKey> ParseSshPublicKey(std::string_view input) {
  // Debian's Abseil has its own string_view.
  const absl::string_view text =
      absl::StripAsciiWhitespace(absl::string_view(input.data(), input.size()));
  if (text.empty()) return Invalid("public_key is required");
  if (text.size() > kLineMax) {
    return Invalid(absl::StrCat("public_key is longer than ", kLineMax, " bytes"));
  }
  if (absl::StrContains(text, "PRIVATE KEY") || absl::StartsWith(text, "PuTTY-User-Key-File")) {
    return Invalid("public_key is a private key; give the .pub file, and make a new key pair: "
                   "this one has left your machine");
  }
  if (text.find_first_of("\r\n") != absl::string_view::npos) {
    return Invalid("public_key must be one key: one line");
  }
  const size_t type_end = text.find_first_of(" \t");
  if (type_end == absl::string_view::npos) {
    return Invalid("public_key must be \"<type> <base64 key> [comment]\"");
  }
  SshPublicKey key;
  key.type = std::string(text.substr(0, type_end));
  bool known = false;
  for (std::string_view t : kTypes) known = known || t == key.type;
  if (!known) {
    if (key.type == "ssh-dss") return Invalid("DSA keys are not accepted; use ed25519");
    return Invalid(absl::StrCat(
        "unsupported key type \"", key.type.substr(0, 40),
        "\" (options before the type are not accepted); use ssh-ed25519, ecdsa-sha2-nistp256/"
        "384/521, their sk- variants or ssh-rsa of 2048 bits or more"));
  }
  const absl::string_view rest = absl::StripLeadingAsciiWhitespace(text.substr(type_end));
  const size_t b64_end = rest.find_first_of(" \t");
  const absl::string_view b64 = rest.substr(0, b64_end);
  key.comment = b64_end == absl::string_view::npos
                    ? ""
                    : std::string(absl::StripAsciiWhitespace(rest.substr(b64_end)));
  for (char c : key.comment) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Invalid("the key's comment has control characters");
    }
  }
  if (key.comment.size() > kCommentMax) {
    return Invalid(absl::StrCat("the key's comment is longer than ", kCommentMax, " bytes"));
  }
  std::string blob;
  bool base64_chars = !b64.empty();
  for (char c : b64) base64_chars = base64_chars && (std::isalnum(static_cast<unsigned char>(c)) ||
                                                     c == '+' || c == '/' || c == '=');
  if (!base64_chars || !absl::Base64Unescape(b64, &blob)) {
    return Invalid("the key part of public_key is not base64");
  }
  std::string_view reader = blob;
  auto inner_type = ReadString(reader);
  if (!inner_type || *inner_type != key.type) {
    return Invalid(absl::StrCat("the key data is not a ", key.type, " key"));
  }
  if (key.type == "ssh-rsa") {
    auto e = ReadString(reader);
    auto n = e ? ReadString(reader) : std::nullopt;
    if (!n) return Invalid("the key data is not a complete RSA key");
    if (const int bits = MpintBits(*n); bits < kRsaBitsMin) {
      return Invalid(absl::StrCat("RSA keys must have at least ", kRsaBitsMin, " bits; this one has ",
                                  bits, " (use ed25519)"));
    } else if (bits > kRsaBitsMax) {
      return Invalid(absl::StrCat("RSA keys have at most ", kRsaBitsMax, " bits; this one has ",
                                  bits));
    }
  } else if (key.type == "ssh-ed25519" || key.type == "sk-ssh-ed25519@openssh.com") {
    auto pk = ReadString(reader);
    if (!pk || pk->size() != 32) return Invalid("the key data is not a complete ed25519 key");
  } else {
    auto curve = ReadString(reader);
    auto point = curve ? ReadString(reader) : std::nullopt;
    if (!point || point->empty()) return Invalid("the key data is not a complete ECDSA key");
  }
  // A security key's blob ends with its application ("ssh:" and the like).
  if (absl::StartsWith(key.type, "sk-") && !ReadString(reader)) {
    return Invalid("the key data lacks the security key's application");
  }
  if (!reader.empty()) {
    return Invalid(absl::StrCat("the key data has ", reader.size(),
                                " bytes after the key; paste the .pub line as it is"));
  }
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest;
  SHA256(reinterpret_cast<const unsigned char*>(blob.data()), blob.size(), digest.data());
  std::string encoded = absl::Base64Escape(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
  while (!encoded.empty() && encoded.back() == '=') encoded.pop_back();
  key.fingerprint = absl::StrCat("SHA256:", encoded);
  key.line = absl::StrCat(key.type, " ", b64, key.comment.empty() ? "" : " ", key.comment);
  return key;
}

bool ValidSshKeyName(std::string_view name) {
  if (name.empty() || name.size() > 63 || name.front() == '-' || name.back() == '-') return false;
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '-')) {
      return false;
    }
  }
  return true;
}

std::string DefaultSshKeyName(const SshPublicKey& key) {
  std::string name;
  for (char c : key.comment) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) && u < 0x80) {
      name.push_back(static_cast<char>(std::tolower(u)));
    } else if (!name.empty() && name.back() != '-') {
      name.push_back('-');
    }
    if (name.size() == 63) break;
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (!name.empty()) return name;
  std::string start;
  for (char c : key.fingerprint.substr(7)) {
    if (std::isalnum(static_cast<unsigned char>(c))) start.push_back(std::tolower(static_cast<unsigned char>(c)));
    if (start.size() == 8) break;
  }
  return absl::StrCat("key-", start);
}

}  // namespace sv::api
