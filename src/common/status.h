#ifndef SV_COMMON_STATUS_H_
#define SV_COMMON_STATUS_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sv {

// Builds a status that carries a machine-readable reason (AIP-193), e.g.
// Error(absl::StatusCode::kInvalidArgument, "INVALID_GPU_COUNT", "...").
// The API layer turns the reason into an ErrorInfo detail.
absl::Status Error(absl::StatusCode code, absl::string_view reason,
                   absl::string_view message);

// The reason attached by Error(), or an empty string.
std::string ReasonOf(const absl::Status& status);

// Checks an operator's reason that a tenant is shown (a credit, a refund, a
// suspension): 1 to 500 bytes of one printable line, else INVALID_ARGUMENT
// / INVALID_REASON.
absl::Status CheckReasonText(const std::string& reason);

// Adds a "retry after" hint to a status (for rate limits).
absl::Status WithRetryAfter(absl::Status status, int64_t retry_after_ms);
// The hint, or -1 when there is none.
int64_t RetryAfterMsOf(const absl::Status& status);

}  // namespace sv

#define SV_STATUS_CONCAT_INNER_(a, b) a##b
#define SV_STATUS_CONCAT_(a, b) SV_STATUS_CONCAT_INNER_(a, b)

#define SV_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status sv_status_ = (expr);          \
    if (!sv_status_.ok()) return sv_status_;     \
  } while (false)

#define SV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define SV_ASSIGN_OR_RETURN(lhs, expr) \
  SV_ASSIGN_OR_RETURN_IMPL_(SV_STATUS_CONCAT_(sv_statusor_, __LINE__), lhs, expr)

#endif  // SV_COMMON_STATUS_H_
