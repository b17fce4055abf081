#include "common/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "common/strings.h"

namespace strata {

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok() || context.empty()) return status;
  absl::Status annotated(status.code(), StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    annotated.SetPayload(type_url, payload);
  });
  return annotated;
}

absl::Status ErrnoToStatus(int err, std::string_view context) {
  absl::StatusCode code;
  switch (err) {
    case 0:
      return absl::OkStatus();
    case ENOENT:
    case ENXIO:
    case ENODEV:
      code = absl::StatusCode::kNotFound;
      break;
    case EEXIST:
      code = absl::StatusCode::kAlreadyExists;
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
    case ENOTDIR:
    case EBADF:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case EIO:
      code = absl::StatusCode::kDataLoss;
      break;
    case EAGAIN:
    case EINTR:
    case EBUSY:
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ENETDOWN:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENOTCONN:
      code = absl::StatusCode::kUnavailable;
      break;
    case ETIMEDOUT:
      code = absl::StatusCode::kDeadlineExceeded;
      break;
    case EOPNOTSUPP:
    case ENOSYS:
      code = absl::StatusCode::kUnimplemented;
      break;
    default:
      code = absl::StatusCode::kUnknown;
  }
  char buf[128];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  if (context.empty()) return absl::Status(code, text);
  return absl::Status(code, StrCat(context, ": ", text));
}

bool IsRetryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

}  // namespace strata
