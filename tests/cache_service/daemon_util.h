// Runs the real `strata cache` daemon as a child process for tests (small slots, write_through,
// ports chosen by the OS, ready when it has written its ready file).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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
    const std::string bin = StrataBinary();
    const std::string ready = dir_ + "/ready";
    std::filesystem::remove(ready);
    std::vector<std::string> args = {bin,
                                     "cache",
                                     "--ready-file",
                                     ready,
                                     "--set",
                                     "cache.listen=127.0.0.1:0",
                                     "--set",
                                     "cache.http_listen=",
                                     "--set",
                                     "cache.transfer_listen=",
                                     "--set",
                                     "cache.data_dir=" + dir_,
                                     "--set",
                                     "cache.slot_bytes=8KiB",
                                     "--set",
                                     "cache.dram.capacity=4MiB",
                                     "--set",
                                     "cache.ssd.capacity=256MiB",
                                     "--set",
                                     "cache.ssd.slots_per_file=4096",
                                     "--set",
                                     "cache.write_policy=write_through",
                                     "--set",
                                     "cluster.admin_token_file=" + token_file_,
                                     "--set",
                                     "log.level=warn"};
    for (const auto& e : extra_) {
      args.push_back("--set");
      args.push_back(e);
    }
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 600 && !std::filesystem::exists(ready); ++i) {
      int status = 0;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "daemon exited, status " << status;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream in(ready);
    std::string grpc;
    in >> grpc;
    ASSERT_EQ(grpc.rfind("grpc=", 0), 0u) << "daemon never became ready";
    address_ = "127.0.0.1:" + grpc.substr(5);
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  const std::string& address() const { return address_; }

 private:
  std::string dir_;
  std::string token_file_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace strata::cache::testing_util
