// Config parsing (both forms, validation), safetensors I/O, random checkpoints, fingerprints,
// the FLOP count of a forward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "compute_nodes/model/flops.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/model_config.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"
#include "tests/compute_nodes/test_util.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ModelConfigTest, OriginalFormWithYarn) {
  auto c = PresetConfig("small-v3");
  ASSERT_TRUE(c.ok());
  auto parsed = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->type, ModelType::kDeepseekV3);
  EXPECT_EQ(parsed->q_lora_rank, 96);
  EXPECT_EQ(parsed->qk_rope_head_dim, 64);
  EXPECT_EQ(parsed->rope_layout, RopeLayout::kDeinterleaved);
  EXPECT_TRUE(parsed->rope.yarn);
  EXPECT_EQ(parsed->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(parsed->scoring_func, ScoringFunc::kSigmoid);
  // mscale(s, m) = 0.1·m·ln s + 1; softmax scale = qk^-0.5 · mscale(4, 0.8)².
  const double m_all = 0.1 * 0.8 * std::log(4.0) + 1.0;
  const double m = 0.1 * 1.0 * std::log(4.0) + 1.0;
  EXPECT_NEAR(parsed->SoftmaxScale(), m_all * m_all / std::sqrt(96.0), 1e-12);
  EXPECT_NEAR(parsed->RopeAttentionFactor(), m / m_all, 1e-12);
}

// transformers 5.x writes rope_parameters and head_dim (= the RoPE dimension).
TEST(ModelConfigTest, RopeParametersFormFromSavePretrained) {
  auto c = LoadModelConfig(testutil::FixtureDir() + "/hf_saved_v3_ckpt/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->qk_rope_head_dim, 16);
  EXPECT_EQ(c->qk_nope_head_dim, 16);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_DOUBLE_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c->rope.mscale_all_dim, 0.8);
  EXPECT_EQ(c->q_lora_rank, 24);
  auto v2 = LoadModelConfig(testutil::FixtureDir() + "/hf_saved_v2_ckpt/config.json");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->type, ModelType::kDeepseekV2);
  EXPECT_EQ(v2->q_lora_rank, 0);
  EXPECT_FALSE(v2->rope.yarn);
  EXPECT_EQ(v2->rope_layout, RopeLayout::kInterleaved);
  EXPECT_EQ(v2->topk_method, TopkMethod::kGroupLimitedGreedy);
}

TEST(ModelConfigTest, RejectsBadConfigsWithTheField) {
  const std::string good = ModelConfigToJson(*PresetConfig("tiny"));
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(good);
    if (value.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return ParseModelConfig(j.dump());
  };
  struct Case {
    std::string key;
    nlohmann::json value;
    std::string expect;
  } cases[] = {
      {"model_type", "llama", "model_type"},
      {"hidden_size", nlohmann::json(nlohmann::json::value_t::discarded), "hidden_size"},
      {"n_group", 3, "n_group"},
      {"topk_group", 5, "topk_group"},
      {"head_dim", 48, "head_dim"},
      {"qk_rope_head_dim", 63, "qk_rope_head_dim"},
      {"scoring_func", "relu", "scoring_func"},
      {"topk_method", "random", "topk_method"},
      {"rope_scaling", nlohmann::json{{"type", "longrope"}}, "rope type"},
      {"num_experts_per_tok", 9, "num_experts_per_tok"},
      {"hidden_size", "big", "hidden_size"},
  };
  for (const auto& c : cases) {
    auto r = with(c.key, c.value);
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find(c.expect), std::string::npos) << r.status();
  }
  EXPECT_FALSE(ParseModelConfig("not json").ok());
  EXPECT_EQ(LoadModelConfig("/nonexistent/config.json").status().code(),
            absl::StatusCode::kNotFound);
  // head_dim equal to the rope dim (5.x) or to the whole qk head is accepted.
  EXPECT_TRUE(with("head_dim", 64).ok());
  EXPECT_TRUE(with("head_dim", 96).ok());
}

