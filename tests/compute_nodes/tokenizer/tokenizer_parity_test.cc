// Parity with the HF tokenizers JavaScript port (@lenml/tokenizers, from transformers.js), run
// with node on the same inputs: token ids, decoded text and chat template renderings.
//
// Inputs: testdata/parity_corpus.json (hand-built: English, code, CJK, emoji, digits,
// whitespace runs, inline special tokens, mixed and unusual Unicode), 1,700 strings generated
// from fixed seeds over the same kinds of characters, and testdata/chat_cases.json.
// Two code points are left out of the generated strings on purpose: U+0085 and U+FEFF, where the
// JS port's `\s` differs from Oniguruma's (HF tokenizers); see pre_tokenizer_test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/paths.h"
#include "compute_nodes/tokenizer/chat_template.h"
#include "compute_nodes/tokenizer/pre_tokenizer.h"
#include "tests/compute_nodes/tokenizer/real_tokenizer.h"

namespace strata::tokenizer {
namespace {

std::string SourceDir() {
  const char* src = std::getenv("STRATA_SOURCE_DIR");
  return src != nullptr ? src : ".";
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str(), nullptr, false);
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Random strings that stress the pre-tokenizer's boundaries: mixes of letters of several
// scripts, marks, digits, punctuation, symbols, emoji, whitespace runs and special tokens.
std::vector<std::string> GeneratedStrings(int count, size_t max_units, uint32_t seed) {
  struct Range {
    char32_t first, last;
  };
  const std::vector<std::vector<Range>> classes = {
      {{'a', 'z'}, {'A', 'Z'}},                              // ASCII letters
      {{'0', '9'}},                                          // digits
      {{'!', '/'}, {':', '@'}, {'[', '`'}, {'{', '~'}},      // ASCII punctuation
      {{' ', ' '}, {' ', ' '}, {'\t', '\n'}, {'\r', '\r'}},  // common whitespace
      {{0x0B, 0x0C}, {0xA0, 0xA0}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x3000, 0x3000}},
      {{0xC0, 0xFF}, {0x100, 0x17F}},  // Latin-1, Latin Extended-A
      {{0x300, 0x36F}},                // combining marks
      {{0x391, 0x3A9}, {0x410, 0x44F}, {0x5D0, 0x5EA}, {0x627, 0x64A}},  // Greek ... Arabic
      {{0x660, 0x669}, {0x966, 0x96F}, {0xB2, 0xB3}, {0xBC, 0xBE}},      // other numbers
      {{0xAC00, 0xD7A3}},                                                // Hangul syllables
      {{0x4E00, 0x9FA5}},                                                // CJK in the split class
      {{0x3041, 0x3096}, {0x30A1, 0x30FA}},                              // kana
      {{0x3001, 0x3003}, {0xFF01, 0xFF0F}, {0x2010, 0x2027}},            // CJK and general punct.
      {{0x2190, 0x21FF}, {0x2200, 0x22FF}, {0x20A0, 0x20C0}},            // arrows, math, currency
      {{0x1F600, 0x1F64F}, {0x1F300, 0x1F3FA}},                          // emoji
      {{0x20000, 0x2A6DF}},                                              // CJK extension B
      {{0x01, 0x08}, {0x200B, 0x200D}, {0x7F, 0x7F}},                    // controls, format chars
  };
  const std::vector<std::string> specials = {"<｜begin▁of▁sentence｜>", "<｜User｜>",
                                             "<｜Assistant｜>", "<|EOT|>", "<｜tool▁sep｜>"};
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    const size_t units = 1 + pick(max_units);
    for (size_t u = 0; u < units; ++u) {
      if (pick(50) == 0) {
        s += specials[pick(specials.size())];
        continue;
      }
      const auto& ranges = classes[pick(classes.size())];
      const size_t repeat = pick(4) == 0 ? 1 + pick(6) : 1;  // runs of one class
      for (size_t r = 0; r < repeat; ++r) {
        const Range& range = ranges[pick(ranges.size())];
        AppendUtf8(range.first + static_cast<char32_t>(pick(range.last - range.first + 1)), &s);
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string Pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  PreTokenize(text, &pieces);
  nlohmann::json j = nlohmann::json::array();
  for (auto p : pieces) j.push_back(std::string(p));
  return j.dump();
}

class ParityTest : public testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v node >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "node is not installed (scripts/install-deps.sh)";
    }
    if (!std::filesystem::exists(NpmDir() + "/node_modules/@lenml/tokenizers")) {
      GTEST_SKIP() << "@lenml/tokenizers is not installed (scripts/fetch-npm.sh)";
    }
  }

