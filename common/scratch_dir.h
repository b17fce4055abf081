// A private temporary directory that goes away, with everything in it, when its owner does.
//
//   ASSIGN_OR_RETURN(ScratchDir work, ScratchDir::Create("strata-bench-store-"));
//   options.data_dir = work.path() + "/data";
//
// Benches and test binaries put their stores, sockets and models in one, so that a run, whether
// it returns, throws or fails an assertion, leaves nothing behind in $TMPDIR.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

class ScratchDir {
 public:
  // Makes <$TMPDIR or /tmp>/<prefix>XXXXXX with mkdtemp (a fresh name, mode 0700).
  static absl::StatusOr<ScratchDir> Create(std::string_view prefix);

  ScratchDir(ScratchDir&& other) noexcept;
  ScratchDir& operator=(ScratchDir&& other) noexcept;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();  // removes the tree; errors are ignored (nothing useful to do with them)

  const std::string& path() const { return path_; }

  // Keeps the directory on disk (to look at after a failed run) and returns its path.
  std::string Release();

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;  // empty once moved from or released
};

}  // namespace strata
