// The one error system of Strata: absl::Status / absl::StatusOr<T>.
//
// Codes are gRPC's, so the gRPC boundary maps them one to one (common/grpc_status.h).
// Failures that input or the environment can cause are statuses whose message says what and
// where; asserts (STRATA_CHECK) guard invariants only.
//
//   RETURN_IF_ERROR(file.Sync());
//   RETURN_IF_ERROR_WITH(file.Sync(), "syncing slot file ", path);
//   ASSIGN_OR_RETURN(auto slot, tier.Allocate(bytes));
//   ASSIGN_OR_RETURN_WITH(auto slot, tier.Allocate(bytes), "tier ", tier.name());
//
// The _WITH forms prepend their context (absl::StrCat of the arguments) to the message and keep
// the code and payloads, so "slot file /ssd/0: No space left on device" reaches the caller.
#pragma once

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"

namespace strata {

// Returns `status` with "context: " prepended to its message; code and payloads are kept.
// An OK status is returned unchanged.
absl::Status Annotate(const absl::Status& status, std::string_view context);

// Maps an errno value to a status with the matching code: ENOENT → NotFound,
// ENOSPC/EDQUOT/ENOMEM → ResourceExhausted, EIO → DataLoss, EAGAIN/ECONNRESET/... → Unavailable,
// and so on. The message is "context: strerror(err)".
absl::Status ErrnoToStatus(int err, std::string_view context);

// True when retrying the same operation may succeed (Unavailable, DeadlineExceeded, Aborted).
bool IsRetryable(const absl::Status& status);

// Data found lost or corrupt is absl::StatusCode::kDataLoss (test with absl::IsDataLoss).

namespace internal {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace strata

#define STRATA_STATUS_CONCAT_INNER_(a, b) a##b
#define STRATA_STATUS_CONCAT_(a, b) STRATA_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                                     \
  do {                                                                            \
    if (const ::absl::Status strata_status_ = ::strata::internal::AsStatus(expr); \
        !strata_status_.ok()) {                                                   \
      return strata_status_;                                                      \
    }                                                                             \
  } while (false)

#define RETURN_IF_ERROR_WITH(expr, ...)                                           \
  do {                                                                            \
    if (const ::absl::Status strata_status_ = ::strata::internal::AsStatus(expr); \
        !strata_status_.ok()) {                                                   \
      return ::strata::Annotate(strata_status_, ::strata::StrCat(__VA_ARGS__));   \
    }                                                                             \
  } while (false)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr, annotate) \
  auto var = (expr);                                            \
  if (!var.ok()) return annotate(std::move(var).status());      \
  lhs = std::move(var).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_STATUS_CONCAT_(strata_statusor_, __LINE__), lhs, expr, )

#define ASSIGN_OR_RETURN_WITH(lhs, expr, ...)                                                  \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_STATUS_CONCAT_(strata_statusor_, __LINE__), lhs, expr,  \
                                [&](const ::absl::Status& s) {                                 \
                                  return ::strata::Annotate(s, ::strata::StrCat(__VA_ARGS__)); \
                                })
