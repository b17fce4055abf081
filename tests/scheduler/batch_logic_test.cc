// strata batch's pure logic: input validation, prompt keys, prefix grouping and the run queue,
// resuming from an output with a torn last line, progress rendering.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "scheduler/batch/batch_input.h"
#include "scheduler/batch/batch_output.h"
#include "scheduler/batch/batch_plan.h"
#include "scheduler/batch/batch_progress.h"

namespace strata::scheduler::batch {
namespace {

using Json = nlohmann::json;

std::string ChatLine(const std::string& id, const std::string& system, const std::string& user) {
  return Json{{"custom_id", id},
              {"method", "POST"},
              {"url", "/v1/chat/completions"},
              {"body",
               {{"model", "m"},
                {"messages", Json::array({Json{{"role", "system"}, {"content", system}},
                                          Json{{"role", "user"}, {"content", user}}})}}}}
      .dump();
}

std::string CompletionLine(const std::string& id, const std::string& prompt) {
  return Json{
      {"custom_id", id}, {"url", "/v1/completions"}, {"body", {{"model", "m"}, {"prompt", prompt}}}}
      .dump();
}

TEST(BatchInputTest, ParsesValidLinesAndSkipsBlankOnes) {
  const std::string text = ChatLine("a", "sys", "hi") + "\n\n" + CompletionLine("b", "once") + "\n";
  auto requests = ParseBatchInput(text, "in.jsonl");
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].custom_id, "a");
  EXPECT_EQ((*requests)[0].line, 1u);
  EXPECT_EQ((*requests)[0].url, "/v1/chat/completions");
  EXPECT_EQ((*requests)[1].custom_id, "b");
  EXPECT_EQ((*requests)[1].line, 3u);
  EXPECT_EQ((*requests)[1].body["prompt"], "once");
}

