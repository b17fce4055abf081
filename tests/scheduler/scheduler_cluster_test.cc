// The serving path as a user runs it: `strata cache` and two `strata worker` processes on
// loopback, registered with a SchedulerServer (the object behind `strata scheduler`, in process so
// the test can look at its index and retry counter); requests enter through the OpenAI HTTP API.
// The `strata scheduler` command itself is started as a process in CommandServes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/paths.h"
#include "compute_nodes/model/make_random.h"
#include "nlohmann/json.hpp"
#include "scheduler/server/scheduler_server.h"
#include "tests/scheduler/http_test_client.h"
#include "tests/util/child_process.h"
#include "tests/util/http_get.h"
#include "tests/util/subprocess.h"

namespace strata::scheduler {
namespace {

using testing_util::ChildProcess;
using Json = nlohmann::json;

class SchedulerClusterTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = testing::TempDir() + "/scheduler_cluster_" + name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    model_dir_ = Model();
    ASSERT_TRUE(std::filesystem::exists(model_dir_ + "/tokenizer.json"))
        << "the random checkpoint has no tokenizer (npm tokenizer package missing?)";
  }

  // One checkpoint for the whole suite; its directory name is the model id.
  static std::string Model() {
    static std::string dir;
    if (!dir.empty()) return dir;
    const std::string path = testing::TempDir() + "/scheduler_cluster_models/strata-tiny";
    model::MakeRandomOptions o;
    o.seed = 11;
    EXPECT_TRUE(model::MakeRandomCheckpoint(*model::PresetConfig("tiny"), o, path).ok());
    dir = path;
    return dir;
  }

  std::unique_ptr<ChildProcess> StartCache() {
    auto p = std::make_unique<ChildProcess>();
    const std::string data = dir_ + "/cache";
    std::filesystem::create_directories(data);
    p->Start({testing_util::StrataBinaryPath(), "cache", "--set", "cache.listen=127.0.0.1:0",
              "--set", "cache.http_listen=", "--set", "cache.transfer_listen=127.0.0.1:0", "--set",
              "cache.data_dir=" + data, "--set", "cache.slot_bytes=512KiB", "--set",
              "cache.dram.capacity=96MiB", "--set", "log.level=warn"},
             data + "/ready");
    return p;
  }

  // `http`: serve /metrics on a loopback port (ChildProcess::http_port()).
  std::unique_ptr<ChildProcess> StartWorker(const std::string& name, const std::string& role,
                                            const std::string& cache_address,
                                            const std::string& scheduler_address,
                                            bool http = false) {
    auto p = std::make_unique<ChildProcess>();
    p->Start({testing_util::StrataBinaryPath(), "worker", "--role", role, "--model", model_dir_,
              "--set", "worker.node_id=" + name, "--set", "worker.listen=127.0.0.1:0", "--set",
              std::string("worker.http_listen=") + (http ? "127.0.0.1:0" : ""), "--set",
              "worker.cache_address=" + cache_address, "--set",
              "worker.scheduler_address=" + scheduler_address, "--set", "log.level=warn"},
             dir_ + "/" + name + ".ready");
    return p;
  }

