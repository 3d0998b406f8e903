#ifndef SV_API_VALIDATION_H_
#define SV_API_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "store/store.h"

namespace sv::api {

inline constexpr int kInstanceGpusMax = 128;
inline constexpr int kGpusPerNode = 8;
inline constexpr int kNameLengthMax = 63;
inline constexpr int kImageLengthMax = 256;
inline constexpr int kRequestIdLengthMax = 128;
inline constexpr int kMaxLeavesMax = 16;
inline constexpr int kPageSizeDefault = 50;
inline constexpr int kPageSizeMax = 500;
inline constexpr char kDefaultGpuModel[] = "RTX 4090";
inline constexpr char kDefaultImage[] = "sv/ubuntu-22.04-cuda-12.4";

// A request's timestamp field as a time: INVALID_ARGUMENT / INVALID_TIME
// outside 0001-01-01..9999-12-31 or with nanos outside 0..999,999,999, the
// range google.protobuf.Timestamp defines (and PostgreSQL can store).
absl::StatusOr<absl::Time> TimeField(const char* field, const google::protobuf::Timestamp& t);

// Checks a GPU count: 1-8, or a multiple of 8 up to 128.
absl::Status ValidateGpuCount(int gpu_count);

// Validates a create request's fields and fills in defaults (model, image).
// Every failure is INVALID_ARGUMENT with a reason naming the field.
absl::StatusOr<store::InstanceSpec> NormalizeInstanceSpec(store::InstanceSpec spec);

// A container image reference: 1-256 characters of [A-Za-z0-9._-/:@],
// starting with a letter or digit, no empty or dot-led path part.
absl::Status ValidateImageRef(const std::string& image);

// The app registry (docs/marketplace.md, "Whose images"): svd's
// --app-registry host, where each tenant owns the namespace
// <registry>/<tenant id>/. The default registry host:
inline constexpr char kDefaultAppRegistry[] = "registry.sv.internal";

// Whether `host` can name a registry: what a container runtime reads as
// one (it holds a '.' or ':' or is "localhost") and only [a-z0-9.:-].
bool IsRegistryHost(const std::string& host);

// The tenant id whose namespace in `registry` holds `image`, lower-cased,
// or "" when the reference is not in a tenant's namespace there (another
// registry, Docker Hub, or the registry's own top-level repositories).
// The host is compared as a runtime resolves it: case, a trailing dot and
// a port do not make another registry.
std::string ImageNamespaceTenant(const std::string& image, const std::string& registry);

// A tenant's use of `image` (a create, or an app it publishes): refused
// with PERMISSION_DENIED / IMAGE_NOT_YOURS when the image is in another
// tenant's namespace of the app registry.
absl::Status CheckImageIsUsable(const std::string& image, const std::string& registry,
                                const std::string& tenant_id);

// Request ids: 1-128 characters of [A-Za-z0-9._:-].
absl::Status ValidateRequestId(const std::string& request_id);

// Resource ids and names: lower-case letters, digits and dashes.
absl::Status ValidateName(const std::string& field, const std::string& name);
bool LooksLikeId(const std::string& id, const std::string& prefix);
// An operator call's tenant_id: 1-64 characters, else INVALID_TENANT_ID.
absl::Status ValidateTenantId(const std::string& tenant_id);
// An e-mail address (`field` names it in the error): INVALID_EMAIL.
absl::Status ValidateEmail(const std::string& field, const std::string& email);
// The times a google.protobuf.Timestamp (and PostgreSQL) can hold: years
// 0001 to 9999, in Unix seconds.
inline constexpr int64_t kTimestampSecondsMin = -62'135'596'800;
inline constexpr int64_t kTimestampSecondsMax = 253'402'300'799;
// Whether `text` is well-formed UTF-8 (PostgreSQL refuses other text).
bool IsValidUtf8(std::string_view text);
// Free text a person wrote (a description, a note, a key's name): no NUL or
// other control character, but tabs and line breaks where `lines`.
// PostgreSQL's text stops at a NUL, so such text was stored cut short and
// an identical retry no longer matched it. INVALID_ARGUMENT / `reason`.
absl::Status CheckFreeText(const std::string& field, const std::string& text,
                           const std::string& reason, bool lines);

// A digest of the request's content, to tell a retry from a reuse.
std::string InstanceFingerprint(const store::InstanceSpec& spec);

// Page size after defaults and the cap (kPageSizeMax); negative sizes are
// rejected. Lists whose rows are small default to more than
// kPageSizeDefault.
absl::StatusOr<int> NormalizePageSize(int page_size, int default_size = kPageSizeDefault);

// Opaque page tokens; they also bind the list's filter so a token from one
// query cannot be used with another.
std::string EncodePageToken(const store::ListCursor& cursor, bool show_deleted);
absl::StatusOr<std::optional<store::ListCursor>> DecodePageToken(
    const std::string& token, bool show_deleted);

}  // namespace sv::api

#endif  // SV_API_VALIDATION_H_
