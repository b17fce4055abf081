// The whole system as a user meets it: `strata up` starts a cluster (cache server, scheduler,
// one prefill and two decode workers, a random `tiny` model) and every check goes through its
// OpenAI API, the `strata chat` / `strata admin` commands, and signals to its processes.
//
// One cluster serves the suite; the tests run in order and each uses its own cache_salt (tenant),
// so their blocks never mix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "nlohmann/json.hpp"
#include "scheduler/client/openai_client.h"
#include "tests/util/http_get.h"
#include "tests/util/subprocess.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_util::RunStrata;
using testing_util::StrataBinaryPath;

// About 1,000 tokens of system prompt: most of a chat turn's prompt.
std::string SystemPrompt(const std::string& topic) {
  std::string text = "You are the assistant of " + topic + ". ";
  for (int i = 0; i < 80; ++i) {
    text += "Rule " + std::to_string(i) + ": answer briefly and cite the cached context. ";
  }
  return text;
}

class UpClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Normalized: `up` names its files by the absolute, normal path of the run directory.
    dir_ = new std::string(fs::path(::testing::TempDir() + "/up_e2e").lexically_normal());
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::string ready = *dir_ + "/up.ready";
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const int out = ::open((*dir_ + "/up.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      std::vector<std::string> args = {
          StrataBinaryPath(), "up", "--ready-file", ready, "--set", "up.run_dir=" + *dir_ + "/run",
          "--set", "up.model=tiny", "--set", "up.prefill_workers=1", "--set", "up.decode_workers=2",
          "--set", "up.http_port=0", "--set", "up.max_backoff=2s", "--set",
          "cache.slot_bytes=512KiB", "--set", "cache.dram.capacity=24MiB", "--set",
          "cache.ssd.capacity=256MiB", "--set", "worker.kv_pages=192",
          // These tests are about the cache server's tiers (pins,
          // evictions, SSD after a crash): the workers' own
          // resident blocks would serve the repeats instead.
          "--set", "worker.resident_blocks=false", "--set", "scheduler.heartbeat_interval=500ms"};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 1800 && !fs::exists(ready); ++i) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid_, &status, WNOHANG), 0) << "strata up exited: " << UpOutput();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(fs::exists(ready)) << "strata up never became ready: " << UpOutput();
    std::ifstream in(ready);
    std::string url, config;
    in >> url >> config;
    url_ = new std::string(url.substr(4));
    config_ = new std::string(config.substr(7));
  }

  static void TearDownTestSuite() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);  // stops every daemon in order
      int status = 0;
      ::waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << UpOutput();
      EXPECT_NE(UpOutput().find("stopped cache"), std::string::npos) << UpOutput();
    }
  }

  static std::string UpOutput() { return ReadFile(*dir_ + "/up.out").value_or("(none)"); }

  static scheduler::OpenAiClient Client() {
    auto endpoint = scheduler::ParseOpenAiUrl(*url_);
    EXPECT_TRUE(endpoint.ok());
    endpoint->timeout = absl::Seconds(120);
    return scheduler::OpenAiClient(*endpoint);
  }

  // A greedy, non-streamed chat completion; fails the test on any error.
  static json Chat(const std::string& salt, const json& messages, int max_tokens = 12) {
    scheduler::OpenAiClient client = Client();
    json body = {{"model", "tiny"},
                 {"messages", messages},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"cache_salt", salt}};
    auto reply = client.Post("/v1/chat/completions", body);
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return json::object();
    EXPECT_EQ(reply->status, 200) << reply->body;
    return json::parse(reply->body, nullptr, false);
  }
  static int64_t Cached(const json& reply, const char* tier = nullptr) {
    const json& usage = reply.value("usage", json::object());
    if (tier == nullptr) {
      return usage.value("prompt_tokens_details", json::object()).value("cached_tokens", 0);
    }
    return usage.value("strata", json::object())
        .value("cached_tokens_by_tier", json::object())
        .value(tier, 0);
  }
  // Prompt tokens a repeat of `reply`'s request finds cached at least: its full blocks but the
  // last (a prompt that fills its last block still computes that block's final token).
  static int64_t RepeatCached(const json& reply) {
    return (reply["usage"].value("prompt_tokens", 0) / 64 - 1) * 64;
  }
  static std::string Text(const json& reply) {
    return reply["choices"][0]["message"].value("content", "");
  }

  // `strata admin <service> --config <cluster.yaml> <rest>`; stdout only (JSON stays parseable).
  static testing_util::CommandResult Admin(const std::string& args) {
    return RunStrata("admin " + args.substr(0, args.find(' ')) + " --config " + *config_ +
                         args.substr(args.find(' ')),
                     testing_util::Stderr::kDiscard);
  }

  // The pid and command line of the daemon `name` that `strata up` runs (its --ready-file names
  // it); -1 when it is not running.
  static std::pair<pid_t, std::string> Daemon(const std::string& name) {
    const std::string ready = *dir_ + "/run/ready/" + name;
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string pid = entry.path().filename();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "cmdline");
      std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      if (cmdline.find(" " + ready + " ") != std::string::npos) return {std::stoi(pid), cmdline};
    }
    return {-1, ""};
  }
  static pid_t DaemonPid(const std::string& name) { return Daemon(name).first; }

  // Requests a worker is running now, from its own /metrics (live, unlike heartbeats).
  static int RunningOn(const std::string& worker) {
    const std::string cmdline = Daemon(worker).second;
    const std::string key = "worker.http_listen=127.0.0.1:";
    const size_t at = cmdline.find(key);
    if (at == std::string::npos) return 0;
    const std::string metrics =
        testing_util::HttpGet(std::stoi(cmdline.substr(at + key.size())), "/metrics");
    const std::string gauge = "\nstrata_worker_running_requests ";
    const size_t g = metrics.find(gauge);
    return g == std::string::npos ? 0 : std::stoi(metrics.substr(g + gauge.size()));
  }

  // Waits until `up` has restarted `name` (a new pid, its ready file written again).
  static pid_t WaitRestarted(const std::string& name, pid_t old) {
    for (int i = 0; i < 600; ++i) {
      const pid_t now = DaemonPid(name);
      if (now > 0 && now != old && fs::exists(*dir_ + "/run/ready/" + name)) return now;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }

  static json Nodes() {
    testing_util::CommandResult r = Admin("scheduler nodes --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(r.output, nullptr, false);
  }

  static inline std::string* dir_ = nullptr;
  static inline std::string* url_ = nullptr;
  static inline std::string* config_ = nullptr;
  static inline pid_t pid_ = -1;
};

TEST_F(UpClusterTest, ChatTurnTwoIsMostlyCachedAndAnswersAsAColdRun) {
  // The demo's client: two turns, the second carrying the first's question and answer.
  const std::string system_file = *dir_ + "/system.txt";
  std::ofstream(system_file) << SystemPrompt("a chat platform");
  const std::string turns = *dir_ + "/turns.json";
  testing_util::CommandResult r =
      RunStrata("chat --url " + *url_ + " --system-file " + system_file +
                " --say 'What is cached?' --say 'And on turn two?' --max-tokens 12 "
                "--cache-salt demo --json-out " +
                turns);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TTFT"), std::string::npos) << r.output;
  const json log = json::parse(*ReadFile(turns));
  ASSERT_EQ(log.size(), 2u);
  const int64_t prompt = log[1]["prompt_tokens"];
  const int64_t cached = log[1]["cached_tokens"];
  EXPECT_GT(prompt, 900);
  EXPECT_GE(cached, prompt * 8 / 10) << "turn 2 should find most of its prompt cached";

  // The same second turn in a tenant that has nothing cached: computed from scratch, and the
  // answer must not depend on where the prefix came from.
  const json cold =
      Chat("cold-tenant", {{{"role", "system"}, {"content", SystemPrompt("a chat platform")}},
                           {{"role", "user"}, {"content", "What is cached?"}},
                           {{"role", "assistant"}, {"content", log[0]["text"]}},
                           {{"role", "user"}, {"content", "And on turn two?"}}});
  EXPECT_EQ(Cached(cold), 0);
  EXPECT_EQ(cold["usage"].value("prompt_tokens", 0), prompt);
  EXPECT_EQ(Text(cold), log[1]["text"].get<std::string>());
}

TEST_F(UpClusterTest, PinHoldsUnderEvictionPressureAndEvictingATenantMakesItMiss) {
  const json messages = {{{"role", "system"}, {"content", SystemPrompt("the pinned tenant")}},
                         {{"role", "user"}, {"content", "hello"}}};
  const json first = Chat("pinned", messages);
  const int64_t full = RepeatCached(first);
  ASSERT_GT(full, 10 * 64);
  Chat("control", messages);
  testing_util::CommandResult pin = Admin("cache pin --tenant pinned");
  ASSERT_EQ(pin.exit_code, 0) << pin.output;

  // Pressure: other tenants write far more than the 24 MiB (48-slot) DRAM tier holds.
  for (int i = 0; i < 8; ++i) Chat("pressure-" + std::to_string(i), messages);

  const json pinned = Chat("pinned", messages);
  const json control = Chat("control", messages);
  EXPECT_GE(Cached(pinned, "dram"), full) << pinned.dump();  // still in DRAM
  EXPECT_LT(Cached(control, "dram"), Cached(pinned, "dram"))
      << "the pressure should have pushed the unpinned tenant out of DRAM: " << control.dump();

  testing_util::CommandResult evict = Admin("cache evict --tenant control");
  ASSERT_EQ(evict.exit_code, 0) << evict.output;
  EXPECT_EQ(Cached(Chat("control", messages)), 0);
  EXPECT_GE(Cached(Chat("pinned", messages)), full);  // other tenants keep theirs
}

TEST_F(UpClusterTest, FlushedBlocksAreServedFromSsdAfterTheCacheServerRestarts) {
  const json messages = {{{"role", "system"}, {"content", SystemPrompt("maintenance")}},
                         {{"role", "user"}, {"content", "before the restart"}}};
  const int64_t full = RepeatCached(Chat("flush", messages));
  testing_util::CommandResult flush = Admin("cache flush");
  ASSERT_EQ(flush.exit_code, 0) << flush.output;

  const pid_t cache = DaemonPid("cache");
  ASSERT_GT(cache, 0);
  ::kill(cache, SIGKILL);  // a crash: only what is on SSD survives
  ASSERT_GT(WaitRestarted("cache", cache), 0) << UpOutput();

  // The workers reconnect on their next fetch; the first request may race the restart.
  json again = json::object();
  for (int i = 0; i < 20 && Cached(again, "ssd") == 0; ++i) {
    again = Chat("flush", messages);
    if (Cached(again, "ssd") == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_GE(Cached(again, "ssd"), full) << again.dump();
  EXPECT_NE(UpOutput().find("restarted cache"), std::string::npos);
}

TEST_F(UpClusterTest, AKilledDecodeWorkerIsResumedElsewhereAndRestarted) {
  scheduler::OpenAiClient client = Client();
  json body = {
      {"model", "tiny"},       {"messages", {{{"role", "user"}, {"content", "Tell a long story"}}}},
      {"max_tokens", 400},     {"temperature", 0},
      {"stream", true},        {"stream_options", {{"include_usage", true}}},
      {"cache_salt", "resume"}};
  std::string text, error, last_event, text_at_kill;
  int64_t completion_tokens = 0;
  pid_t victim = -1;
  bool searched = false;
  std::string victim_name;
  auto reply = client.PostStream("/v1/chat/completions", body, [&](const json& event) {
    if (event.contains("error")) error = event.dump();
    last_event = event.dump();
    if (event.contains("usage") && event["usage"].is_object()) {
      completion_tokens = event["usage"].value("completion_tokens", 0);
    }
    if (!event.contains("choices") || event["choices"].empty()) return true;
    text += event["choices"][0].value("delta", json::object()).value("content", "");
    if (!searched && text.size() > 20) {
      searched = true;
      // Mid-stream: kill the decode worker that is running it.
      for (const std::string name : {"decode-0", "decode-1"}) {
        if (RunningOn(name) > 0) {
          victim_name = name;
          victim = DaemonPid(name);
        }
      }
      if (victim > 0) ::kill(victim, SIGKILL);
      text_at_kill = text;
    }
    return true;
  });
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_GT(victim, 0) << "no decode worker reported the request as running";
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(error, "") << "the client should see one uninterrupted answer";
  // The answer before the failure is the uninterrupted run's, and nothing is repeated after it.
  // (Past the failure point greedy tokens may differ: the resumed tokens' KV is recomputed by a
  // prefill pass, whose accumulation order differs from the decode steps that first made it.)
  const json reference = Chat("resume-reference", body["messages"], 1200);
  ASSERT_GE(text.size(), text_at_kill.size());
  EXPECT_EQ(text.substr(0, text_at_kill.size()), text_at_kill);
  EXPECT_EQ(Text(reference).substr(0, text_at_kill.size()), text_at_kill);
  EXPECT_GT(completion_tokens, 0) << last_event;
  EXPECT_LE(completion_tokens, 1200);
  EXPECT_TRUE(last_event.find("\"usage\"") != std::string::npos) << last_event;

  // `up` brings the worker back, it registers again, and the cluster keeps serving.
  ASSERT_GT(WaitRestarted(victim_name, victim), 0) << UpOutput();
  bool alive = false;
  for (int i = 0; i < 100 && !alive; ++i) {
    const json nodes = Nodes();  // (a temporary's ["nodes"] would dangle in the loop)
    for (const json& node : nodes["nodes"]) {
      alive |= node["node"].value("nodeId", "") == victim_name && node.value("alive", false);
    }
    if (!alive) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(alive) << victim_name << " did not register again";
  EXPECT_FALSE(Text(Chat("resume", {{{"role", "user"}, {"content", "still there?"}}})).empty());
}

TEST_F(UpClusterTest, TwoHundredConcurrentStreamingChatsComplete) {
  constexpr int kChats = 200;
  std::atomic<int> ok{0};
  std::vector<std::string> failures(kChats);
  std::vector<std::thread> threads;
  for (int i = 0; i < kChats; ++i) {
    threads.emplace_back([&, i] {
      scheduler::OpenAiClient client = Client();
      json body = {{"model", "tiny"},
                   {"messages",
                    {{{"role", "system"}, {"content", "You are a concise assistant."}},
                     {{"role", "user"}, {"content", "Question number " + std::to_string(i)}}}},
                   {"max_tokens", 8},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      bool finished = false;
      auto reply = client.PostStream("/v1/chat/completions", body, [&](const json& event) {
        if (event.contains("error")) failures[i] = event.dump();
        if (event.contains("choices") && !event["choices"].empty() &&
            !event["choices"][0]["finish_reason"].is_null()) {
          finished = true;
        }
        return true;
      });
      if (!reply.ok()) {
        failures[i] = std::string(reply.status().message());
      } else if (reply->status != 200) {
        failures[i] = reply->body;
      } else if (finished && failures[i].empty()) {
        ok.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kChats; ++i) EXPECT_EQ(failures[i], "") << "chat " << i;
  EXPECT_EQ(ok.load(), kChats);
}

}  // namespace
}  // namespace strata