TEST(BatchInputTest, EveryProblemIsNamedWithItsLine) {
  const std::string text =
      ChatLine("a", "s", "u") + "\n" +  // 1: fine
      "{not json\n" +                   // 2
      R"({"url": "/v1/completions", "body": {"model": "m", "prompt": "x"}})" +
      "\n" +  // 3: no custom_id
      R"({"custom_id": "c", "url": "/v1/embeddings", "body": {}})" + "\n" +
      R"({"custom_id": "d", "url": "/v1/completions"})" + "\n" +  // 5
      ChatLine("a", "s", "again") + "\n" +                        // 6: duplicate
      R"({"custom_id": "e", "method": "GET", "url": "/v1/completions", "body": {"model": "m", "prompt": "x"}})" +
      "\n" +
      R"({"custom_id": "f", "url": "/v1/completions", "body": {"model": "m", "prompt": "x", "stream": true}})" +
      "\n";
  auto requests = ParseBatchInput(text, "in.jsonl");
  ASSERT_TRUE(absl::IsInvalidArgument(requests.status())) << requests.status();
  const std::string message(requests.status().message());
  EXPECT_NE(message.find("7 invalid lines"), std::string::npos) << message;
  EXPECT_NE(message.find("in.jsonl:2: malformed JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("in.jsonl:3: 'custom_id'"), std::string::npos) << message;
  EXPECT_NE(message.find("in.jsonl:4: unsupported url '/v1/embeddings'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("in.jsonl:5: 'body' is missing"), std::string::npos) << message;
  EXPECT_NE(message.find("in.jsonl:6: duplicate custom_id 'a' (first on line 1)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("in.jsonl:7: 'method'"), std::string::npos) << message;
  EXPECT_NE(message.find("in.jsonl:8: 'body.stream'"), std::string::npos) << message;
}

TEST(BatchInputTest, ModelIsRequiredUnlessDefaulted) {
  const std::string line =
      R"({"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "p"}})";
  EXPECT_TRUE(absl::IsInvalidArgument(ParseBatchInput(line, "f").status()));
  InputOptions options;
  options.default_model = "strata-tiny";
  auto requests = ParseBatchInput(line, "f", options);
  ASSERT_TRUE(requests.ok()) << requests.status();
  EXPECT_EQ((*requests)[0].body["model"], "strata-tiny");
  EXPECT_TRUE(absl::IsInvalidArgument(ParseBatchInput("\n\n", "f").status()));  // no requests
}

TEST(BatchInputTest, PromptKeyFollowsTheMessagesInOrderAndSeparatesTenants) {
  auto key = [](const std::string& line) {
    auto r = ParseBatchInput(line, "f");
    EXPECT_TRUE(r.ok()) << r.status();
    return (*r)[0].prompt_key;
  };
  const std::string a = key(ChatLine("1", "You are helpful.", "Question A"));
  const std::string b = key(ChatLine("2", "You are helpful.", "Question B"));
  const std::string c = key(ChatLine("3", "You are terse.", "Question A"));
  EXPECT_GT(CommonPrefixLength(a, b), CommonPrefixLength(a, c));
  EXPECT_NE(a.find("You are helpful."), std::string::npos);
  // Another cache_salt shares no prefix beyond the model.
  Json salted = Json::parse(ChatLine("4", "You are helpful.", "Question A"));
  salted["body"]["cache_salt"] = "tenant-b";
  EXPECT_LT(CommonPrefixLength(a, key(salted.dump())), 3u);
}

std::vector<BatchRequest> Requests(const std::vector<std::string>& prompts) {
  std::string text;
  for (size_t i = 0; i < prompts.size(); ++i) {
    text += CompletionLine("r" + std::to_string(i), prompts[i]) + "\n";
  }
  auto requests = ParseBatchInput(text, "f");
  EXPECT_TRUE(requests.ok()) << requests.status();
  return *std::move(requests);
}

std::vector<size_t> All(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(BatchPlanTest, SharedPrefixesFormGroupsInPromptOrder) {
  const std::string shared_a(300, 'a');
  const std::string shared_b(300, 'b');
  const auto requests = Requests({shared_b + "2", "short one", shared_a + "1", shared_b + "1",
                                  shared_a + "2", shared_a + "3", "short two"});
  const std::vector<BatchGroup> groups = PlanGroups(requests, All(requests.size()), 256);
  ASSERT_EQ(groups.size(), 4u);
  // Sorted: aaa...1 (leader), aaa...2, aaa...3 | bbb...1, bbb...2 | "short one" | "short two".
  EXPECT_EQ(groups[0].leader, 2u);
  EXPECT_EQ(groups[0].followers, (std::vector<size_t>{4, 5}));
  EXPECT_EQ(groups[1].leader, 3u);
  EXPECT_EQ(groups[1].followers, (std::vector<size_t>{0}));
  EXPECT_EQ(groups[2].leader, 1u);  // "short one" and "short two" share only "short "
  EXPECT_TRUE(groups[2].followers.empty());
  EXPECT_EQ(groups[3].leader, 6u);
  // Requests already done are left out.
  const std::vector<BatchGroup> rest = PlanGroups(requests, {0, 4, 5}, 256);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].leader, 4u);
  EXPECT_EQ(rest[0].followers, (std::vector<size_t>{5}));
  EXPECT_EQ(rest[1].leader, 0u);
}

TEST(BatchPlanTest, FollowersWaitForTheirLeaderThenGoFirst) {
  // Group 0: leader 0, followers 1 2; group 1: leader 3 alone; group 2: leader 4, follower 5.
  BatchQueue queue({BatchGroup{0, {1, 2}}, BatchGroup{3, {}}, BatchGroup{4, {5}}});
  EXPECT_EQ(queue.Next(), 0u);
  EXPECT_EQ(queue.Next(), 3u);
  EXPECT_EQ(queue.Next(), 4u);
  // Nothing is ready until a leader finishes: Next() blocks (checked from another thread).
  std::optional<size_t> got;
  std::thread waiter([&] { got = queue.Next(); });
  queue.Done(3);  // a group without followers releases nothing
  queue.Done(0);
  waiter.join();
  EXPECT_EQ(got, 1u);
  EXPECT_EQ(queue.Next(), 2u);
  queue.Done(4);
  EXPECT_EQ(queue.Next(), 5u);
  EXPECT_EQ(queue.Next(), std::nullopt);  // all handed out, no leader outstanding
}

TEST(BatchPlanTest, CloseReleasesWaiters) {
  BatchQueue queue({BatchGroup{0, {1}}});
  EXPECT_EQ(queue.Next(), 0u);
  std::optional<size_t> got = 99;
  std::thread waiter([&] { got = queue.Next(); });
  queue.Close();
  waiter.join();
  EXPECT_EQ(got, std::nullopt);
}

class BatchOutputTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/batch_output_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string dir_;
};

TEST_F(BatchOutputTest, MissingOutputIsAFreshStart) {
  auto state = LoadOutput(dir_ + "/none.jsonl");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->done.empty());
  EXPECT_FALSE(state->truncated_last_line);
}

