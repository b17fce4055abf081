// CPU backend vs Hugging Face transformers 5.17 (fp32), from fixtures written on the device
// machine by scripts/hf_reference.py. Each test regenerates its checkpoint from the preset and
// seed recorded in the fixture, so the fixture holds only reference outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/runtime/generate.h"
#include "tests/compute_nodes/test_util.h"

namespace strata {
namespace {

using testutil::DecodeFloats;
using testutil::MaxAbsDiff;
using testutil::RelError;

constexpr double kLogitsTol = 1e-4;  // ‖Δ‖/‖ref‖, the target
constexpr double kCacheTol = 1e-5;   // max |Δ| of latent and k_pe

std::shared_ptr<const model::ModelWeights> MakeModel(const std::string& preset, uint64_t seed) {
  auto config = model::PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  const std::string dir = testing::TempDir() + "/hf_parity_" + preset;
  model::MakeRandomOptions options;
  options.seed = seed;
  EXPECT_TRUE(model::MakeRandomCheckpoint(*config, options, dir).ok());
  auto weights = model::LoadModel(dir);
  EXPECT_TRUE(weights.ok()) << weights.status();
  return std::shared_ptr<const model::ModelWeights>(std::move(*weights));
}

// Cold prefill of `ids` in one chunk; all positions' logits.
std::vector<float> ColdLogits(cpu::CpuEngine& engine, const std::vector<int32_t>& ids,
                              runtime::PageTable* pages) {
  EXPECT_TRUE(runtime::EnsureCapacity(engine.kv_pool(), *pages, ids.size()).ok());
  runtime::SequenceInput in{ids, 0, pages, true, runtime::AttentionForm::kMha};
  std::vector<runtime::SequenceOutput> out;
  EXPECT_TRUE(engine.Forward({&in, 1}, &out).ok());
  return out[0].logits;
}

class HfParityTest : public testing::TestWithParam<std::string> {};

TEST_P(HfParityTest, MatchesTransformers) {
  const nlohmann::json fx =
      testutil::ReadJson(testutil::FixtureDir() + "/hf_" + GetParam() + ".json");
  const std::string preset = fx["preset"];
  auto weights = MakeModel(preset, fx["seed"].get<uint64_t>());
  const model::ModelConfig& c = weights->config;
  const int64_t vocab = c.vocab_size;
  const int64_t stride = fx["subset_stride"];
  cpu::CpuEngine engine(weights, /*num_pages=*/8);

  for (size_t pi = 0; pi < fx["prompts"].size(); ++pi) {
    SCOPED_TRACE(testing::Message() << preset << " prompt " << pi);
    const auto& p = fx["prompts"][pi];
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    runtime::PageTable pages;
    const std::vector<float> logits = ColdLogits(engine, ids, &pages);

    // Logits: the vocabulary subset at every position, the full-vector norms, the top-8.
    const std::vector<float> ref_subset = DecodeFloats(p["subset_logits"]);
    const std::vector<float> ref_norms = DecodeFloats(p["norms"]);
    const std::vector<float> ref_top = DecodeFloats(p["top_values"]);
    const int64_t subset = (vocab + stride - 1) / stride;
    ASSERT_EQ(static_cast<int64_t>(ref_subset.size()), n * subset);
    std::vector<float> mine_subset, norms, top;
    for (int64_t t = 0; t < n; ++t) {
      const float* row = logits.data() + t * vocab;
      double ss = 0;
      for (int64_t v = 0; v < vocab; ++v) ss += static_cast<double>(row[v]) * row[v];
      norms.push_back(static_cast<float>(std::sqrt(ss)));
      for (int64_t v = 0; v < vocab; v += stride) mine_subset.push_back(row[v]);
      const auto& top_ids = p["top_ids"][t];
      EXPECT_EQ(std::max_element(row, row + vocab) - row, top_ids[0].get<int64_t>()) << t;
      for (const auto& id : top_ids) top.push_back(row[id.get<int64_t>()]);
    }
    EXPECT_LT(RelError(mine_subset.data(), ref_subset.data(), ref_subset.size()), kLogitsTol);
    EXPECT_LT(RelError(norms.data(), ref_norms.data(), norms.size()), kLogitsTol);
    EXPECT_LT(RelError(top.data(), ref_top.data(), top.size()), kLogitsTol);

    // Layer 0's cache: latent (after kv_a_layernorm) and k_pe (after RoPE, HF's lane order).
    if (p.contains("latent_layer0")) {
      const std::vector<float> ref_latent = DecodeFloats(p["latent_layer0"]);
      const std::vector<float> ref_kpe = DecodeFloats(p["k_pe_layer0"]);
      ASSERT_EQ(static_cast<int64_t>(ref_latent.size()), n * c.kv_lora_rank);
      ASSERT_EQ(static_cast<int64_t>(ref_kpe.size()), n * c.qk_rope_head_dim);
      const runtime::HostKvPool& pool = engine.kv_pool();
      EXPECT_LT(MaxAbsDiff(pool.Latent(pages.pages[0], 0), ref_latent.data(), ref_latent.size()),
                kCacheTol);
      EXPECT_LT(MaxAbsDiff(pool.KPe(pages.pages[0], 0), ref_kpe.data(), ref_kpe.size()), kCacheTol);
    }
    runtime::ReleasePages(engine.kv_pool(), pages);

    // Greedy continuation: prefill, then absorbed-form decode over the pages.
    runtime::SamplingParams sampling;
    sampling.max_tokens = static_cast<int64_t>(p["greedy"].size());
    auto gen = runtime::Generate(engine, ids, sampling, /*prefill_chunk=*/16);
    ASSERT_TRUE(gen.ok()) << gen.status();
    EXPECT_EQ(gen->tokens, p["greedy"].get<std::vector<int32_t>>());
    EXPECT_EQ(engine.kv_pool().free_pages(), engine.kv_pool().num_pages());
  }
}

// A prefix restored from block payloads gives the cold-prefill logits for the rest.
TEST_P(HfParityTest, PrefixCachedPrefillMatchesCold) {
  const nlohmann::json fx =
      testutil::ReadJson(testutil::FixtureDir() + "/hf_" + GetParam() + ".json");
  auto weights = MakeModel(fx["preset"], fx["seed"].get<uint64_t>());
  const int64_t vocab = weights->config.vocab_size;
  const auto& p = fx["prompts"][2];
  const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
  ASSERT_GT(ids.size(), 64u);
  const int64_t n = static_cast<int64_t>(ids.size());

  cpu::CpuEngine cold_engine(weights, 4);
  runtime::PageTable cold_pages;
  const std::vector<float> cold = ColdLogits(cold_engine, ids, &cold_pages);
  for (auto dtype : {runtime::PayloadDtype::kF32, runtime::PayloadDtype::kBf16}) {
    std::vector<uint8_t> block;
    ASSERT_TRUE(cold_engine.kv_pool().ExportPage(cold_pages.pages[0], dtype, &block).ok());

    cpu::CpuEngine warm_engine(weights, 4);
    runtime::PageTable pages;
    ASSERT_TRUE(runtime::EnsureCapacity(warm_engine.kv_pool(), pages, n).ok());
    ASSERT_TRUE(warm_engine.kv_pool().ImportPage(pages.pages[0], dtype, block).ok());
    const std::vector<int32_t> rest(ids.begin() + 64, ids.end());
    runtime::SequenceInput in{rest, 64, &pages, true, runtime::AttentionForm::kMha};
    std::vector<runtime::SequenceOutput> out;
    ASSERT_TRUE(warm_engine.Forward({&in, 1}, &out).ok());
    const float* cold_rest = cold.data() + 64 * vocab;
    const double err = RelError(out[0].logits.data(), cold_rest, (n - 64) * vocab);
    if (dtype == runtime::PayloadDtype::kF32) {
      EXPECT_LT(err, 1e-5) << "fp32 payload";
      // And the last position still matches HF.
      std::vector<float> top;
      for (const auto& id : p["top_ids"][n - 1])
        top.push_back(out[0].logits[(n - 65) * vocab + id.get<int64_t>()]);
      const std::vector<float> ref_top = DecodeFloats(p["top_values"]);
      EXPECT_LT(RelError(top.data(), ref_top.data() + (n - 1) * 8, 8), kLogitsTol);
    } else {
      // bf16 blocks (format codec 1) round the prefix's latents: close, not equal.
      EXPECT_LT(err, 2e-2) << "bf16 payload";
      EXPECT_GT(err, 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, HfParityTest, testing::Values("tiny", "small_v3", "small_v2"));

// Checkpoints written by transformers' own save_pretrained (bf16, rope_parameters form with
// head_dim = rope dim, per-expert tensor names) load and match.
class HfSavedTest : public testing::TestWithParam<std::string> {};

TEST_P(HfSavedTest, LoadsSavePretrainedCheckpoint) {
  const std::string dir = testutil::FixtureDir() + "/hf_saved_" + GetParam() + "_ckpt";
  const nlohmann::json ref = testutil::ReadJson(dir + "/strata_reference.json");
  auto weights = model::LoadModel(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::shared_ptr<const model::ModelWeights> w(std::move(*weights));
  cpu::CpuEngine engine(w, 2);
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  runtime::PageTable pages;
  const std::vector<float> logits = ColdLogits(engine, ids, &pages);
  const std::vector<float> expected = DecodeFloats(ref["logits"]);
  ASSERT_EQ(logits.size(), expected.size());
  EXPECT_LT(RelError(logits.data(), expected.data(), expected.size()), kLogitsTol);
}

INSTANTIATE_TEST_SUITE_P(Versions, HfSavedTest, testing::Values("v2", "v3"));

}  // namespace
}  // namespace strata
