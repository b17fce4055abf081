#include "common/bearer_auth.h"

#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace strata {
namespace {

// Compares without an early exit, so response time does not reveal how much of a guess matched.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % (b.empty() ? 1 : b.size())];
  return diff == 0 && !b.empty();
}

}  // namespace

grpc::Status CheckBearerToken(const grpc::ServerContext& context, const std::string& token,
                              std::string_view service) {
  if (token.empty()) {
    return {grpc::StatusCode::PERMISSION_DENIED,
            StrCat(service, " calls are disabled here (no cluster.admin_token_file)")};
  }
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return {grpc::StatusCode::UNAUTHENTICATED, "missing 'authorization: Bearer <token>'"};
  }
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  if (value.substr(0, kBearer.size()) != kBearer ||
      !ConstantTimeEquals(value.substr(kBearer.size()), token)) {
    spdlog::warn("{}: call with a wrong token from {}", service, context.peer());
    return {grpc::StatusCode::UNAUTHENTICATED, "wrong admin token"};
  }
  return grpc::Status::OK;
}

}  // namespace strata