  // Waits until no node has work the scheduler placed or a heartbeat reported.
  static bool WaitForIdle(SchedulerServer& server) {
    for (int i = 0; i < 600; ++i) {
      bool idle = true;
      for (const NodeView& v : server.scheduler().load().Snapshot()) {
        idle = idle && v.outstanding.decode_requests == 0 && v.outstanding.prefill_requests == 0 &&
               v.load.running_requests == 0 && v.load.decode_batch_size == 0 &&
               v.load.running_tokens == 0;
      }
      if (idle) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::unique_ptr<SchedulerServer> StartScheduler(const std::string& policy,
                                                  int missed_heartbeats = 5) {
    SchedulerServerOptions o;
    o.model_dir = model_dir_;
    o.scheduler.policy = policy;
    o.scheduler.heartbeat_interval = absl::Milliseconds(500);
    o.scheduler.missed_heartbeats_limit = missed_heartbeats;
    auto server = std::make_unique<SchedulerServer>(o);
    absl::Status st = server->Start();
    EXPECT_TRUE(st.ok()) << st;
    return server;
  }

  // Waits until `n` workers are registered and alive.
  static bool WaitForNodes(SchedulerServer& server, size_t n) {
    for (int i = 0; i < 600; ++i) {
      size_t alive = 0;
      for (const NodeView& v : server.scheduler().load().Snapshot()) alive += v.alive ? 1 : 0;
      if (alive >= n && server.directory().All().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  static testing_http::Reply Post(uint16_t port, const std::string& path, const Json& body) {
    testing_http::Client client(port);
    return client.Send("POST", path, body.dump());
  }

  static Json Completion(const std::string& prompt, int max_tokens) {
    return Json{{"model", "strata-tiny"},
                {"prompt", prompt},
                {"max_tokens", max_tokens},
                {"temperature", 0}};
  }

  // A prompt of several 64-token blocks: a long shared prefix, then `suffix`.
  static std::string LongPrompt(const std::string& suffix) {
    std::string s;
    for (int i = 0; i < 60; ++i) s += "The scheduler places every request near its cached prefix. ";
    return s + suffix;
  }

  std::string dir_;
  std::string model_dir_;
};

TEST_F(SchedulerClusterTest, DisaggregatedServingWithCacheHits) {
  auto cache = StartCache();
  auto server = StartScheduler("strata");
  const std::string sched = "127.0.0.1:" + std::to_string(server->grpc_port());
  auto prefill = StartWorker("prefill-0", "prefill", cache->grpc_address(), sched);
  auto decode = StartWorker("decode-0", "decode", cache->grpc_address(), sched);
  ASSERT_TRUE(WaitForNodes(*server, 2));
  const uint16_t port = static_cast<uint16_t>(server->http_port());

  // /v1/models lists the model directory's name.
  {
    testing_http::Client client(port);
    const auto reply = client.Send("GET", "/v1/models");
    ASSERT_EQ(reply.status, 200) << reply.body;
    EXPECT_EQ(Json::parse(reply.body)["data"][0]["id"], "strata-tiny");
  }

  // The official OpenAI client: streaming chat, non-streaming completion.
  const std::string npm = NpmDir();
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "STRATA_SOURCE_DIR is not set (run through ctest)";
  ASSERT_TRUE(std::filesystem::exists(npm + "/node_modules/openai/package.json")) << npm;
  const std::string command = std::string("node ") + source +
                              "/tests/scheduler/scheduler_cluster_check.cjs '" + npm +
                              "' http://127.0.0.1:" + std::to_string(port) + "/v1 strata-tiny 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) output += buf.data();
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("cluster client checks passed"), std::string::npos) << output;

  // A long prompt, then (once its blocks are in the cache and the index knows) another one
  // sharing its prefix: the second reports cached tokens.
  auto first = Post(port, "/v1/completions", Completion(LongPrompt("First question?"), 4));
  ASSERT_EQ(first.status, 200) << first.body;
  const Json first_json = Json::parse(first.body);
  EXPECT_FALSE(first_json["choices"][0]["text"].get<std::string>().empty());
  EXPECT_EQ(first_json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  bool indexed = false;
  for (int i = 0; i < 300 && !indexed; ++i) {
    indexed = server->scheduler().index().Stats().indexed_blocks >= 4;
    if (!indexed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(indexed) << "the cache server's Stored events never reached the index";
  // Both workers use that cache server, so both hold the prefix.
  for (const WorkerNode& n : server->directory().All()) {
    EXPECT_GE(server->scheduler().index().BlocksHeldBy(n.index), 4u) << n.id;
  }
  auto second = Post(port, "/v1/completions", Completion(LongPrompt("Second question!"), 4));
  ASSERT_EQ(second.status, 200) << second.body;
  const Json second_json = Json::parse(second.body);
  EXPECT_GT(second_json["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << second.body;

  // Another tenant (cache_salt) shares nothing.
  Json salted = Completion(LongPrompt("Second question!"), 4);
  salted["cache_salt"] = "tenant-b";
  auto third = Post(port, "/v1/completions", salted);
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(Json::parse(third.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
      << third.body;
  EXPECT_EQ(server->backend()->retries(), 0u);
}

// Two workers on one cache server both hold a prefix the cache server has; the one that served
// it also holds it in its own KV pool (resident blocks, published as its GPU tier), so the
// scheduler sends the follow-up there and nothing is fetched: every repeat is a GPU hit.
TEST_F(SchedulerClusterTest, FollowUpsGoToTheWorkerWhosePoolHoldsThePrefix) {
  auto cache = StartCache();
  auto server = StartScheduler("strata");
  const std::string sched = "127.0.0.1:" + std::to_string(server->grpc_port());
  auto a = StartWorker("both-a", "both", cache->grpc_address(), sched);
  auto b = StartWorker("both-b", "both", cache->grpc_address(), sched);
  ASSERT_TRUE(WaitForNodes(*server, 2));
  const uint16_t port = static_cast<uint16_t>(server->http_port());
  // Four topics that share no block: each one's first request lands on either worker, and only
  // that worker's pool has it (random placement would find it 1 time in 16).
  for (int topic = 0; topic < 4; ++topic) {
    const std::string prefix = "Topic " + std::to_string(topic) + ". ";
    auto first = Post(port, "/v1/completions", Completion(prefix + LongPrompt("First?"), 2));
    ASSERT_EQ(first.status, 200) << first.body;
    // The DRAM copies count for both workers, the GPU copies for one: wait until the index has
    // the GPU copies too (3 holders per block of this prompt at least).
    bool published = false;
    for (int i = 0; i < 300 && !published; ++i) {
      const PrefixIndexStats st = server->scheduler().index().Stats();
      published = st.holders >= 3 * st.indexed_blocks && st.indexed_blocks > 0;
      if (!published) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(published) << "the worker's resident blocks never reached the index";
    auto again = Post(port, "/v1/completions", Completion(prefix + LongPrompt("Second!"), 2));
    ASSERT_EQ(again.status, 200) << again.body;
    const Json usage = Json::parse(again.body)["usage"];
    const int cached = usage["prompt_tokens_details"]["cached_tokens"].get<int>();
    EXPECT_GT(cached, 0) << again.body;
    EXPECT_EQ(usage["strata"]["cached_tokens_by_tier"]["gpu"].get<int>(), cached) << again.body;
  }
}

// Decode placement prefers, among decode nodes within 5 % of the best predicted TBT, the one whose
// own pool holds the prompt. A long request keeps one decode node busy while a topic's first
// request arrives, so that one goes to the other node (a lower predicted TBT). Once both are idle
// they tie, and without the preference the follow-up would go to the node that won the tie
// before (the one the long request took); it must go where the topic's blocks are resident.
TEST_F(SchedulerClusterTest, DecodeFollowUpsGoWhereThePromptIsResident) {
  auto cache = StartCache();
  auto server = StartScheduler("strata");
  const std::string sched = "127.0.0.1:" + std::to_string(server->grpc_port());
  auto prefill = StartWorker("prefill-0", "prefill", cache->grpc_address(), sched);
  std::array<std::unique_ptr<ChildProcess>, 2> decode = {
      StartWorker("decode-0", "decode", cache->grpc_address(), sched, /*http=*/true),
      StartWorker("decode-1", "decode", cache->grpc_address(), sched, /*http=*/true)};
  ASSERT_TRUE(WaitForNodes(*server, 3));
  const uint16_t port = static_cast<uint16_t>(server->http_port());
  auto metric = [&](int d, const std::string& name, const std::string& labels = "") {
    return testing_util::MetricSum(decode[d]->http_port(), name, labels);
  };
  // Requests decode node d has finished, once it reaches `want` (a worker counts a request just
  // after its last chunk is sent) or after 5 s.
  auto served_by = [&](int d, double want) {
    double got = metric(d, "strata_worker_requests_total");
    for (int i = 0; i < 250 && got < want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      got = metric(d, "strata_worker_requests_total");
    }
    return got;
  };
  for (int topic = 0; topic < 2; ++topic) {
    SCOPED_TRACE("topic " + std::to_string(topic));
    ASSERT_TRUE(WaitForIdle(*server));
    const std::array<double, 2> served = {metric(0, "strata_worker_requests_total"),
                                          metric(1, "strata_worker_requests_total")};
    std::thread long_request([&] {
      auto r = Post(port, "/v1/completions",
                    Completion("Tell me a very long story, part " + std::to_string(topic), 1200));
      EXPECT_EQ(r.status, 200) << r.body;
    });
    int busy = -1;
    for (int i = 0; i < 300 && busy < 0; ++i) {
      for (int d = 0; d < 2; ++d) {
        if (metric(d, "strata_worker_running_requests") > 0) busy = d;
      }
      if (busy < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GE(busy, 0) << "the long request never started decoding";
    const int other = 1 - busy;
    const std::string prefix = "Topic " + std::to_string(topic) + ". ";
    auto first = Post(port, "/v1/completions", Completion(prefix + LongPrompt("First?"), 2));
    ASSERT_EQ(first.status, 200) << first.body;
    EXPECT_EQ(served_by(other, served[other] + 1), served[other] + 1)
        << "the idle decode node should take the first request";
    long_request.join();
    ASSERT_TRUE(WaitForIdle(*server));
    // The decode node's resident blocks reach the index within a publish interval (200 ms): wait
    // until the index has stopped changing for 600 ms (and at least 1 s).
    uint64_t holders = server->scheduler().index().Stats().holders;
    for (int i = 0, still = 0; i < 100 && (i < 5 || still < 3); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const uint64_t now = server->scheduler().index().Stats().holders;
      still = now == holders ? still + 1 : 0;
      holders = now;
    }
    const double resident_before =
        metric(other, "strata_worker_prompt_tokens_total", "source=\"resident\"");
    auto again = Post(port, "/v1/completions", Completion(prefix + LongPrompt("Second!"), 2));
    ASSERT_EQ(again.status, 200) << again.body;
    EXPECT_EQ(served_by(other, served[other] + 2), served[other] + 2)
        << "the follow-up should decode where the topic is resident";
    EXPECT_EQ(served_by(busy, served[busy] + 1), served[busy] + 1) << "the long request only";
    EXPECT_GT(metric(other, "strata_worker_prompt_tokens_total", "source=\"resident\""),
              resident_before)
        << "and take the handed-over prefix from its own pool";
  }
}

TEST_F(SchedulerClusterTest, RequestsSurviveAWorkerCrash) {
  auto cache = StartCache();
  // Liveness would take 30 missed heartbeats: the crash is found by the failed call, not by it.
  auto server = StartScheduler("round_robin", /*missed_heartbeats=*/30);
  const std::string sched = "127.0.0.1:" + std::to_string(server->grpc_port());
  auto a = StartWorker("worker-a", "both", cache->grpc_address(), sched);
  auto b = StartWorker("worker-b", "both", cache->grpc_address(), sched);
  ASSERT_TRUE(WaitForNodes(*server, 2));
  const uint16_t port = static_cast<uint16_t>(server->http_port());

  // Both serve (round robin).
  for (int i = 0; i < 2; ++i) {
    auto reply = Post(port, "/v1/completions", Completion("Hello number " + std::to_string(i), 3));
    ASSERT_EQ(reply.status, 200) << reply.body;
  }
  a->Kill(SIGKILL);
  // Round robin sends one of the next two requests to the dead worker: it is retried on b.
  for (int i = 0; i < 4; ++i) {
    Json chat{{"model", "strata-tiny"},
              {"messages", Json::array({Json{{"role", "user"}, {"content", "Are you there?"}}})},
              {"max_tokens", 3},
              {"stream", i % 2 == 0}};
    auto reply = Post(port, "/v1/chat/completions", chat);
    ASSERT_EQ(reply.status, 200) << reply.body;
    if (i % 2 == 0) {
      EXPECT_NE(reply.body.find("data: [DONE]"), std::string::npos) << reply.body;
      EXPECT_EQ(reply.body.find("\"error\""), std::string::npos) << reply.body;
    }
  }
  EXPECT_GE(server->backend()->retries(), 1u);
  for (const NodeView& v : server->scheduler().load().Snapshot()) {
    if (v.id == "worker-a") {
      EXPECT_FALSE(v.alive);
    }
  }

  // With no worker left, requests fail cleanly (503), and nothing hangs.
  b->Kill(SIGKILL);
  auto reply = Post(port, "/v1/completions", Completion("Anyone?", 2));
  EXPECT_EQ(reply.status, 503) << reply.body;
}

TEST_F(SchedulerClusterTest, CommandServes) {
  auto cache = StartCache();
  const std::string token_file = dir_ + "/admin.token";
  std::ofstream(token_file) << "tok-123\n";
  ChildProcess sched;
  sched.Start({testing_util::StrataBinaryPath(), "scheduler", "--model", model_dir_, "--set",
               "scheduler.listen=127.0.0.1:0", "--set", "scheduler.http_listen=127.0.0.1:0",
               "--set", "scheduler.heartbeat_interval=500ms", "--set",
               "cluster.admin_token_file=" + token_file, "--set", "log.level=warn"},
              dir_ + "/scheduler.ready");
  auto worker = StartWorker("worker-0", "both", cache->grpc_address(), sched.grpc_address());
  const uint16_t port = static_cast<uint16_t>(sched.http_port());
  ASSERT_GT(port, 0);
  // The worker registers right after it starts; until then the scheduler answers 503.
  testing_http::Reply reply;
  for (int i = 0; i < 300; ++i) {
    reply = Post(port, "/v1/completions", Completion("Hello", 3));
    if (reply.status != 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_FALSE(Json::parse(reply.body)["choices"][0]["text"].get<std::string>().empty());

  // strata admin scheduler: the token is required; nodes, policy, index.
  const std::string admin =
      "admin scheduler -a " + sched.grpc_address() + " --token-file " + token_file + " ";
  auto nodes = testing_util::RunStrata(admin + "nodes --json", testing_util::Stderr::kDiscard);
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  const Json list = Json::parse(nodes.output);
  ASSERT_EQ(list["nodes"].size(), 1u) << nodes.output;
  EXPECT_EQ(list["nodes"][0]["node"]["nodeId"], "worker-0");
  EXPECT_EQ(list["nodes"][0]["alive"], true);
  EXPECT_EQ(list["policy"], "strata");
  auto policy = testing_util::RunStrata(admin + "policy --set round_robin");
  EXPECT_EQ(policy.exit_code, 0) << policy.output;
  EXPECT_NE(policy.output.find("strata -> round_robin"), std::string::npos) << policy.output;
  auto index = testing_util::RunStrata(admin + "index");
  EXPECT_EQ(index.exit_code, 0) << index.output;
  const std::string wrong = dir_ + "/wrong.token";
  std::ofstream(wrong) << "nope\n";
  auto refused = testing_util::RunStrata("admin scheduler -a " + sched.grpc_address() +
                                         " --token-file " + wrong + " nodes");
  EXPECT_EQ(refused.exit_code, 3) << refused.output;
  sched.Kill(SIGTERM);
}

}  // namespace
}  // namespace strata::scheduler
