#include "common/scratch_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace strata {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      ::unsetenv(name_);
    } else {
      ::setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(ScratchDirTest, MakesAFreshPrivateDirAndRemovesTheWholeTree) {
  std::string path;
  {
    absl::StatusOr<ScratchDir> dir = ScratchDir::Create("scratch-test-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    path = dir->path();
    EXPECT_EQ(fs::path(path).parent_path(), fs::temp_directory_path());
    EXPECT_EQ(fs::path(path).filename().string().rfind("scratch-test-", 0), 0u);
    EXPECT_EQ(fs::status(path).permissions(), fs::perms::owner_all);
    fs::create_directories(path + "/a/b");
    std::ofstream(path + "/a/b/file") << "bytes";

    absl::StatusOr<ScratchDir> other = ScratchDir::Create("scratch-test-");
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->path(), path);
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(ScratchDirTest, MovesHandOverTheDirectoryAndReleaseKeepsIt) {
  absl::StatusOr<ScratchDir> made = ScratchDir::Create("scratch-test-");
  ASSERT_TRUE(made.ok());
  const std::string path = made->path();
  ScratchDir moved = std::move(*made);
  EXPECT_TRUE(made->path().empty());
  EXPECT_EQ(moved.path(), path);
  {
    absl::StatusOr<ScratchDir> second = ScratchDir::Create("scratch-test-");
    ASSERT_TRUE(second.ok());
    const std::string second_path = second->path();
    *second = std::move(moved);  // the directory `second` held goes away now
    EXPECT_FALSE(fs::exists(second_path));
    EXPECT_EQ(second->path(), path);
    EXPECT_TRUE(fs::exists(path));
    EXPECT_EQ(second->Release(), path);
  }
  EXPECT_TRUE(fs::exists(path));  // released: the caller's now
  fs::remove_all(path);
}

TEST(ScratchDirTest, AMissingTempDirIsAClearError) {
  ScopedEnv tmpdir("TMPDIR", "/nonexistent/strata-tmp");
  absl::StatusOr<ScratchDir> dir = ScratchDir::Create("scratch-test-");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("temp"), std::string::npos) << dir.status();
}

// The test main runs every test binary in a scratch dir of its own: TempDir() and $TMPDIR.
TEST(ScratchDirTest, TestsRunInTheirOwnTempDir) {
  const std::string tmp = testing::TempDir();
  EXPECT_NE(tmp.find("/strata-test-"), std::string::npos) << tmp;
  EXPECT_EQ(fs::path(tmp).lexically_normal(), fs::temp_directory_path() / "");
  std::ofstream(tmp + "/left-behind") << "the test main removes this";
}

// Runs this binary's TestsRunInTheirOwnTempDir with TMPDIR in a fresh dir: the child leaves a
// file in its TempDir(), and the test main removes its scratch dir when the tests end.
TEST(ScratchDirTest, TheTestMainLeavesNothingBehind) {
  absl::StatusOr<ScratchDir> parent = ScratchDir::Create("scratch-test-parent-");
  ASSERT_TRUE(parent.ok());
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string cmd = "env -u TEST_TMPDIR TMPDIR=" + parent->path() + " " + self +
                          " --gtest_filter=ScratchDirTest.TestsRunInTheirOwnTempDir >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(fs::is_empty(parent->path()));
}

}  // namespace
}  // namespace strata
