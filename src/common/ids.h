#ifndef SV_COMMON_IDS_H_
#define SV_COMMON_IDS_H_

#include <string>
#include <string_view>

namespace sv {

// A random identifier such as "ins-k3x9q2m7v8a1" drawn from the OS CSPRNG:
// `prefix` + "-" + `length` characters of lower-case base32.
std::string NewId(std::string_view prefix, int length = 14);

// `length` random lower-case base32 characters; used for secrets.
std::string RandomToken(int length);

// A random RFC 4122 version-4 UUID, for request ids.
std::string NewUuid();

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// Lower-case hex HMAC-SHA256 of `data` under `key`.
std::string HmacSha256Hex(std::string_view key, std::string_view data);

// Compares two strings in time independent of where they first differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sv

#endif  // SV_COMMON_IDS_H_
