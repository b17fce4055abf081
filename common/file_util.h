// Reading whole small files (configs, JSON, secrets) with statuses that say what and where.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

// The file's bytes. NotFound / PermissionDenied / ... (from errno) naming the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// A secret or token kept in a file (cluster secret, admin token): the contents without
// surrounding whitespace. An empty secret is InvalidArgument: it would silently turn
// authentication off. `what` names the secret in errors ("cluster secret").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view what);

}  // namespace strata
