// `strata tokenize` as a user runs it, on the real DeepSeek-V3 tokenizer.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/compute_nodes/tokenizer/real_tokenizer.h"
#include "tests/util/subprocess.h"

namespace strata::tokenizer {
namespace {

using Result = ::strata::testing_util::CommandResult;

// stdout only: the tests compare exact output.
Result RunStrata(const std::string& args) {
  return ::strata::testing_util::RunStrata(args, ::strata::testing_util::Stderr::kDiscard);
}

TEST(TokenizeCommandTest, EncodesDecodesAndRendersChats) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_EQ(RunStrata("tokenize --text 'Hello world'").output, "19923 2058\n");
  const Result json = RunStrata("tokenize --text 'Hello world' --add-special-tokens --json");
  ASSERT_EQ(json.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(json.output)["ids"], nlohmann::json::parse("[0, 19923, 2058]"));

  const std::string file = testing::TempDir() + "/tokenize_command_test.txt";
  std::ofstream(file) << "안녕하세요\n\tcode();\n";
  const Result from_file = RunStrata("tokenize --file " + file + " --json");
  ASSERT_EQ(from_file.exit_code, 0);
  const auto ids = nlohmann::json::parse(from_file.output)["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, *tok->Encode("안녕하세요\n\tcode();\n"));
  EXPECT_EQ(RunStrata("tokenize --decode '[0, 19923, 2058]'").output,
            "<｜begin▁of▁sentence｜>Hello world\n");
  EXPECT_EQ(RunStrata("tokenize --decode '0,19923,2058' --skip-special-tokens").output,
            "Hello world\n");

  const std::string chat = testing::TempDir() + "/tokenize_command_chat.json";
  std::ofstream(chat) << R"({"messages": [{"role": "user", "content": "Hi"}],
                            "add_generation_prompt": true})";
  const Result rendered = RunStrata("tokenize --chat-json " + chat + " --json");
  ASSERT_EQ(rendered.exit_code, 0);
  const auto out = nlohmann::json::parse(rendered.output);
  EXPECT_EQ(out["text"], "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
  EXPECT_EQ(out["ids"], nlohmann::json::parse("[0, 128803, 23166, 128804]"));
}

TEST(TokenizeCommandTest, BadInputFailsWithExitCode2) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_EQ(RunStrata("tokenize").exit_code, 2);  // no input
  EXPECT_EQ(RunStrata("tokenize --text a --decode 1").exit_code, 2);
  EXPECT_EQ(RunStrata("tokenize --decode 'x y'").exit_code, 2);
  const std::string latin1 = testing::TempDir() + "/tokenize_command_latin1.txt";
  std::ofstream(latin1) << "caf\xE9";
  EXPECT_EQ(RunStrata("tokenize --file " + latin1).exit_code, 2);  // not UTF-8
  EXPECT_EQ(RunStrata("tokenize --tokenizer /nonexistent --text a").exit_code, 2);
  const std::string chat = testing::TempDir() + "/tokenize_command_tool.json";
  std::ofstream(chat) << R"([{"role": "tool", "content": "42"}])";
  EXPECT_EQ(RunStrata("tokenize --chat-json " + chat).exit_code, 2);
}

}  // namespace
}  // namespace strata::tokenizer
