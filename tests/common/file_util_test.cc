#include "common/file_util.h"

#include <gtest/gtest.h>

#include <fstream>

namespace strata {
namespace {

std::string Write(const std::string& name, const std::string& contents) {
  const std::string path = testing::TempDir() + "/file_util_test_" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(FileUtilTest, ReadFileReturnsBytesOrAStatusNamingThePath) {
  const std::string bytes("a\0b\nc", 5);
  EXPECT_EQ(*ReadFile(Write("bytes", bytes)), bytes);
  const auto missing = ReadFile("/nonexistent/strata.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/strata.json"), std::string::npos);
}

TEST(FileUtilTest, SecretsAreTrimmedAndNeverEmpty) {
  EXPECT_EQ(*ReadSecretFile(Write("secret", "  s3cret\r\n"), "cluster secret"), "s3cret");
  const auto empty = ReadSecretFile(Write("empty", "\n \n"), "admin token");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("admin token"), std::string::npos);
  EXPECT_EQ(ReadSecretFile("/nonexistent/token", "admin token").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata
