#include "common/file_util.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/status.h"
#include "common/strings.h"

namespace strata {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoToStatus(errno, StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return ErrnoToStatus(errno, StrCat("reading ", path));
  return std::move(ss).str();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view what) {
  ASSIGN_OR_RETURN_WITH(std::string text, ReadFile(path), what);
  const std::string_view secret = StripWhitespace(text);
  if (secret.empty()) return absl::InvalidArgumentError(StrCat(what, " file ", path, " is empty"));
  return std::string(secret);
}

}  // namespace strata
