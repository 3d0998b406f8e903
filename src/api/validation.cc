#include "api/validation.h"

#include <cctype>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ids.h"
#include "common/status.h"

namespace sv::api {
namespace {

// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.

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

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int follow = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      follow = 1, code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      follow = 2, code = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      follow = 3, code = c & 0x07;
    } else {
      return false;
    }
    if (i + follow >= text.size()) return false;
    for (int k = 1; k <= follow; ++k) {
      const unsigned char f = static_cast<unsigned char>(text[i + k]);
      if ((f & 0xC0) != 0x80) return false;
      code = (code << 6) | (f & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF.
    if ((follow == 2 && code < 0x800) || (follow == 3 && code < 0x10000) ||
        (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
      return false;
    }
    i += follow + 1;
  }
  return true;
}

absl::Status CheckFreeText(const std::string& field, const std::string& text,
                           const std::string& reason, bool lines) {
  for (unsigned char c : text) {
    const bool line_break = c == '\t' || c == '\n' || c == '\r';
    if ((c < 0x20 && !(lines && line_break)) || c == 0x7f) {
      return Invalid(reason, absl::StrCat(field, lines ? " may hold no control characters but "
                                                         "tabs and line breaks"
                                                       : " may hold no control characters"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateEmail(const std::string& field, const std::string& email) {
  if (email.size() < 3 || email.size() > 254 || email.find('@') == std::string::npos ||
      email.find_first_of(" \t\r\n") != std::string::npos ||
      !CheckFreeText(field, email, "INVALID_EMAIL", false).ok()) {
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
  SV_RETURN_IF_ERROR(ValidateImageRef(spec.image));
  return spec;
}

absl::Status ValidateImageRef(const std::string& image) {
  if (image.empty() || image.size() > static_cast<size_t>(kImageLengthMax)) {
    return Invalid("INVALID_IMAGE", absl::StrCat("image must be 1 to ", kImageLengthMax,
                                                 " characters"));
  }
  // A leading '-' would reach the node's runtime as an option (docker run
  // ... IMAGE), so a reference starts with a letter or digit.
  if (!IsLowerAlnum(image[0]) && !(image[0] >= 'A' && image[0] <= 'Z')) {
    return Invalid("INVALID_IMAGE", "image must start with a letter or digit");
  }
  for (char c : image) {
    bool ok = IsLowerAlnum(c) || (c >= 'A' && c <= 'Z') || c == '.' || c == '_' ||
              c == '-' || c == '/' || c == ':' || c == '@';
    if (!ok) {
      return Invalid("INVALID_IMAGE",
                     "image may hold only letters, digits and . _ - / : @");
    }
  }
  // Runtimes refuse empty, "." and ".." path components; refusing them
  // here keeps a reference's namespace (ImageNamespaceTenant) its first
  // component, with no way to write one path two ways.
  const std::string_view path = std::string_view(image).substr(0, image.find('@'));
  for (absl::string_view part : absl::StrSplit(absl::string_view(path.data(), path.size()), '/')) {
    if (part.empty() || part == "." || part == ".." || part[0] == '.') {
      return Invalid("INVALID_IMAGE", "image path parts must not be empty or start with '.'");
    }
  }
  return absl::OkStatus();
}

namespace {

// A registry host as a runtime resolves it: lower-case, no trailing dot,
// no port.
std::string CanonicalHost(std::string host) {
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t colon = host.rfind(':');
  if (colon != std::string::npos) host.resize(colon);
  while (!host.empty() && host.back() == '.') host.pop_back();
  return host;
}

}  // namespace

bool IsRegistryHost(const std::string& host) {
  if (host.empty() || host.size() > 253) return false;
  for (char c : host) {
    if (!IsLowerAlnum(c) && c != '.' && c != ':' && c != '-') return false;
  }
  return host.find_first_of(".:") != std::string::npos || host == "localhost";
}

std::string ImageNamespaceTenant(const std::string& image, const std::string& registry) {
  const size_t slash = image.find('/');
  if (slash == std::string::npos) return "";
  const std::string host = image.substr(0, slash);
  // A first part with no '.' or ':' that is not "localhost" is a Docker
  // Hub namespace, not a registry (as runtimes read it).
  std::string lower_host = CanonicalHost(host);
  if (host.find_first_of(".:") == std::string::npos && lower_host != "localhost") return "";
  if (lower_host != CanonicalHost(registry)) return "";
  const size_t end = image.find_first_of("/:@", slash + 1);
  std::string space = image.substr(slash + 1, end == std::string::npos ? std::string::npos
                                                                        : end - slash - 1);
  for (char& c : space) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Tenant ids are "ten-" and a token (common/ids.h); other top-level
  // names are the platform's own repositories, open to every tenant.
  return space.rfind("ten-", 0) == 0 ? space : "";
}

absl::Status CheckImageIsUsable(const std::string& image, const std::string& registry,
                                const std::string& tenant_id) {
  const std::string owner = ImageNamespaceTenant(image, registry);
  if (owner.empty() || owner == tenant_id) return absl::OkStatus();
  return Error(absl::StatusCode::kPermissionDenied, "IMAGE_NOT_YOURS",
               absl::StrCat("image '", image, "' is in another tenant's namespace of the app ",
                            "registry; its marketplace apps are run with LaunchApp (svctl apps "
                            "launch)"));
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

absl::StatusOr<absl::Time> TimeField(const char* field, const google::protobuf::Timestamp& t) {
  if (t.seconds() < kTimestampSecondsMin || t.seconds() > kTimestampSecondsMax || t.nanos() < 0 ||
      t.nanos() > 999'999'999) {
    return Invalid("INVALID_TIME", std::string(field) + " is not a valid timestamp");
  }
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
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
      // A time PostgreSQL cannot take was a DATABASE_ERROR (22009).
      cursor.created_at_micros < kTimestampSecondsMin * 1'000'000 ||
      cursor.created_at_micros > kTimestampSecondsMax * 1'000'000 ||
      !LooksLikeId(parts[3], "ins")) {
    return bad;
  }
  cursor.id = parts[3];
  return std::optional<store::ListCursor>(cursor);
}

}  // namespace sv::api
