// Runs the real `strata cache` daemon as a child process for tests (small slots, write_through,
// ports chosen by the OS, ready when it has written its ready file).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/util/child_process.h"

namespace strata::cache::testing_util {

inline std::string StrataBinary() {
  return std::string(std::getenv("STRATA_BINARY_DIR")) + "/cli/strata";
}

class Daemon {
 public:
  Daemon(std::string dir, std::string token_file, std::vector<std::string> extra = {})
      : dir_(std::move(dir)), token_file_(std::move(token_file)), extra_(std::move(extra)) {}
  ~Daemon() { Kill(); }

  void Start() {
    std::vector<std::string> args = {StrataBinary(), "cache",
                                     "--set",        "cache.listen=127.0.0.1:0",
                                     "--set",        "cache.http_listen=",
                                     "--set",        "cache.transfer_listen=",
                                     "--set",        "cache.data_dir=" + dir_,
                                     "--set",        "cache.slot_bytes=8KiB",
                                     "--set",        "cache.dram.capacity=4MiB",
                                     "--set",        "cache.ssd.capacity=256MiB",
                                     "--set",        "cache.ssd.slots_per_file=4096",
                                     "--set",        "cache.write_policy=write_through",
                                     "--set",        "cluster.admin_token_file=" + token_file_,
                                     "--set",        "log.level=warn"};
    for (const auto& e : extra_) {
      args.push_back("--set");
      args.push_back(e);
    }
    child_.Start(std::move(args), dir_ + "/ready");
  }

  void Kill() { child_.Kill(); }

  const std::string& address() const { return child_.grpc_address(); }

 private:
  std::string dir_;
  std::string token_file_;
  std::vector<std::string> extra_;
  strata::testing_util::ChildProcess child_;
};

}  // namespace strata::cache::testing_util
