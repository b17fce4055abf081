// RunBatch (strata batch's engine) against the real gateway with the scripted test backend:
// a whole run, priorities, shared-prefix ordering (cache hits), 429 retries honouring
// Retry-After, failures to the errors file and their retry on resume, resume after a torn line.
#include "scheduler/batch/batch_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "scheduler/http/gateway_server.h"
#include "tests/scheduler/scripted_test_backend.h"

namespace strata::scheduler::batch {
namespace {

using Json = nlohmann::json;
using testing_backend::ScriptedTestBackend;

// Wraps the scripted backend: records priorities, and answers 429 (Retry-After 1 s) to the first
// `reject_first` attempts of each prompt containing "FLAKY" and to every prompt containing
// "ALWAYS429" while `always_reject` is set.
class FlakyBackend : public CompletionBackend {
 public:
  std::vector<std::string> Models() const override { return inner_.Models(); }
  void Generate(const CompletionRequest& request, std::shared_ptr<CompletionSink> sink) override {
    std::string prompt = request.prompt;
    for (const ChatMessage& m : request.messages) prompt += m.content;
    bool reject = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      priorities_.push_back(request.priority);
      if (prompt.find("FLAKY") != std::string::npos) reject = attempts_[prompt]++ < reject_first;
      if (prompt.find("ALWAYS429") != std::string::npos) reject = reject || always_reject;
    }
    if (reject) {
      sink->OnDone(WithRetryAfter(absl::ResourceExhaustedError("busy, come back later"), 1),
                   FinishReason::kStop, {});
      return;
    }
    inner_.Generate(request, std::move(sink));
  }
  std::vector<int> priorities() {
    std::lock_guard<std::mutex> lock(mu_);
    return priorities_;
  }
  int attempts(const std::string& prompt) {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_[prompt];
  }
  void set_always_reject(bool v) {
    std::lock_guard<std::mutex> lock(mu_);
    always_reject = v;
  }

  int reject_first = 2;

 private:
  ScriptedTestBackend inner_;
  std::mutex mu_;
  std::vector<int> priorities_;
  std::map<std::string, int> attempts_;
  bool always_reject = true;
};

class BatchRunnerTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/batch_runner_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    server_ = std::make_unique<GatewayServer>(GatewayOptions{}, &backend_);
    ASSERT_TRUE(server_->Start().ok());
  }

  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  BatchOptions Options() {
    BatchOptions o;
    o.input_path = dir_ + "/in.jsonl";
    o.output_path = dir_ + "/out.jsonl";
    o.summary_json_path = dir_ + "/summary.json";
    o.endpoint.port = server_->port();
    o.endpoint.timeout = absl::Seconds(60);
    o.concurrency = 4;
    o.initial_backoff = absl::Milliseconds(50);
    o.max_backoff = absl::Seconds(2);
    o.progress = ProgressMode::kNone;
    return o;
  }

  void WriteInput(const std::vector<Json>& lines) {
    std::ofstream out(dir_ + "/in.jsonl");
    for (const Json& l : lines) out << l.dump() << "\n";
  }

  static Json Line(const std::string& id, const std::string& prompt, Json extra = Json::object()) {
    Json body = {{"model", "strata-test"}, {"prompt", prompt}, {"max_tokens", 2}};
    body.update(extra);
    return {{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}};
  }

  static std::vector<Json> ReadLines(const std::string& path) {
    std::vector<Json> lines;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) lines.push_back(Json::parse(line));
    }
    return lines;
  }

  static std::map<std::string, int> CountIds(const std::vector<Json>& lines) {
    std::map<std::string, int> ids;
    for (const Json& l : lines) ++ids[l["custom_id"].get<std::string>()];
    return ids;
  }

  std::string dir_;
  FlakyBackend backend_;
  std::unique_ptr<GatewayServer> server_;
};

