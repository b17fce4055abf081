// The hand-written matcher of the DeepSeek-V3 pre-tokenizer regexes, on cases worked out from
// the regex semantics (leftmost-first alternation with backtracking, "Isolated" splits).
#include "compute_nodes/tokenizer/pre_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string_view> pieces;
  PreTokenize(text, &pieces);
  std::string joined;
  for (auto p : pieces) joined.append(p);
  EXPECT_EQ(joined, text) << "pieces must concatenate to the input";
  return {pieces.begin(), pieces.end()};
}

TEST(PreTokenizerTest, WordsTakeTheirLeadingSpace) {
  EXPECT_THAT(Split("Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Split("a\tb"), ElementsAre("a", "\tb"));
}

TEST(PreTokenizerTest, DigitsAreIsolatedInGroupsOfThree) {
  EXPECT_THAT(Split("abc1234567de"), ElementsAre("abc", "123", "456", "7", "de"));
  EXPECT_THAT(Split("x 12"), ElementsAre("x", " ", "12"));
  // \p{N} includes other scripts' digits and No (superscripts, fractions).
  EXPECT_THAT(Split("٠١٢٣²½"), ElementsAre("٠١٢", "٣²½"));
}

TEST(PreTokenizerTest, CjkRunsAreIsolatedBeforeWordSplitting) {
  EXPECT_THAT(Split("中文English"), ElementsAre("中文", "English"));
  EXPECT_THAT(Split("我们 去"), ElementsAre("我们", " ", "去"));
  EXPECT_THAT(Split("カタカナとひらがな"), ElementsAre("カタカナとひらがな"));
  // Hangul is not in the CJK class: the space joins the word.
  EXPECT_THAT(Split("한국어 문장"), ElementsAre("한국어", " 문장"));
}

TEST(PreTokenizerTest, AsciiPunctuationBeforeAsciiLetters) {
  EXPECT_THAT(Split(".hidden"), ElementsAre(".hidden"));
  EXPECT_THAT(Split("a.b.c"), ElementsAre("a", ".b", ".c"));
  // Only [A-Za-z] continues the first alternative; the rest is a new word.
  EXPECT_THAT(Split("-héllo"), ElementsAre("-h", "éllo"));
}

TEST(PreTokenizerTest, PunctuationRunsTakeOneSpaceAndTrailingNewlines) {
  EXPECT_THAT(Split("Hi, there!!\n\nBye"), ElementsAre("Hi", ",", " there", "!!\n\n", "Bye"));
  EXPECT_THAT(Split("a  (b)"), ElementsAre("a", " ", " (", "b", ")"));
}

TEST(PreTokenizerTest, WhitespaceRuns) {
  // \s+(?!\S): a run before a word leaves its last space to the word.
  EXPECT_THAT(Split("a   b"), ElementsAre("a", "  ", " b"));
  // At the end of the piece the whole run matches.
  EXPECT_THAT(Split("a   "), ElementsAre("a", "   "));
  // \s*[\r\n]+: up to the last newline of the run.
  EXPECT_THAT(Split("a \n \n  b"), ElementsAre("a", " \n \n", " ", " b"));
  EXPECT_THAT(Split("x\r\n\r\ny"), ElementsAre("x", "\r\n\r\n", "y"));
  // A newline is never a word prefix.
  EXPECT_THAT(Split("\nabc"), ElementsAre("\n", "abc"));
}

TEST(PreTokenizerTest, MarksJoinLetters) {
  EXPECT_THAT(Split("e\u0301te"), ElementsAre("e\u0301te"));
  EXPECT_THAT(Split(" \u0301a"), ElementsAre(" \u0301a"));
}

TEST(PreTokenizerTest, UnmatchedCharactersStayBetweenMatches) {
  // A control character is a valid word prefix, but alone it matches nothing.
  EXPECT_THAT(Split("a\x01"), ElementsAre("a", "\x01"));
  EXPECT_THAT(Split("\x01x"), ElementsAre("\x01x"));
}

TEST(PreTokenizerTest, WhitespaceIsUnicodeWhiteSpaceAsInOniguruma) {
  // U+0085 (NEL) is White_Space, so " \u0085 " is one run of three (the JS port's \s lacks
  // U+0085 and gives " ", "\u0085", " b").
  EXPECT_THAT(Split(" \u0085 b"), ElementsAre(" \u0085", " b"));
  // U+FEFF is Cf, not White_Space (the JS port's \s has it and gives "a", " \uFEFF").
  EXPECT_THAT(Split("a \xEF\xBB\xBF"), ElementsAre("a", " ", "\xEF\xBB\xBF"));
}

TEST(PreTokenizerTest, EmptyInput) { EXPECT_TRUE(Split("").empty()); }

}  // namespace
}  // namespace strata::tokenizer
