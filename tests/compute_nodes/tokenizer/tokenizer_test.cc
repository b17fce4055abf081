// Tokenizer: BPE merging on a small synthetic tokenizer.json, Load errors, and encode/decode,
// special tokens and streaming detokenization on the real DeepSeek-V3 files.
#include "compute_nodes/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "compute_nodes/tokenizer/bpe_model.h"
#include "compute_nodes/tokenizer/unicode.h"
#include "tests/compute_nodes/tokenizer/real_tokenizer.h"

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Corpus() {
  const char* src = std::getenv("STRATA_SOURCE_DIR");
  const std::string path =
      std::string(src ? src : ".") + "/tests/compute_nodes/tokenizer/testdata/parity_corpus.json";
  const auto json = nlohmann::json::parse(ReadFile(path), nullptr, false);
  EXPECT_TRUE(json.is_array()) << path;
  return json.is_array() ? json.get<std::vector<std::string>>() : std::vector<std::string>{};
}

// A tokenizer.json with the 256 byte tokens (id = byte), a few merges and the DeepSeek-V3
// pre-tokenizer section copied from the real file's structure.
nlohmann::json SyntheticTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<uint8_t>(b))] = b;
  vocab["aa"] = 256;
  vocab["ab"] = 257;
  vocab["abc"] = 258;
  vocab["bc"] = 259;
  vocab["Ġa"] = 260;
  const std::string pre = R"json({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
     "behavior": "Isolated", "invert": false},
    {"type": "Split",
     "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})json";
  return {
      {"normalizer", nullptr},
      {"pre_tokenizer", nlohmann::json::parse(pre)},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", 300}, {"content", "<s>"}, {"special", true}},
        {{"id", 301}, {"content", "<s><x>"}, {"special", false}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        // Ranks: a b (0), b c (1), ab c (2), a a (3), Ġ a (4).
        {"merges", {"a b", "b c", "ab c", "a a", "Ġ a"}}}},
  };
}