  // Runs the JS reference on `request`; returns its response.
  nlohmann::json RunReference(const nlohmann::json& request) {
    const std::string dir = testing::TempDir();
    const std::string in = dir + "/parity_request.json";
    const std::string out = dir + "/parity_response.json";
    std::ofstream(in) << request.dump();
    std::filesystem::remove(out);
    const std::string cmd = "node '" + SourceDir() +
                            "/tests/compute_nodes/tokenizer/reference_tokenizer.js' '" + in +
                            "' '" + out + "'";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << cmd;
    return ReadJson(out);
  }
};

TEST_F(ParityTest, TokenIdsAndDecodingMatchTheJsPort) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  const nlohmann::json corpus =
      ReadJson(SourceDir() + "/tests/compute_nodes/tokenizer/testdata/parity_corpus.json");
  ASSERT_TRUE(corpus.is_array());
  std::vector<std::string> texts = corpus.get<std::vector<std::string>>();
  const size_t num_corpus = texts.size();
  for (auto& s : GeneratedStrings(1500, 40, 20261129)) texts.push_back(std::move(s));
  for (auto& s : GeneratedStrings(200, 400, 7)) texts.push_back(std::move(s));  // long pieces

  const nlohmann::json response = RunReference({{"texts", texts}});
  ASSERT_TRUE(response.is_object() && response["texts"].size() == texts.size());
  int failures = 0;
  size_t total_ids = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& ref = response["texts"][i];
    const auto expected = ref["ids"].get<std::vector<int32_t>>();
    auto ids = tok->Encode(texts[i]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    total_ids += ids->size();
    const bool same_ids = *ids == expected;
    const bool same_text = tok->Decode(expected) == ref["decoded"].get<std::string>();
    if ((!same_ids || !same_text) && ++failures <= 10) {
      ADD_FAILURE() << (i < num_corpus ? "corpus line " : "generated string ") << i << ": "
                    << nlohmann::json(texts[i]).dump() << "\n  strata: " << nlohmann::json(*ids)
                    << "\n  js:     " << ref["ids"] << "\n  pieces: " << Pieces(texts[i])
                    << (same_text ? "" : "\n  decoded text differs");
    }
    // transformers' LlamaTokenizerFast adds the BOS (add_bos_token); the JS port adds nothing.
    auto with_bos = tok->Encode(texts[i], /*add_special_tokens=*/true);
    ASSERT_TRUE(with_bos.ok());
    ASSERT_EQ(with_bos->size(), ids->size() + 1);
    EXPECT_EQ(with_bos->front(), tok->bos_id());
  }
  EXPECT_EQ(failures, 0) << "of " << texts.size() << " strings";
  EXPECT_GT(total_ids, 20000u);  // the comparison covered real work
}

TEST_F(ParityTest, ChatTemplateMatchesApplyChatTemplate) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  ASSERT_TRUE(CheckDeepSeekV3ChatTemplate(tok->chat_template()).ok());
  const nlohmann::json cases =
      ReadJson(SourceDir() + "/tests/compute_nodes/tokenizer/testdata/chat_cases.json");
  ASSERT_TRUE(cases.is_array() && cases.size() >= 10);
  const nlohmann::json response = RunReference({{"chats", cases}});
  ASSERT_TRUE(response.is_object() && response["chats"].size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto messages = ParseChatMessages(cases[i]["messages"].dump());
    ASSERT_TRUE(messages.ok()) << messages.status();
    auto text =
        RenderChat(*messages, cases[i]["add_generation_prompt"].get<bool>(), tok->bos_token());
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, response["chats"][i]["text"].get<std::string>()) << "chat case " << i;
    auto ids = tok->Encode(*text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, response["chats"][i]["ids"].get<std::vector<int32_t>>()) << "chat case " << i;
  }
}

}  // namespace
}  // namespace strata::tokenizer