TEST_F(BatchRunnerTest, RunsEverythingAtLowPriorityAndReusesSharedPrefixes) {
  // 30 prompts sharing a 640-byte prefix (40 of the backend's 16-token blocks), then 10 others.
  const std::string shared(640, 'S');
  std::vector<Json> lines;
  for (int i = 0; i < 30; ++i)
    lines.push_back(Line("s" + std::to_string(i), shared + "#" + std::to_string(i)));
  for (int i = 0; i < 10; ++i)
    lines.push_back(Line("o" + std::to_string(i), "other prompt " + std::to_string(i)));
  lines.push_back(Line("urgent", "an urgent one", Json{{"priority", 5}}));
  WriteInput(lines);
  auto result = RunBatch(Options());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->interrupted);
  EXPECT_EQ(result->stats.succeeded, 41u);
  EXPECT_EQ(result->stats.failed, 0u);

  const std::vector<Json> out = ReadLines(dir_ + "/out.jsonl");
  ASSERT_EQ(out.size(), 41u);
  for (const auto& [id, n] : CountIds(out)) EXPECT_EQ(n, 1) << id;
  const Json& first = out[0];
  EXPECT_EQ(first["response"]["status_code"], 200);
  EXPECT_TRUE(first["error"].is_null());
  EXPECT_EQ(first["response"]["body"]["choices"][0]["text"], "tok0 tok1 ");
  EXPECT_EQ(first["response"]["request_id"], first["response"]["body"]["id"]);
  EXPECT_EQ(first["id"].get<std::string>().rfind("batch_req_", 0), 0u);

  // The shared prefix was computed once: every other request of the group found it cached (the
  // leader ran alone first), so 29 × 640 cached bytes-as-tokens at least.
  EXPECT_GE(result->stats.cached_tokens, 29u * 640u) << result->stats.cached_tokens;
  const Json summary = Json::parse(std::ifstream(dir_ + "/summary.json"));
  EXPECT_EQ(summary["succeeded"], 41);
  EXPECT_EQ(summary["cached_tokens"], result->stats.cached_tokens);
  EXPECT_GT(summary["cache_hit_ratio"].get<double>(), 0.6);

  const std::vector<int> priorities = backend_.priorities();
  ASSERT_EQ(priorities.size(), 41u);
  EXPECT_EQ(std::count(priorities.begin(), priorities.end(), kLowPriority), 40);
  EXPECT_EQ(std::count(priorities.begin(), priorities.end(), 5), 1);

  // A rerun finds everything done and sends nothing.
  auto again = RunBatch(Options());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stats.total, 0u);
  EXPECT_EQ(again->stats.skipped, 41u);
  EXPECT_EQ(backend_.priorities().size(), 41u);
  EXPECT_EQ(ReadLines(dir_ + "/out.jsonl").size(), 41u);
}