TEST(SafetensorsTest, RoundTripsDtypesAndShards) {
  const std::string dir = testing::TempDir() + "/safetensors_rt";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<TensorToWrite> ts;
  const float values[4] = {1.5f, -2.25f, 0.0f, 65504.0f};
  for (int i = 0; i < 3; ++i) {
    TensorToWrite t;
    t.name = "t" + std::to_string(i);
    t.dtype = i == 0 ? DType::kF32 : (i == 1 ? DType::kBF16 : DType::kF16);
    t.shape = {2, 2};
    for (float v : values) {
      if (t.dtype == DType::kF32) {
        const auto* b = reinterpret_cast<const uint8_t*>(&v);
        t.data.insert(t.data.end(), b, b + 4);
      } else {
        uint16_t h = 0;
        if (t.dtype == DType::kBF16) {
          h = FloatToBf16(v);
        } else {  // fp16 encodings of the values
          h = v == 1.5f ? 0x3e00 : v == -2.25f ? 0xc080 : v == 0.0f ? 0x0000 : 0x7bff;
        }
        t.data.push_back(h & 0xff);
        t.data.push_back(h >> 8);
      }
    }
    ts.push_back(std::move(t));
  }
  // 16-byte shards: three files plus an index.
  ASSERT_TRUE(WriteCheckpointTensors(dir, ts, 16).ok());
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  auto store = TensorStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 3; ++i) {
    const int64_t shape[2] = {2, 2};
    auto v = (*store)->LoadFloat("t" + std::to_string(i), shape);
    ASSERT_TRUE(v.ok()) << v.status();
    const float expect_last = i == 1 ? 65536.0f : 65504.0f;  // bf16 rounds 65504 up
    EXPECT_EQ((*v)[0], 1.5f);
    EXPECT_EQ((*v)[1], -2.25f);
    EXPECT_EQ((*v)[2], 0.0f);
    EXPECT_EQ((*v)[3], expect_last) << i;
  }
  const int64_t wrong[2] = {4, 1};
  EXPECT_FALSE((*store)->LoadFloat("t0", wrong).ok());
  EXPECT_FALSE((*store)->LoadFloat("absent", wrong).ok());
}

TEST(SafetensorsTest, RejectsCorruptFiles) {
  const std::string dir = testing::TempDir() + "/safetensors_bad";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream out(dir + "/model.safetensors", std::ios::binary);
    const uint64_t len = 1000;  // header claims more than the file holds
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << "{}";
  }
  EXPECT_EQ(TensorStore::Open(dir).status().code(), absl::StatusCode::kInvalidArgument);
  {
    std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
    const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
    const uint64_t len = h.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << h << "short";  // data truncated
  }
  EXPECT_EQ(TensorStore::Open(dir).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorStore::Open(testing::TempDir() + "/no_such_dir").status().code(),
            absl::StatusCode::kNotFound);
}

// A config small enough to count by hand: 2 layers (dense, then MoE), 2 heads of qk 3 + 1, v 2.
TEST(FlopsTest, PrefillCountsEveryMatrixProductByHand) {
  ModelConfig c;
  c.vocab_size = 10;
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.moe_intermediate_size = 7;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.n_shared_experts = 1;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  c.kv_lora_rank = 5;
  c.qk_nope_head_dim = 3;
  c.qk_rope_head_dim = 1;
  c.v_head_dim = 2;
  // 3 new tokens after 2 cached, logits of 1 row. Multiply-adds per layer: q 4*2*4 = 32, kv_a
  // 4*6 = 24, o 2*2*4 = 16 per new token; kv_b 5*2*5 = 50 per context token (5); attention 12
  // pairs (3*2 + 1+2+3) * 2 heads * (4 + 2); MLP 3*4*6 = 72 (dense) or router 4*8 + shared 84 +
  // 2 routed * 84 = 284 (MoE) per new token; LM head 4*10.
  const ForwardFlops f = PrefillFlops(c, 3, 2, 1);
  EXPECT_DOUBLE_EQ(f.projections, 2 * 2 * (3 * (32 + 24 + 16) + 5 * 50));
  EXPECT_DOUBLE_EQ(f.attention, 2 * 2 * (12 * 2 * 6));
  EXPECT_DOUBLE_EQ(f.mlp, 2 * (3 * 72 + 3 * 284));
  EXPECT_DOUBLE_EQ(f.lm_head, 2 * 40);
  EXPECT_DOUBLE_EQ(f.total(), 1864 + 576 + 2136 + 80);
  // With q compression (rank 3): q is 4*3 + 3*2*4 = 36 multiply-adds instead of 32.
  c.q_lora_rank = 3;
  EXPECT_DOUBLE_EQ(PrefillFlops(c, 3, 2, 1).projections - f.projections, 2 * 2 * 3 * 4);
}

