#include "common/scratch_dir.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "common/strings.h"

namespace strata {

absl::StatusOr<ScratchDir> ScratchDir::Create(std::string_view prefix) {
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) return absl::FailedPreconditionError(StrCat("no temp directory: ", ec.message()));
  std::string name = (base / StrCat(prefix, "XXXXXX")).string();
  if (::mkdtemp(name.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, StrCat("creating a scratch directory ", name));
  }
  return ScratchDir(std::move(name));
}

ScratchDir::ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}

ScratchDir& ScratchDir::operator=(ScratchDir&& other) noexcept {
  if (this != &other) {
    ScratchDir old(std::move(*this));
    path_ = std::exchange(other.path_, {});
  }
  return *this;
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ScratchDir::Release() { return std::exchange(path_, {}); }

}  // namespace strata
