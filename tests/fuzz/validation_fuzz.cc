// libFuzzer target: every validator the API runs on untrusted input, fed
// arbitrary bytes. None may crash, hang or accept what it must reject.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "api/api_keys.h"
#include "api/ssh_public_key.h"
#include "api/validation.h"
#include "common/status.h"

namespace {

// Splits the input into fields at 0xff bytes so one input drives them all.
std::string Field(const uint8_t*& data, size_t& size) {
  return sv::fuzz::TakeField(data, size, 0xff);
}

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = Field(data, size);
  const std::string image = Field(data, size);
  const std::string model = Field(data, size);
  const std::string request_id = Field(data, size);
  const std::string token = Field(data, size);
  const int gpus = size >= 4 ? static_cast<int>(data[0] | data[1] << 8 | data[2] << 16 |
                                                static_cast<uint32_t>(data[3]) << 24)
                             : static_cast<int>(size);

  auto spec = sv::api::NormalizeInstanceSpec({name, gpus, model, image});
  if (spec.ok()) {
    Check(spec->gpu_count >= 1 && spec->gpu_count <= 128);
    Check(spec->gpu_count <= 8 || spec->gpu_count % 8 == 0);
    Check(spec->name.size() <= 63 && spec->image.size() <= 256);
    Check(spec->gpu_model == "RTX 4090");
    // What reaches a node's runtime as IMAGE never reads as an option.
    Check(!spec->image.empty() && spec->image[0] != '-');
  } else {
    Check(spec.status().code() == absl::StatusCode::kInvalidArgument);
    Check(!sv::ReasonOf(spec.status()).empty());
  }
  absl::Status rid = sv::api::ValidateRequestId(request_id);
  Check(rid.ok() == (!request_id.empty() && request_id.size() <= 128 &&
                     request_id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop"
                                                  "qrstuvwxyz0123456789._:-") ==
                         std::string::npos));
  for (bool deleted : {false, true}) {
    auto cursor = sv::api::DecodePageToken(token, deleted);
    if (cursor.ok() && cursor->has_value()) {
      // A token we accept must round-trip to itself.
      Check(sv::api::EncodePageToken(**cursor, deleted) == token ||
            sv::api::DecodePageToken(sv::api::EncodePageToken(**cursor, deleted), deleted).ok());
    }
  }
  auto key = sv::api::ParseApiKey(token);
  if (key.has_value()) Check(key->key_id.rfind("key-", 0) == 0 && key->secret.size() == 40);
  auto page = sv::api::NormalizePageSize(gpus);
  if (page.ok()) Check(*page >= 1 && *page <= sv::api::kPageSizeMax);
  // An SSH key line lands in every instance's authorized_keys: one accepted
  // is one line with no control character, no options before its type, a
  // fingerprint of the right shape and a valid default name.
  auto ssh = sv::api::ParseSshPublicKey(image + " " + token + " " + name);
  if (ssh.ok()) {
    for (char c : ssh->line) Check(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
    Check(ssh->line.rfind(ssh->type + " ", 0) == 0);
    Check(ssh->type.rfind("ssh-", 0) == 0 || ssh->type.rfind("ecdsa-", 0) == 0 ||
          ssh->type.rfind("sk-", 0) == 0);
    Check(ssh->fingerprint.size() == 50 && ssh->fingerprint.rfind("SHA256:", 0) == 0);
    Check(sv::api::ValidSshKeyName(sv::api::DefaultSshKeyName(*ssh)));
  } else {
    Check(sv::ReasonOf(ssh.status()) == "INVALID_SSH_KEY");
  }
  return 0;
}