std::string WriteTokenizerDir(const std::string& name, const nlohmann::json& tokenizer,
                              const nlohmann::json& config = nullptr) {
  const std::string dir = testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  if (!config.is_null()) std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

std::vector<int32_t> EncodeOk(const Tokenizer& tok, std::string_view text, bool special = false) {
  auto ids = tok.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(TokenizerSyntheticTest, MergesByRankLeftmostFirst) {
  auto tok = Tokenizer::Load(WriteTokenizerDir("synthetic", SyntheticTokenizerJson()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  // (a,b) rank 0 before (b,c) rank 1; then (ab,c) rank 2.
  EXPECT_THAT(EncodeOk(**tok, "abc"), ElementsAre(258));
  // Leftmost of equal ranks: "aaa" -> aa + a.
  EXPECT_THAT(EncodeOk(**tok, "aaa"), ElementsAre(256, 'a'));
  // "bcab": (a,b) rank 0 first, then (b,c) rank 1; bc+ab has no merge.
  EXPECT_THAT(EncodeOk(**tok, "bcab"), ElementsAre(259, 257));
  // Byte-level: the space is Ġ and merges with the word; bytes without merges stay bytes.
  EXPECT_THAT(EncodeOk(**tok, "x a"), ElementsAre('x', 260));
  EXPECT_THAT(EncodeOk(**tok, "\xC3\xA9"), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ((*tok)->Decode(EncodeOk(**tok, "x a\xC3\xA9")), "x a\xC3\xA9");
}

TEST(TokenizerSyntheticTest, AddedTokensLongestMatchFirst) {
  auto tok = Tokenizer::Load(WriteTokenizerDir("synthetic_added", SyntheticTokenizerJson()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(EncodeOk(**tok, "a<s><x>b<s>"), ElementsAre('a', 301, 'b', 300));
  EXPECT_THAT(EncodeOk(**tok, "<s<s>"), ElementsAre('<', 's', 300));
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{'a', 300, 301}), "a<s><s><x>");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{'a', 300, 301}, /*skip_special_tokens=*/true),
            "a<s><x>");
  EXPECT_EQ((*tok)->num_ids(), 302);
  EXPECT_FALSE((*tok)->IsKnown(280));  // a hole between vocab and added tokens
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{280, -1, 5000, 'a'}), "a");
}

TEST(TokenizerSyntheticTest, LoadRefusesWhatItDoesNotImplement) {
  EXPECT_EQ(Tokenizer::Load(testing::TempDir() + "/does-not-exist").status().code(),
            absl::StatusCode::kNotFound);

  nlohmann::json other_pre = SyntheticTokenizerJson();
  other_pre["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}";
  auto st = Tokenizer::Load(WriteTokenizerDir("other_pre", other_pre)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("pre_tokenizer"));

  nlohmann::json fallback = SyntheticTokenizerJson();
  fallback["model"]["byte_fallback"] = true;
  EXPECT_EQ(Tokenizer::Load(WriteTokenizerDir("fallback", fallback)).status().code(),
            absl::StatusCode::kUnimplemented);

  nlohmann::json bad_merge = SyntheticTokenizerJson();
  bad_merge["model"]["merges"].push_back("x y");  // "xy" is not in the vocab
  st = Tokenizer::Load(WriteTokenizerDir("bad_merge", bad_merge)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;

  nlohmann::json missing_byte = SyntheticTokenizerJson();
  missing_byte["model"]["vocab"].erase(ByteLevelChar(7));
  EXPECT_EQ(Tokenizer::Load(WriteTokenizerDir("missing_byte", missing_byte)).status().code(),
            absl::StatusCode::kInvalidArgument);

  const std::string dir = WriteTokenizerDir("not_json", SyntheticTokenizerJson());
  std::ofstream(dir + "/tokenizer.json") << "{ not json";
  EXPECT_EQ(Tokenizer::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string bad_bos =
      WriteTokenizerDir("bad_bos", SyntheticTokenizerJson(), {{"bos_token", "<nope>"}});
  EXPECT_EQ(Tokenizer::Load(bad_bos).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, KnownIdsAndSpecialTokens) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_THAT(EncodeOk(*tok, "Hello world"), ElementsAre(19923, 2058));
  // add_bos_token is true in tokenizer_config.json, add_eos_token false.
  EXPECT_THAT(EncodeOk(*tok, "Hello world", true), ElementsAre(0, 19923, 2058));
  EXPECT_THAT(EncodeOk(*tok, "x<｜User｜>y"), ElementsAre(90, 128803, 91));
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok->num_ids(), 128815);
  EXPECT_EQ(tok->TokenToId("<｜User｜>"), 128803);
  EXPECT_EQ(tok->TokenToId("Ġworld"), 2058);
  EXPECT_EQ(tok->IdToToken(2058), "Ġworld");
  EXPECT_EQ(tok->TokenBytes(2058), " world");
  EXPECT_EQ(tok->IdToToken(128804), "<｜Assistant｜>");
  EXPECT_FALSE(tok->IdToToken(129000).has_value());
  EXPECT_FALSE(tok->TokenToId("no such token").has_value());
  EXPECT_TRUE(tok->IsSpecial(0));
  EXPECT_FALSE(tok->IsSpecial(128803));  // <｜User｜> is an added token but not special
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{0, 19923, 2058, 1}, /*skip_special_tokens=*/true),
            "Hello world");
  // Ids past the vocabulary (the embedding has 129280 rows) decode to nothing.
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{19923, 129279, 2058}), "Hello world");
  EXPECT_TRUE(EncodeOk(*tok, "").empty());
}

