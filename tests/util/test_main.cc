// main() of every test binary: Google Test in a scratch directory of its own.
//
// testing::TempDir() is $TEST_TMPDIR; this points it, and $TMPDIR (for the processes the tests
// start and std::filesystem::temp_directory_path), at a fresh <$TMPDIR>/strata-test-XXXXXX that
// is removed when the tests end, so the stores, sockets and models tests make never pile up.
// STRATA_KEEP_TEST_TMPDIR=1 keeps it after a failed run, to look at.
#include <cstdlib>
#include <iostream>

#include "common/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  absl::StatusOr<strata::ScratchDir> scratch = strata::ScratchDir::Create("strata-test-");
  if (!scratch.ok()) {
    std::cerr << "test main: " << scratch.status() << "\n";
    return 1;
  }
  ::setenv("TEST_TMPDIR", scratch->path().c_str(), /*overwrite=*/1);
  ::setenv("TMPDIR", scratch->path().c_str(), /*overwrite=*/1);
  const int rc = RUN_ALL_TESTS();
  const char* keep = std::getenv("STRATA_KEEP_TEST_TMPDIR");
  if (rc != 0 && keep != nullptr && std::string_view(keep) == "1") {
    std::cerr << "test main: kept " << scratch->Release() << "\n";
  }
  return rc;
}
