#include "compute_nodes/model/make_random.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/paths.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1).
double Uniform(uint64_t& state) {
  return (static_cast<double>(SplitMix64(state) >> 11) + 0.5) * 0x1p-53;
}

TensorToWrite Generate(const TensorSpec& spec, const ModelConfig& c, uint64_t seed) {
  TensorToWrite t;
  t.name = spec.name;
  t.dtype = DType::kBF16;
  t.shape = spec.shape;
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  t.data.resize(n * 2);
  uint64_t state = seed * 0x2545f4914f6cdd1dull ^ Fnv1a(spec.name);
  const int64_t fan_in = spec.shape.size() == 2 ? spec.shape[1] : 1;
  const bool embedding = spec.name == "model.embed_tokens.weight";
  const double std = embedding ? 1.0 : 1.0 / std::sqrt(static_cast<double>(fan_in));
  // tiny keeps a zero correction bias (the zero-bias tie case); other presets a non-zero one.
  const bool zero_bias = spec.init == InitKind::kBias && c.hidden_size <= 64;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    switch (spec.init) {
      case InitKind::kOnesish:
        v = static_cast<float>(1.0 + 0.2 * (Uniform(state) - 0.5));
        break;
      case InitKind::kBias:
        // Non-negative so that sigmoid score + bias stays positive: the routing then never
        // depends on how masked-out groups are filled.
        v = zero_bias ? 0.0f : static_cast<float>(0.15 * Uniform(state));
        break;
      case InitKind::kNormal:
      default: {
        const double u1 = Uniform(state), u2 = Uniform(state);
        v = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
      }
    }
    const uint16_t b = FloatToBf16(v);
    std::memcpy(t.data.data() + 2 * i, &b, 2);
  }
  return t;
}

ModelConfig Base() {
  ModelConfig c;
  c.vocab_size = 129280;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 10000.0;
  return c;
}

}  // namespace

