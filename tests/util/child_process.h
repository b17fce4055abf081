// A daemon (`strata cache`, `strata worker`, ...) run as a child process by a test: started with
// --ready-file, ready once that file names its ports ("grpc=PORT http=PORT"), killed at the end.
// Header-only; tests include it as "tests/util/child_process.h".
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace strata::testing_util {

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(); }

  // Runs `args` (args[0] is the binary) with "--ready-file <ready_file>" appended and waits up to
  // `timeout` for the file. Fails the test if the child exits or never becomes ready.
  void Start(std::vector<std::string> args, const std::string& ready_file,
             std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::filesystem::remove(ready_file);
    args.push_back("--ready-file");
    args.push_back(ready_file);
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(ready_file)) {
      int status = 0;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << args[1] << " exited, status " << status;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << args[1] << " never became ready";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream in(ready_file);
    std::string grpc, http;
    in >> grpc >> http;
    ASSERT_EQ(grpc.rfind("grpc=", 0), 0u) << "bad ready file: " << grpc;
    grpc_address_ = "127.0.0.1:" + grpc.substr(5);
    if (http.rfind("http=", 0) == 0) http_port_ = std::stoi(http.substr(5));
  }

  // Sends `sig` and reaps the child (SIGKILL: a crash; SIGTERM: a clean shutdown).
  void Kill(int sig = SIGKILL) {
    if (pid_ > 0) {
      kill(pid_, sig);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  bool running() const { return pid_ > 0; }
  const std::string& grpc_address() const { return grpc_address_; }
  int http_port() const { return http_port_; }

 private:
  pid_t pid_ = -1;
  std::string grpc_address_;
  int http_port_ = 0;
};

}  // namespace strata::testing_util
