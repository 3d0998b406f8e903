#include "api/validation.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ids.h"
#include "common/status.h"

namespace sv::api {
namespace {

absl::Status Invalid(absl::string_view reason, absl::string_view message) {
  return Error(absl::StatusCode::kInvalidArgument, reason, message);
}

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

absl::Status ValidateGpuCount(int gpu_count) {
  if (gpu_count < 1 || gpu_count > kInstanceGpusMax) {
    return Invalid("INVALID_GPU_COUNT",
                   absl::StrCat("gpu_count must be between 1 and ", kInstanceGpusMax,
                                ", got ", gpu_count));
  }
  if (gpu_count > kGpusPerNode && gpu_count % kGpusPerNode != 0) {
    return Invalid("INVALID_GPU_COUNT",
                   absl::StrCat("gpu_count above ", kGpusPerNode,
                                " must be a multiple of ", kGpusPerNode,
                                " (whole nodes), got ", gpu_count));
  }
  return absl::OkStatus();
}

absl::Status ValidateTenantId(const std::string& tenant_id) {
  if (tenant_id.empty() || tenant_id.size() > 64) {
    return Invalid("INVALID_TENANT_ID", "tenant_id is required (at most 64 characters)");
  }
  return absl::OkStatus();
}

absl::Status ValidateEmail(const std::string& field, const std::string& email) {
  if (email.size() < 3 || email.size() > 254 || email.find('@') == std::string::npos ||
      email.find_first_of(" \t\r\n") != std::string::npos) {
    return Invalid("INVALID_EMAIL",
                   absl::StrCat(field, " must be an e-mail address of at most 254 characters"));
  }
  return absl::OkStatus();
}

absl::Status ValidateName(const std::string& field, const std::string& name) {
  if (name.size() > static_cast<size_t>(kNameLengthMax)) {
    return Invalid("INVALID_NAME", absl::StrCat(field, " is ", name.size(),
                                                " characters; the most is ", kNameLengthMax));
  }
  bool ok = !name.empty() && name.front() >= 'a' && name.front() <= 'z' &&
            IsLowerAlnum(name.back());
  for (char c : name) ok = ok && (IsLowerAlnum(c) || c == '-');
  if (!ok) {
    return Invalid("INVALID_NAME",
                   absl::StrCat(field, " must start with a lower-case letter, hold only "
                                "lower-case letters, digits and dashes, and not end "
                                "with a dash"));
  }
  return absl::OkStatus();
}

bool LooksLikeId(const std::string& id, const std::string& prefix) {
  if (id.size() <= prefix.size() + 1 || id.size() > 64) return false;
  if (id.compare(0, prefix.size(), prefix) != 0 || id[prefix.size()] != '-') return false;
  for (char c : id.substr(prefix.size() + 1)) {
    if (!IsLowerAlnum(c)) return false;
  }
  return true;
}

absl::StatusOr<store::InstanceSpec> NormalizeInstanceSpec(store::InstanceSpec spec) {
  absl::Status count = ValidateGpuCount(spec.gpu_count);
  if (!count.ok()) return count;
  if (!spec.name.empty()) {
    absl::Status name = ValidateName("name", spec.name);
    if (!name.ok()) return name;
  }
  if (spec.max_leaves < 0 || spec.max_leaves > kMaxLeavesMax) {
    return Invalid("INVALID_MAX_LEAVES",
                   absl::StrCat("max_leaves must be between 0 (no limit) and ", kMaxLeavesMax));
  }
  if (spec.max_leaves > 0 && spec.gpu_count <= kGpusPerNode) {
    return Invalid("INVALID_MAX_LEAVES",
                   "max_leaves applies only to gangs of more than 8 GPUs");
  }
  if (spec.gpu_model.empty()) spec.gpu_model = kDefaultGpuModel;
  if (spec.gpu_model != kDefaultGpuModel) {
    return Invalid("UNKNOWN_GPU_MODEL",
                   absl::StrCat("gpu_model '", spec.gpu_model.substr(0, 64),
                                "' is not offered; use '", kDefaultGpuModel, "'"));
  }
  if (spec.image.empty()) spec.image = kDefaultImage;
  if (spec.image.size() > static_cast<size_t>(kImageLengthMax)) {
    return Invalid("INVALID_IMAGE", absl::StrCat("image is longer than ",
                                                 kImageLengthMax, " characters"));
  }
  // A leading '-' would reach the node's runtime as an option (docker run
  // ... IMAGE), so a reference starts with a letter or digit.
  if (!IsLowerAlnum(spec.image[0]) && !(spec.image[0] >= 'A' && spec.image[0] <= 'Z')) {
    return Invalid("INVALID_IMAGE", "image must start with a letter or digit");
  }
  for (char c : spec.image) {
    bool ok = IsLowerAlnum(c) || (c >= 'A' && c <= 'Z') || c == '.' || c == '_' ||
              c == '-' || c == '/' || c == ':' || c == '@';
    if (!ok) {
      return Invalid("INVALID_IMAGE",
                     "image may hold only letters, digits and . _ - / : @");
    }
  }
  return spec;
}

absl::Status ValidateRequestId(const std::string& request_id) {
  if (request_id.empty() || request_id.size() > static_cast<size_t>(kRequestIdLengthMax)) {
    return Invalid("INVALID_REQUEST_ID",
                   absl::StrCat("request_id must be 1 to ", kRequestIdLengthMax,
                                " characters"));
  }
  for (char c : request_id) {
    bool ok = IsLowerAlnum(c) || (c >= 'A' && c <= 'Z') || c == '.' || c == '_' ||
              c == ':' || c == '-';
    if (!ok) return Invalid("INVALID_REQUEST_ID", "request_id may hold only A-Z a-z 0-9 . _ : -");
  }
  return absl::OkStatus();
}

std::string InstanceFingerprint(const store::InstanceSpec& spec) {
  // max_leaves joins the digest only when set, so digests of requests made
  // before it existed stay valid.
  return Sha256Hex(absl::StrCat("v1\n", spec.name, "\n", spec.gpu_count, "\n",
                                spec.gpu_model, "\n", spec.image,
                                spec.max_leaves > 0 ? absl::StrCat("\nleaves ", spec.max_leaves)
                                                    : std::string()));
}

absl::StatusOr<int> NormalizePageSize(int page_size, int default_size) {
  if (page_size < 0) return Invalid("INVALID_PAGE_SIZE", "page_size must not be negative");
  if (page_size == 0) return default_size;
  return std::min(page_size, kPageSizeMax);
}

std::string EncodePageToken(const store::ListCursor& cursor, bool show_deleted) {
  return absl::WebSafeBase64Escape(absl::StrCat("v1|", show_deleted ? 1 : 0, "|",
                                                cursor.created_at_micros, "|", cursor.id));
}

absl::StatusOr<std::optional<store::ListCursor>> DecodePageToken(
    const std::string& token, bool show_deleted) {
  if (token.empty()) return std::optional<store::ListCursor>();
  std::string raw;
  const absl::Status bad = Invalid("INVALID_PAGE_TOKEN",
                                   "page_token is not one this list returned");
  if (token.size() > 256 || !absl::WebSafeBase64Unescape(token, &raw)) return bad;
  std::vector<std::string> parts = absl::StrSplit(raw, '|');
  store::ListCursor cursor;
  if (parts.size() != 4 || parts[0] != "v1" ||
      parts[1] != (show_deleted ? "1" : "0") ||
      !absl::SimpleAtoi(parts[2], &cursor.created_at_micros) ||
      !LooksLikeId(parts[3], "ins")) {
    return bad;
  }
  cursor.id = parts[3];
  return std::optional<store::ListCursor>(cursor);
}

}  // namespace sv::api
