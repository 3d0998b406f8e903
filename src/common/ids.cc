#include "common/ids.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <array>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace sv {
namespace {

constexpr char kBase32[] = "abcdefghijklmnopqrstuvwxyz234567";

std::vector<unsigned char> RandomBytes(int count) {
  std::vector<unsigned char> bytes(count);
  if (RAND_bytes(bytes.data(), count) != 1) {
    // Without a working CSPRNG no id or secret is safe to hand out.
    std::fprintf(stderr, "fatal: RAND_bytes failed\n");
    std::abort();
  }
  return bytes;
}

}  // namespace

std::string RandomToken(int length) {
  assert(length > 0 && length <= 256);
  std::vector<unsigned char> bytes = RandomBytes(length);
  std::string out(length, 'a');
  for (int i = 0; i < length; ++i) out[i] = kBase32[bytes[i] & 31];
  return out;
}

std::string NewId(std::string_view prefix, int length) {
  return std::string(prefix) + "-" + RandomToken(length);
}

std::string NewUuid() {
  std::vector<unsigned char> b = RandomBytes(16);
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  char out[37];
  std::snprintf(out, sizeof(out),
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
                b[11], b[12], b[13], b[14], b[15]);
  return out;
}

namespace {

std::string Hex(const unsigned char* bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
         digest.data());
  return Hex(digest.data(), digest.size());
}

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest;
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data(), &size);
  return Hex(digest.data(), size);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace sv