TEST(TokenizerTest, RejectsInvalidUtf8) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  for (std::string_view bad : {"\xFF", "ok\xC3", "\xED\xA0\x80" /* surrogate */,
                               "\xC0\xAF" /* overlong */, "\xF4\x90\x80\x80" /* > U+10FFFF */}) {
    EXPECT_EQ(tok->Encode(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(TokenizerTest, DecodeRoundTripsTheCorpus) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  const auto corpus = Corpus();
  ASSERT_GT(corpus.size(), 50u);
  for (const std::string& text : corpus) {
    EXPECT_EQ(tok->Decode(EncodeOk(*tok, text)), text);
  }
}

// Feeds ids one at a time: every piece must be valid UTF-8 and all pieces must add up to
// Decode(ids).
std::string StreamDecode(const Tokenizer& tok, const std::vector<int32_t>& ids,
                         int* held_steps = nullptr) {
  StreamDecoder stream(&tok);
  std::string text;
  for (const int32_t id : ids) {
    const std::string piece = stream.Add(id);
    EXPECT_EQ(FindInvalidUtf8(piece), std::string::npos) << "id " << id;
    if (held_steps != nullptr && stream.pending_bytes() > 0) ++*held_steps;
    text += piece;
  }
  text += stream.Flush();
  EXPECT_EQ(stream.pending_bytes(), 0u);
  return text;
}

TEST(StreamDecoderTest, EmitsOnlyWholeCharactersAndMatchesDecode) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  int held_steps = 0;
  for (const std::string& text : Corpus()) {
    EXPECT_EQ(StreamDecode(*tok, EncodeOk(*tok, text), &held_steps), text);
  }
  EXPECT_GT(held_steps, 0) << "the corpus should split some characters over tokens";
}

TEST(StreamDecoderTest, HoldsAPartialCharacterUntilItCompletes) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  // U+2070E (CJK extension B) is rare enough to be spelled with byte tokens.
  const std::vector<int32_t> ids = EncodeOk(*tok, "\xF0\xA0\x9C\x8E");
  ASSERT_GT(ids.size(), 1u);
  StreamDecoder stream(tok);
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    EXPECT_EQ(stream.Add(ids[i]), "");
    EXPECT_GT(stream.pending_bytes(), 0u);
  }
  EXPECT_EQ(stream.Add(ids.back()), "\xF0\xA0\x9C\x8E");
  EXPECT_EQ(stream.Flush(), "");
}

TEST(StreamDecoderTest, BrokenSequencesBecomeReplacementCharacters) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  const int32_t lead = *tok->TokenToId(ByteLevelChar(0xE4));  // needs two more bytes
  const int32_t cont = *tok->TokenToId(ByteLevelChar(0xB8));
  const int32_t a = *tok->TokenToId("a");
  const std::vector<std::vector<int32_t>> cases = {{lead, a},       {lead, cont, a}, {a, lead},
                                                   {cont, cont, a}, {lead, 128803},  {lead, cont}};
  for (const auto& ids : cases) {
    const std::string decoded = tok->Decode(ids);
    EXPECT_NE(decoded.find("\xEF\xBF\xBD"), std::string::npos);
    EXPECT_EQ(StreamDecode(*tok, ids), decoded);
  }
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{lead, cont, a}),
            "\xEF\xBF\xBD"
            "a");
}

TEST(StreamDecoderTest, SkipsSpecialTokensWhenAsked) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  StreamDecoder stream(tok, /*skip_special_tokens=*/true);
  EXPECT_EQ(stream.Add(0) + stream.Add(19923) + stream.Add(1), "Hello");
}

TEST(TokenizerTest, ConstMethodsAreThreadSafe) {
  STRATA_REQUIRE_REAL_TOKENIZER(tok);
  const auto corpus = Corpus();
  std::vector<std::vector<int32_t>> expected;
  for (const auto& text : corpus) expected.push_back(EncodeOk(*tok, text));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (size_t i = 0; i < corpus.size(); ++i) {
        auto ids = tok->Encode(corpus[i]);
        if (!ids.ok() || *ids != expected[i] || tok->Decode(*ids) != corpus[i]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace strata::tokenizer