TEST_F(BatchRunnerTest, OneThreadRunsInPromptOrderOrInInputOrder) {
  WriteInput({Line("x", "charlie"), Line("y", "alpha"), Line("z", "bravo")});
  BatchOptions o = Options();
  o.concurrency = 1;
  ASSERT_TRUE(RunBatch(o).ok());
  std::vector<std::string> ids;
  for (const Json& l : ReadLines(o.output_path)) ids.push_back(l["custom_id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"y", "z", "x"}));
  o.output_path = dir_ + "/input_order.jsonl";
  o.order = RunOrder::kInput;
  ASSERT_TRUE(RunBatch(o).ok());
  ids.clear();
  for (const Json& l : ReadLines(o.output_path)) ids.push_back(l["custom_id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"x", "y", "z"}));
}

TEST_F(BatchRunnerTest, RetriesA429HonouringRetryAfter) {
  backend_.reject_first = 2;
  WriteInput({Line("flaky", "a FLAKY prompt"), Line("fine", "a fine prompt")});
  const auto start = std::chrono::steady_clock::now();
  auto result = RunBatch(Options());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->stats.succeeded, 2u);
  EXPECT_EQ(result->stats.failed, 0u);
  EXPECT_EQ(result->stats.retries, 2u);
  EXPECT_EQ(backend_.attempts("a FLAKY prompt"), 3);
  // Two waits of the server's Retry-After (1 s), not the 50 ms backoff.
  EXPECT_GE(seconds, 2.0);
  EXPECT_EQ(ReadLines(dir_ + "/out.jsonl").size(), 2u);
  EXPECT_TRUE(ReadLines(dir_ + "/out.jsonl.errors.jsonl").empty());
}

TEST_F(BatchRunnerTest, FinalFailuresGoToTheErrorsFileAndAreRetriedOnResume) {
  WriteInput({Line("ok1", "first"), Line("busy", "ALWAYS429 here"),
              Line("bad", "bad request", Json{{"max_tokens", -3}}), Line("ok2", "second")});
  BatchOptions o = Options();
  o.max_attempts = 2;
  auto result = RunBatch(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->stats.succeeded, 2u);
  EXPECT_EQ(result->stats.failed, 2u);
  EXPECT_EQ(CountIds(ReadLines(o.output_path)),
            (std::map<std::string, int>{{"ok1", 1}, {"ok2", 1}}));
  std::vector<Json> errors = ReadLines(o.output_path + ".errors.jsonl");
  ASSERT_EQ(errors.size(), 2u);
  std::map<std::string, Json> by_id;
  for (const Json& e : errors) by_id[e["custom_id"]] = e;
  EXPECT_EQ(by_id["busy"]["response"]["status_code"], 429);
  EXPECT_EQ(by_id["busy"]["error"]["code"], "rate_limit_exceeded");
  EXPECT_NE(by_id["busy"]["error"]["message"].get<std::string>().find("after 2 attempts"),
            std::string::npos)
      << by_id["busy"];
  EXPECT_EQ(by_id["bad"]["response"]["status_code"], 400);
  EXPECT_NE(by_id["bad"]["error"]["message"].get<std::string>().find("max_tokens"),
            std::string::npos);
  EXPECT_EQ(backend_.attempts("ALWAYS429 here"), 0);  // not counted (not FLAKY)

  // The cluster has room again: a rerun retries both failures, sends nothing else.
  backend_.set_always_reject(false);
  const size_t sent_before = backend_.priorities().size();
  result = RunBatch(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->stats.total, 2u);
  EXPECT_EQ(result->stats.succeeded, 1u);  // "busy"; "bad" is still bad
  EXPECT_EQ(result->stats.failed, 1u);
  EXPECT_EQ(backend_.priorities().size(), sent_before + 1);  // the 400 never reaches the backend
  EXPECT_EQ(CountIds(ReadLines(o.output_path)),
            (std::map<std::string, int>{{"busy", 1}, {"ok1", 1}, {"ok2", 1}}));
  errors = ReadLines(o.output_path + ".errors.jsonl");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["custom_id"], "bad");
}

TEST_F(BatchRunnerTest, ResumesAfterATornLastLine) {
  std::vector<Json> lines;
  for (int i = 0; i < 12; ++i)
    lines.push_back(Line("r" + std::to_string(i), "prompt " + std::to_string(i)));
  WriteInput(lines);
  BatchOptions o = Options();
  ASSERT_TRUE(RunBatch(o).ok());
  // Simulate a crash: keep 5 whole lines and half of the sixth.
  std::vector<std::string> raw;
  {
    std::ifstream in(o.output_path);
    std::string l;
    while (std::getline(in, l)) raw.push_back(l);
  }
  ASSERT_EQ(raw.size(), 12u);
  {
    std::ofstream out(o.output_path, std::ios::trunc);
    for (int i = 0; i < 5; ++i) out << raw[i] << "\n";
    out << raw[5].substr(0, raw[5].size() / 2);
  }
  auto result = RunBatch(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->truncated_last_line);
  EXPECT_EQ(result->stats.skipped, 5u);
  EXPECT_EQ(result->stats.succeeded, 7u);
  const std::vector<Json> out = ReadLines(o.output_path);  // every line parses
  ASSERT_EQ(out.size(), 12u);
  const auto ids = CountIds(out);
  EXPECT_EQ(ids.size(), 12u);
  for (const auto& [id, n] : ids) EXPECT_EQ(n, 1) << id;
}

TEST_F(BatchRunnerTest, InvalidInputSendsNothing) {
  std::ofstream(dir_ + "/in.jsonl") << Line("a", "fine").dump() << "\n{oops\n";
  auto result = RunBatch(Options());
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("in.jsonl:2: malformed JSON"),
            std::string::npos)
      << result.status();
  EXPECT_TRUE(backend_.priorities().empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.jsonl"));
}

TEST_F(BatchRunnerTest, PreflightRefusesUnknownModelsAndUnreachableEndpoints) {
  Json wrong = Line("w", "which model?");
  wrong["body"]["model"] = "gpt-nope";
  WriteInput({Line("a", "fine"), wrong});
  auto result = RunBatch(Options());
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("in.jsonl:2: model 'gpt-nope'"),
            std::string::npos)
      << result.status();
  EXPECT_TRUE(backend_.priorities().empty());

  WriteInput({Line("a", "fine")});
  BatchOptions o = Options();
  server_->Stop();
  result = RunBatch(o);
  EXPECT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("nothing was sent"), std::string::npos)
      << result.status();
  EXPECT_FALSE(std::filesystem::exists(o.output_path));
}

TEST_F(BatchRunnerTest, StopFinishesInFlightAndLeavesTheRestForResume) {
  std::vector<Json> lines;
  for (int i = 0; i < 20; ++i)
    lines.push_back(Line("r" + std::to_string(i), "stop test " + std::to_string(i)));
  WriteInput(lines);
  std::atomic<bool> stop{true};  // stopped before anything starts: nothing runs
  auto result = RunBatch(Options(), &stop);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->interrupted);
  EXPECT_LE(result->stats.done(), 4u);  // at most what the 4 threads had already taken
  const Json summary = Json::parse(std::ifstream(dir_ + "/summary.json"));
  EXPECT_EQ(summary["interrupted"], true);
  stop = false;
  result = RunBatch(Options(), &stop);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->interrupted);
  EXPECT_EQ(ReadLines(dir_ + "/out.jsonl").size(), 20u);
}

}  // namespace
}  // namespace strata::scheduler::batch