TEST(MakeRandomTest, DeterministicShardedAndFingerprinted) {
  auto c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  const std::string a = testing::TempDir() + "/mr_a", b = testing::TempDir() + "/mr_b",
                    s = testing::TempDir() + "/mr_sharded", d = testing::TempDir() + "/mr_seed2";
  MakeRandomOptions o;
  o.seed = 5;
  ASSERT_TRUE(MakeRandomCheckpoint(*c, o, a).ok());
  ASSERT_TRUE(MakeRandomCheckpoint(*c, o, b).ok());
  EXPECT_EQ(ReadFile(a + "/model.safetensors"), ReadFile(b + "/model.safetensors"));
  EXPECT_EQ(ReadFile(a + "/config.json"), ReadFile(b + "/config.json"));
  MakeRandomOptions sharded = o;
  sharded.shard_bytes = 8 << 20;
  ASSERT_TRUE(MakeRandomCheckpoint(*c, sharded, s).ok());
  EXPECT_TRUE(fs::exists(s + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(s + "/model.safetensors"));
  MakeRandomOptions other = o;
  other.seed = 6;
  ASSERT_TRUE(MakeRandomCheckpoint(*c, other, d).ok());

  auto wa = LoadModel(a), ws = LoadModel(s), wd = LoadModel(d);
  ASSERT_TRUE(wa.ok() && ws.ok() && wd.ok());
  // The fingerprint covers tensors, not how they are sharded; another seed changes it.
  EXPECT_EQ((*wa)->fingerprint, (*ws)->fingerprint);
  EXPECT_NE((*wa)->fingerprint, (*wd)->fingerprint);
  EXPECT_EQ((*wa)->embed, (*ws)->embed);
  // Namespaces derive from the fingerprint (common/block_key.h).
  EXPECT_NE(MakeNamespace((*wa)->fingerprint, KvFormat{}, ""),
            MakeNamespace((*wd)->fingerprint, KvFormat{}, ""));
  // tiny keeps a zero correction bias; layer 1 is MoE, layer 0 dense.
  EXPECT_FALSE((*wa)->layers[0].moe);
  ASSERT_TRUE((*wa)->layers[1].moe);
  for (float v : (*wa)->layers[1].score_bias) EXPECT_EQ(v, 0.0f);
}

TEST(MakeRandomTest, EveryPresetIsValidAndUsesTheRealVocabulary) {
  for (const auto& name : PresetNames()) {
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->vocab_size, 129280) << name;
    EXPECT_EQ(c->kv_lora_rank, 512) << name;
    EXPECT_EQ(c->qk_rope_head_dim, 64) << name;
    auto round = ParseModelConfig(ModelConfigToJson(*c));
    ASSERT_TRUE(round.ok()) << name << round.status();
    EXPECT_EQ(round->num_hidden_layers, c->num_hidden_layers);
    EXPECT_EQ(round->SoftmaxScale(), c->SoftmaxScale());
  }
  EXPECT_FALSE(PresetConfig("huge").ok());
}

}  // namespace
}  // namespace strata::model