std::vector<std::string> PresetNames() {
  return {"tiny", "small-v3", "small-v2", "v2-lite-shape", "v3-shape-4l"};
}

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  ModelConfig c = Base();
  if (name == "tiny") {
    // Seconds on CPU. DeepSeek-V3 routing with a zero correction bias (ties resolved by score).
    c.type = ModelType::kDeepseekV3;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 2;
    c.first_k_dense_replace = 1;
    c.num_attention_heads = 2;
    c.q_lora_rank = 32;
    c.qk_nope_head_dim = 32;
    c.v_head_dim = 32;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.n_group = 2;
    c.topk_group = 1;
    c.scoring_func = ScoringFunc::kSigmoid;
    c.topk_method = TopkMethod::kNoauxTc;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 1.5;
    c.max_position_embeddings = 2048;
  } else if (name == "small-v3") {
    c.type = ModelType::kDeepseekV3;
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.moe_intermediate_size = 64;
    c.num_hidden_layers = 3;
    c.first_k_dense_replace = 1;
    c.num_attention_heads = 4;
    c.q_lora_rank = 96;
    c.qk_nope_head_dim = 32;
    c.v_head_dim = 48;
    c.n_routed_experts = 16;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 4;
    c.n_group = 4;
    c.topk_group = 2;
    c.scoring_func = ScoringFunc::kSigmoid;
    c.topk_method = TopkMethod::kNoauxTc;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.max_position_embeddings = 2048;
    c.rope.yarn = true;
    c.rope.factor = 4.0;
    c.rope.original_max_position_embeddings = 512;
    c.rope.beta_fast = 32.0;
    c.rope.beta_slow = 1.0;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 0.8;
  } else if (name == "small-v2") {
    c.type = ModelType::kDeepseekV2;
    c.rope_layout = RopeLayout::kInterleaved;
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.moe_intermediate_size = 64;
    c.num_hidden_layers = 3;
    c.first_k_dense_replace = 1;
    c.num_attention_heads = 4;
    c.q_lora_rank = 0;
    c.qk_nope_head_dim = 32;
    c.v_head_dim = 32;
    c.n_routed_experts = 16;
    c.n_shared_experts = 2;
    c.num_experts_per_tok = 3;
    c.n_group = 4;
    c.topk_group = 2;
    c.scoring_func = ScoringFunc::kSoftmax;
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 2.0;
    c.max_position_embeddings = 2048;
  } else if (name == "v2-lite-shape") {
    c.type = ModelType::kDeepseekV2;
    c.rope_layout = RopeLayout::kInterleaved;
    c.hidden_size = 2048;
    c.intermediate_size = 10944;
    c.moe_intermediate_size = 1408;
    c.num_hidden_layers = 27;
    c.first_k_dense_replace = 1;
    c.num_attention_heads = 16;
    c.q_lora_rank = 0;
    c.qk_nope_head_dim = 128;
    c.v_head_dim = 128;
    c.n_routed_experts = 64;
    c.n_shared_experts = 2;
    c.num_experts_per_tok = 6;
    c.n_group = 1;
    c.topk_group = 1;
    c.scoring_func = ScoringFunc::kSoftmax;
    c.topk_method = TopkMethod::kGreedy;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 1.0;
    c.max_position_embeddings = 163840;
    c.rope.yarn = true;
    c.rope.factor = 40.0;
    c.rope.original_max_position_embeddings = 4096;
    c.rope.mscale = 0.707;
    c.rope.mscale_all_dim = 0.707;
  } else if (name == "v3-shape-4l") {
    c.type = ModelType::kDeepseekV3;
    c.hidden_size = 7168;
    c.intermediate_size = 18432;
    c.moe_intermediate_size = 2048;
    c.num_hidden_layers = 4;
    c.first_k_dense_replace = 3;
    c.num_attention_heads = 128;
    c.q_lora_rank = 1536;
    c.qk_nope_head_dim = 128;
    c.v_head_dim = 128;
    c.n_routed_experts = 256;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 8;
    c.n_group = 8;
    c.topk_group = 4;
    c.scoring_func = ScoringFunc::kSigmoid;
    c.topk_method = TopkMethod::kNoauxTc;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.max_position_embeddings = 163840;
    c.rope.yarn = true;
    c.rope.factor = 40.0;
    c.rope.original_max_position_embeddings = 4096;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 1.0;
  } else {
    return absl::InvalidArgumentError(
        StrCat("unknown preset '", name, "' (", StrJoin(PresetNames(), ", "), ")"));
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

absl::Status MakeRandomCheckpoint(const ModelConfig& config, const MakeRandomOptions& options,
                                  const std::string& dir) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(StrCat("cannot create ", dir, ": ", ec.message()));
  const std::vector<TensorSpec> specs = CheckpointTensors(config);
  std::vector<TensorToWrite> tensors(specs.size());
  // Tensors are independent streams, so they can be drawn in parallel without changing bytes.
  // Every hardware thread: the large presets are ~30 GB of normal draws.
  const size_t workers = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = w; i < specs.size(); i += workers) {
        tensors[i] = Generate(specs[i], config, options.seed);
      }
    });
  }
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(WriteCheckpointTensors(dir, tensors, options.shard_bytes));
  {
    std::ofstream out(fs::path(dir) / "config.json", std::ios::trunc);
    out << ModelConfigToJson(config);
    std::ofstream gen(fs::path(dir) / "generation_config.json", std::ios::trunc);
    gen << "{\n  \"bos_token_id\": " << config.bos_token_id
        << ",\n  \"eos_token_id\": " << config.eos_token_id << ",\n  \"do_sample\": false\n}\n";
    if (!out || !gen) return absl::InternalError(StrCat("writing config.json in ", dir));
  }
  const std::string tok_dir =
      options.tokenizer_dir.empty() ? DeepSeekV3TokenizerDir() : options.tokenizer_dir;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    const fs::path src = fs::path(tok_dir) / f;
    if (!fs::exists(src)) {
      if (options.require_tokenizer) {
        return absl::NotFoundError(StrCat(
            src.string(), " not found (run scripts/fetch-npm.sh or set STRATA_TOKENIZER_DIR)"));
      }
      spdlog::warn("tokenizer file {} not found; checkpoint written without it", src.string());
      continue;
    }
    fs::copy_file(src, fs::path(dir) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(StrCat("copying ", src.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace strata::model