TEST_F(BatchOutputTest, AppendThenResumeCutsATornLastLine) {
  const std::string path = dir_ + "/out.jsonl";
  {
    JsonlAppender out;
    ASSERT_TRUE(out.Open(path, false).ok());
    ASSERT_TRUE(out.Append(SuccessLine("id1", "a", Json{{"id", "cmpl-1"}})).ok());
    ASSERT_TRUE(out.Append(SuccessLine("id2", "b", Json{{"id", "cmpl-2"}})).ok());
  }
  const std::string good = Read(path);
  {
    std::ofstream torn(path, std::ios::app);
    torn << R"({"id": "id3", "custom_id": "c", "response": {"status_co)";  // a crash mid-write
  }
  auto state = LoadOutput(path);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->truncated_last_line);
  EXPECT_EQ(state->lines, 2u);
  EXPECT_TRUE(state->done.contains("a"));
  EXPECT_TRUE(state->done.contains("b"));
  EXPECT_FALSE(state->done.contains("c"));
  EXPECT_EQ(Read(path), good);  // the torn bytes are gone, so appends start on a fresh line
  const Json line = Json::parse(good.substr(0, good.find('\n')));
  EXPECT_EQ(line["response"]["status_code"], 200);
  EXPECT_EQ(line["response"]["request_id"], "cmpl-1");
  EXPECT_TRUE(line["error"].is_null());

  // A complete JSON line that lacks only its newline is also cut: it may be a prefix of a longer
  // line. Its request runs again.
  {
    std::ofstream torn(path, std::ios::app);
    torn << SuccessLine("id3", "c", Json::object()).dump();
  }
  state = LoadOutput(path);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->truncated_last_line);
  EXPECT_EQ(Read(path), good);
}

TEST_F(BatchOutputTest, CorruptLineInTheMiddleIsAnError) {
  const std::string path = dir_ + "/out.jsonl";
  std::ofstream(path) << SuccessLine("1", "a", Json::object()).dump() << "\ngarbage\n"
                      << SuccessLine("2", "b", Json::object()).dump() << "\n";
  auto state = LoadOutput(path);
  EXPECT_TRUE(absl::IsDataLoss(state.status())) << state.status();
  EXPECT_NE(std::string(state.status().message()).find(":2:"), std::string::npos);
}

TEST(BatchProgressTest, RendersRatesEtaAndHitRatio) {
  BatchStats stats;
  stats.SetTotal(200, 10);
  Json usage = {{"prompt_tokens", 1000},
                {"completion_tokens", 10},
                {"prompt_tokens_details", {{"cached_tokens", 900}}}};
  for (int i = 0; i < 50; ++i) stats.AddResult(true, usage);
  stats.AddResult(false, Json());
  const ProgressSnapshot s = stats.Snapshot(10.0);
  EXPECT_EQ(s.done(), 51u);
  EXPECT_DOUBLE_EQ(s.hit_ratio(), 0.9);
  EXPECT_DOUBLE_EQ(s.tokens_per_s(), 50 * 1010 / 10.0);
  EXPECT_NEAR(s.eta_s(), 149 * 10.0 / 51, 1e-9);
  const std::string bar = RenderProgress(s, true);
  EXPECT_EQ(bar.rfind("[######", 0), 0u) << bar;
  EXPECT_NE(bar.find("51/200"), std::string::npos) << bar;
  EXPECT_NE(bar.find("cache hit 90.0%"), std::string::npos) << bar;
  EXPECT_NE(bar.find("5,050 tok/s"), std::string::npos) << bar;
  EXPECT_NE(bar.find("ETA 0:29"), std::string::npos) << bar;
  EXPECT_NE(bar.find("1 failed"), std::string::npos) << bar;
  const Json summary = SummaryJson(s, false);
  EXPECT_EQ(summary["succeeded"], 50);
  EXPECT_EQ(summary["failed"], 1);
  EXPECT_EQ(summary["skipped"], 10);
  EXPECT_EQ(summary["total"], 210);
  EXPECT_DOUBLE_EQ(summary["cache_hit_ratio"].get<double>(), 0.9);
  EXPECT_NE(RenderSummary(s, true).find("batch interrupted"), std::string::npos);
}

}  // namespace
}  // namespace strata::scheduler::batch
