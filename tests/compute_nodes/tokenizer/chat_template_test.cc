// The C++ rendering of the DeepSeek-V3 chat template (its parity with the Jinja template as
// rendered by the JS port is in tokenizer_parity_test).
#include "compute_nodes/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/compute_nodes/tokenizer/real_tokenizer.h"

namespace strata::tokenizer {
namespace {

TEST(ChatTemplateTest, RendersTurnsAndGenerationPrompt) {
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  auto text = RenderChat(chat, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>Hello."
            "<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>");
  text = RenderChat(chat, /*add_generation_prompt=*/false);
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, testing::EndsWith("<｜User｜>Bye"));
}

TEST(ChatTemplateTest, SystemMessagesAreGatheredUpFront) {
  const std::vector<ChatMessage> chat = {
      {"user", "u"}, {"system", "one"}, {"assistant", "a"}, {"system", "two"}};
  auto text = RenderChat(chat, false, "<bos>");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<bos>one\n\ntwo<｜User｜>u<｜Assistant｜>a<｜end▁of▁sentence｜>");
}

TEST(ChatTemplateTest, EmptyChatIsTheBosAlone) {
  EXPECT_EQ(*RenderChat({}, false), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(*RenderChat({}, true), "<｜begin▁of▁sentence｜><｜Assistant｜>");
}

TEST(ChatTemplateTest, RefusesWhatItDoesNotRender) {
  EXPECT_EQ(RenderChat(std::vector<ChatMessage>{{"tool", "42"}}, true).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(RenderChat(std::vector<ChatMessage>{{"developer", "x"}}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ParsesOpenAiMessages) {
  auto messages = ParseChatMessages(
      R"([{"role": "system", "content": "s"}, {"role": "user", "content": "你好"}])");
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 2u);
  EXPECT_EQ((*messages)[1].role, "user");
  EXPECT_EQ((*messages)[1].content, "你好");

  EXPECT_EQ(ParseChatMessages(R"([{"role": "assistant", "content": null, "tool_calls": [{}]}])")
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(
      ParseChatMessages(R"([{"role": "user", "content": [{"type": "text"}]}])").status().code(),
      absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ParseChatMessages(R"({"role": "user"})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseChatMessages(R"([{"content": "x"}])").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseChatMessages("[").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RecognizesTheDeepSeekV3Template) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_TRUE(CheckDeepSeekV3ChatTemplate(tok->chat_template()).ok());
  EXPECT_EQ(CheckDeepSeekV3ChatTemplate(tok->chat_template() + " ").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckDeepSeekV3ChatTemplate("").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::tokenizer
