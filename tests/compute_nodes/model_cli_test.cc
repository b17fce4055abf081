// `strata model make-random | logits` and `strata generate` as a user runs them.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/compute_nodes/test_util.h"
#include "tests/util/subprocess.h"

namespace strata {
namespace {

using Result = ::strata::testing_util::CommandResult;
using ::strata::testing_util::RunStrata;

// float32 [rows, cols] from a .npy; checks the header.
std::vector<float> ReadNpy(const std::string& path, int64_t rows, int64_t cols) {
  std::ifstream in(path, std::ios::binary);
  std::string raw(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(raw.substr(0, 6), "\x93NUMPY");
  const uint16_t hlen = static_cast<uint8_t>(raw[8]) | (static_cast<uint8_t>(raw[9]) << 8);
  const std::string header = raw.substr(10, hlen);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
  EXPECT_NE(header.find("(" + std::to_string(rows) + ", " + std::to_string(cols) + ")"),
            std::string::npos)
      << header;
  EXPECT_EQ((10 + hlen) % 64, 0);
  std::vector<float> out((raw.size() - 10 - hlen) / 4);
  std::memcpy(out.data(), raw.data() + 10 + hlen, out.size() * 4);
  EXPECT_EQ(static_cast<int64_t>(out.size()), rows * cols);
  return out;
}

TEST(ModelCliTest, LogitsOfASavePretrainedCheckpointMatchTransformers) {
  const std::string dir = testutil::FixtureDir() + "/hf_saved_v3_ckpt";
  const nlohmann::json ref = testutil::ReadJson(dir + "/strata_reference.json");
  const std::vector<int> ids = ref["ids"].get<std::vector<int>>();
  const std::string ids_file = testing::TempDir() + "/cli_ids.txt";
  {
    std::ofstream f(ids_file);
    for (int id : ids) f << id << "\n";
  }
  const std::string npy = testing::TempDir() + "/cli_logits.npy";
  const Result r =
      RunStrata("model logits --model " + dir + " --ids " + ids_file + " --out " + npy);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<float> mine = ReadNpy(npy, ids.size(), 256);
  const std::vector<float> expected = testutil::DecodeFloats(ref["logits"]);
  ASSERT_EQ(mine.size(), expected.size());
  EXPECT_LT(testutil::RelError(mine.data(), expected.data(), expected.size()), 1e-4);
}

TEST(ModelCliTest, MakeRandomThenGenerate) {
  const std::string dir = testing::TempDir() + "/cli_tiny";
  std::filesystem::remove_all(dir);
  Result r = RunStrata("model make-random --preset tiny --seed 3 --out " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
  r = RunStrata("generate --model " + dir + " --prompt-ids 0,100,200,300 --max-tokens 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("generated 5 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tok/s"), std::string::npos) << r.output;
  r = RunStrata("model logits --model " + dir + " --ids-list 1,2,3 --out " + dir + "/l.npy");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ReadNpy(dir + "/l.npy", 3, 129280);
}

// With the real tokenizer (copied into the checkpoint by make-random), --prompt takes text.
TEST(ModelCliTest, GenerateFromTextPrompt) {
  const std::string dir = testing::TempDir() + "/cli_tiny_text";
  std::filesystem::remove_all(dir);
  Result r = RunStrata("model make-random --preset tiny --seed 3 --out " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    GTEST_SKIP() << "DeepSeek-V3 tokenizer not installed (scripts/fetch-npm.sh)";
  }
  r = RunStrata("generate --model " + dir + " --prompt 'Hello, world' --max-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("generated 4 tokens"), std::string::npos) << r.output;
  r = RunStrata("generate --model " + dir + " --prompt hi --prompt-ids 1,2");
  EXPECT_NE(r.exit_code, 0);
}

// --config takes any valid DeepSeek config, here transformers 5.x's rope_parameters form.
TEST(ModelCliTest, MakeRandomFromAConfigFile) {
  const std::string dir = testing::TempDir() + "/cli_from_config";
  std::filesystem::remove_all(dir);
  Result r = RunStrata("model make-random --config " + testutil::FixtureDir() +
                       "/hf_saved_v3_ckpt/config.json --seed 4 --shard-mb 1 --out " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors")) << "below the shard size";
  const nlohmann::json written = testutil::ReadJson(dir + "/config.json");
  EXPECT_EQ(written["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(written["qk_rope_head_dim"], 16);
  EXPECT_EQ(written["vocab_size"], 256);
  r = RunStrata("model logits --model " + dir + " --ids-list 1,2,3,4 --out " + dir + "/l.npy");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ReadNpy(dir + "/l.npy", 4, 256);
  r = RunStrata("model make-random --preset tiny --config x.json --out " + dir);
  EXPECT_NE(r.exit_code, 0);
}

TEST(ModelCliTest, ErrorsExitNonZeroWithAMessage) {
  Result r = RunStrata("model make-random --preset nope --out " + testing::TempDir() + "/x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown preset"), std::string::npos) << r.output;
  r = RunStrata("model logits --model /nonexistent --ids-list 1 --out /tmp/never.npy");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent"), std::string::npos) << r.output;
  r = RunStrata("generate --model /nonexistent --prompt-ids x,y");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("bad token id"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace strata
