// The `strata` binary as a user runs it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/util/subprocess.h"

namespace {

struct Result {
  int exit_code;
  std::string output;
};

Result RunStrata(const std::string& args) {
  const char* dir = std::getenv("STRATA_BINARY_DIR");
  const std::string cmd = std::string(dir ? dir : ".") + "/cli/strata " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[1024];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(StrataCliTest, VersionAndHelp) {
  const Result v = RunStrata("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.output.rfind("strata ", 0), 0u) << v.output;
  const Result h = RunStrata("--help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.output.find("config"), std::string::npos);
  EXPECT_NE(RunStrata("").exit_code, 0);  // a subcommand is required
  EXPECT_NE(RunStrata("no-such-command").exit_code, 0);
}

TEST(StrataCliTest, ConfigPrintShowsPrecedence) {
  const std::string path = testing::TempDir() + "/strata_cli_test.yaml";
  std::ofstream(path) << "log:\n  level: debug\n  format: json\ncluster:\n  name: from-file\n";
  const Result r = RunStrata("config print --config " + path + " --set cluster.name=from-flag");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("level: debug"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("name: from-flag"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(flag)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(file)"), std::string::npos) << r.output;

  const Result plain = RunStrata("config print --no-comments");
  EXPECT_EQ(plain.exit_code, 0);
  EXPECT_EQ(plain.output.find("#"), std::string::npos) << plain.output;
  const Result e = [] {
    setenv("STRATA_LOG_LEVEL", "warn", 1);
    Result r = RunStrata("config print");
    unsetenv("STRATA_LOG_LEVEL");
    return r;
  }();
  EXPECT_NE(e.output.find("level: warn"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("(env)"), std::string::npos) << e.output;
}

TEST(StrataCliTest, ConfigErrorsExitNonZeroWithAMessage) {
  const Result r = RunStrata("config print --set log.levl=debug");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("did you mean 'log.level'"), std::string::npos) << r.output;
  const Result bad = RunStrata("config print --set log.level=loud");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(RunStrata("config print --config /nonexistent.yaml").exit_code, 0);
}

TEST(StrataCliTest, InfoDescribesTheBuild) {
  const Result r = RunStrata("info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cuda:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gpus:"), std::string::npos) << r.output;
}

}  // namespace
