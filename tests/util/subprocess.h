// Running commands from tests: the `strata` binary as a user runs it, and external tools
// (promtool, node). Header-only; tests include it as "tests/util/subprocess.h".
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace strata::testing_util {

struct CommandResult {
  int exit_code = -1;  // -1 when the command did not exit normally
  std::string output;
};

enum class Stderr { kMerge, kDiscard };

// Runs `command` through /bin/sh and captures its standard output (and standard error, merged,
// unless discarded).
inline CommandResult RunCommand(const std::string& command, Stderr err = Stderr::kMerge) {
  const std::string full = command + (err == Stderr::kMerge ? " 2>&1" : " 2>/dev/null");
  CommandResult result;
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// The `strata` binary of this build ($STRATA_BINARY_DIR is set by CTest).
inline std::string StrataBinaryPath() {
  const char* dir = std::getenv("STRATA_BINARY_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/cli/strata";
}

inline CommandResult RunStrata(const std::string& args, Stderr err = Stderr::kMerge) {
  return RunCommand(StrataBinaryPath() + " " + args, err);
}

}  // namespace strata::testing_util
