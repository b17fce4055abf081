// strata batch end to end, as a user runs it: `strata cache`, `strata scheduler` and two
// `strata worker` processes (tiny random model, CPU) on loopback, and the `strata batch` binary.
//   1. 200 chat requests sharing a ~1,000-token system prompt: all succeed, and the cache hit
//      ratio (from --summary-json) is >= 0.8, because the batch runs the shared prefix once first.
//   2. The same input into a new output: interrupted with SIGINT at ~60 lines (exit 130, a resume
//      hint), resumed and SIGKILLed at ~130 lines (a crash; maybe a torn line), resumed again:
//      the output has 200 lines and every custom_id exactly once.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "compute_nodes/model/make_random.h"
#include "nlohmann/json.hpp"
#include "tests/scheduler/http_test_client.h"
#include "tests/util/child_process.h"
#include "tests/util/subprocess.h"

namespace strata::scheduler {
namespace {

using Json = nlohmann::json;
using testing_util::ChildProcess;

constexpr int kRequests = 200;

// A `strata batch` run in the background, its stderr in a file.
class BatchProcess {
 public:
  BatchProcess(std::vector<std::string> args, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~BatchProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // The exit code, or -signal; waits up to `timeout`, then SIGKILLs (and returns -SIGKILL).
  int Wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  bool Running() {
    int status = 0;
    return pid_ > 0 && waitpid(pid_, &status, WNOHANG) == 0;
  }
  void Signal(int sig) { kill(pid_, sig); }

 private:
  pid_t pid_ = -1;
};

size_t CountLines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits until `path` has `lines` lines or the process ends (bounded).
bool WaitForLines(BatchProcess& p, const std::string& path, size_t lines) {
  for (int i = 0; i < 2400; ++i) {
    if (CountLines(path) >= lines) return true;
    if (!p.Running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

class BatchClusterTest : public testing::Test {
 protected:
  void SetUp() override {
    // The process id keeps concurrent runs (several build trees) apart.
    dir_ = testing::TempDir() + "/batch_cluster_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    model_dir_ = dir_ + "/models/strata-tiny";
    model::MakeRandomOptions o;
    o.seed = 7;
    ASSERT_TRUE(model::MakeRandomCheckpoint(*model::PresetConfig("tiny"), o, model_dir_).ok());
  }

  void StartCluster() {
    const std::string strata = testing_util::StrataBinaryPath();
    const std::string cache_dir = dir_ + "/cache";
    std::filesystem::create_directories(cache_dir);
    cache_.Start({strata, "cache", "--set", "cache.listen=127.0.0.1:0", "--set",
                  "cache.http_listen=", "--set", "cache.transfer_listen=127.0.0.1:0", "--set",
                  "cache.data_dir=" + cache_dir, "--set", "cache.slot_bytes=512KiB", "--set",
                  "cache.dram.capacity=256MiB", "--set", "log.level=warn"},
                 cache_dir + "/ready");
    scheduler_.Start({strata, "scheduler", "--model", model_dir_, "--set",
                      "scheduler.listen=127.0.0.1:0", "--set", "scheduler.http_listen=127.0.0.1:0",
                      "--set", "scheduler.heartbeat_interval=500ms", "--set", "log.level=warn"},
                     dir_ + "/scheduler.ready");
    for (const char* name : {"worker-a", "worker-b"}) {
      auto w = std::make_unique<ChildProcess>();
      w->Start(
          {strata, "worker", "--role", "both", "--model", model_dir_, "--set",
           std::string("worker.node_id=") + name, "--set", "worker.listen=127.0.0.1:0", "--set",
           "worker.http_listen=", "--set", "worker.cache_address=" + cache_.grpc_address(), "--set",
           "worker.scheduler_address=" + scheduler_.grpc_address(), "--set", "log.level=warn"},
          dir_ + "/" + name + ".ready");
      workers_.push_back(std::move(w));
    }
    // Until the workers register, the gateway answers 503.
    const uint16_t port = static_cast<uint16_t>(scheduler_.http_port());
    testing_http::Reply reply;
    for (int i = 0; i < 300; ++i) {
      testing_http::Client client(port);
      reply = client.Send(
          "POST", "/v1/completions",
          Json{{"model", "strata-tiny"}, {"prompt", "warm up"}, {"max_tokens", 1}}.dump());
      if (reply.status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(reply.status, 200) << reply.body;
    url_ = "http://127.0.0.1:" + std::to_string(port);
  }

  // 200 chat requests: one long system prompt, a short distinct question each (input order is
  // shuffled by a stride so the batch has to bring the shared prefixes together itself).
  std::string WriteInput() {
    std::string system = "You are the Strata batch assistant. Follow every rule below.\n";
    for (int i = 0; i < 70; ++i) {
      system += "Rule " + std::to_string(i) + ": answer questions about shard " +
                std::to_string(i * 7 % 97) + " briefly and cite the ledger.\n";
    }
    const std::string path = dir_ + "/in.jsonl";
    std::ofstream out(path);
    for (int k = 0; k < kRequests; ++k) {
      const int i = (k * 37) % kRequests;
      Json line = {
          {"custom_id", "q-" + std::to_string(i)},
          {"method", "POST"},
          {"url", "/v1/chat/completions"},
          {"body",
           {{"model", "strata-tiny"},
            {"messages",
             Json::array({Json{{"role", "system"}, {"content", system}},
                          Json{{"role", "user"},
                               {"content", "Question number " + std::to_string(i) + "?"}}})},
            {"max_tokens", 2},
            {"temperature", 0}}}};
      out << line.dump() << "\n";
    }
    return path;
  }

  void TearDown() override {
    // Stop the processes before their directory goes; keep it when the test failed.
    workers_.clear();
    scheduler_.Kill();
    cache_.Kill();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::vector<std::string> BatchArgs(const std::string& input, const std::string& output) {
    return {testing_util::StrataBinaryPath(),
            "batch",
            "--input",
            input,
            "--output",
            output,
            "--url",
            url_,
            "--concurrency",
            "4",
            "--progress",
            "lines",
            "--progress-interval",
            "2",
            "--summary-json",
            output + ".summary.json"};
  }

  static std::map<std::string, int> Ids(const std::string& path) {
    std::map<std::string, int> ids;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const Json j = Json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "bad output line: " << line;
      if (j.is_discarded()) continue;
      EXPECT_EQ(j["response"]["status_code"], 200) << line;
      ++ids[j["custom_id"].get<std::string>()];
    }
    return ids;
  }

  std::string dir_, model_dir_, url_;
  ChildProcess cache_, scheduler_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

TEST_F(BatchClusterTest, SharedPrefixHitsTheCacheAndInterruptedRunsResume) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string input = WriteInput();

  // 1. A whole run.
  const std::string out1 = dir_ + "/out1.jsonl";
  {
    BatchProcess batch(BatchArgs(input, out1), dir_ + "/batch1.log");
    const int code = batch.Wait(std::chrono::seconds(240));
    ASSERT_EQ(code, 0) << ReadFile(dir_ + "/batch1.log");
  }
  const std::string log1 = ReadFile(dir_ + "/batch1.log");
  EXPECT_NE(log1.find("batch done: 200 succeeded, 0 failed"), std::string::npos) << log1;
  const Json summary = Json::parse(ReadFile(out1 + ".summary.json"));
  EXPECT_EQ(summary["succeeded"], kRequests) << summary;
  EXPECT_GE(summary["prompt_tokens"].get<double>() / kRequests, 1000) << summary;
  EXPECT_GE(summary["cache_hit_ratio"].get<double>(), 0.8) << summary << "\n" << log1;
  const auto ids1 = Ids(out1);
  EXPECT_EQ(ids1.size(), size_t(kRequests));
  EXPECT_EQ(CountLines(out1), size_t(kRequests));

  // 2. Interrupted (SIGINT), crashed (SIGKILL), resumed.
  const std::string out2 = dir_ + "/out2.jsonl";
  {
    BatchProcess batch(BatchArgs(input, out2), dir_ + "/batch2a.log");
    ASSERT_TRUE(WaitForLines(batch, out2, 60)) << ReadFile(dir_ + "/batch2a.log");
    batch.Signal(SIGINT);
    const int code = batch.Wait(std::chrono::seconds(120));
    const std::string log = ReadFile(dir_ + "/batch2a.log");
    EXPECT_EQ(code, 130) << log;
    EXPECT_NE(log.find("Resume with:"), std::string::npos) << log;
    EXPECT_LT(CountLines(out2), size_t(kRequests)) << log;
    EXPECT_TRUE(Json::parse(ReadFile(out2 + ".summary.json"))["interrupted"].get<bool>());
  }
  const size_t after_sigint = CountLines(out2);
  {
    BatchProcess batch(BatchArgs(input, out2), dir_ + "/batch2b.log");
    ASSERT_TRUE(WaitForLines(batch, out2, std::max<size_t>(130, after_sigint + 20)))
        << ReadFile(dir_ + "/batch2b.log");
    batch.Signal(SIGKILL);
    EXPECT_EQ(batch.Wait(std::chrono::seconds(30)), -SIGKILL);
    EXPECT_NE(ReadFile(dir_ + "/batch2b.log").find("resuming:"), std::string::npos);
  }
  {
    BatchProcess batch(BatchArgs(input, out2), dir_ + "/batch2c.log");
    const int code = batch.Wait(std::chrono::seconds(240));
    ASSERT_EQ(code, 0) << ReadFile(dir_ + "/batch2c.log");
  }
  const auto ids2 = Ids(out2);
  EXPECT_EQ(CountLines(out2), size_t(kRequests));
  EXPECT_EQ(ids2.size(), size_t(kRequests));
  for (const auto& [id, n] : ids2) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(ids2, ids1);
  const Json summary2 = Json::parse(ReadFile(out2 + ".summary.json"));
  EXPECT_EQ(summary2["skipped"].get<int>() + summary2["succeeded"].get<int>(), kRequests)
      << summary2;
}

}  // namespace
}  // namespace strata::scheduler
