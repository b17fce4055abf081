// Bearer-token checks for the admin gRPC services (cache admin, scheduler admin): a call must
// carry `authorization: Bearer <token>` with the configured token. An empty configured token
// disables admin calls (PERMISSION_DENIED); a missing or wrong token is UNAUTHENTICATED (and a
// wrong one is logged with the peer). Tokens are compared in constant time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace strata {

// `service` names the caller in messages and logs, e.g. "cache admin".
grpc::Status CheckBearerToken(const grpc::ServerContext& context, const std::string& token,
                              std::string_view service);

}  // namespace strata
