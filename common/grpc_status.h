// absl::Status <-> grpc::Status. The codes are the same numbers; messages pass through.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace strata {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace strata
