// DeepSeek-V2/V3 model configuration, read from a Hugging Face `config.json`.
//
// Both config forms are accepted: the original one (`rope_theta` + `rope_scaling`) and the
// transformers 5.x one (`rope_parameters`, where `head_dim` is the RoPE dimension, not the head
// size). Everything the forward pass needs is resolved here once, so the layers never look at JSON.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::model {

enum class ModelType { kDeepseekV2, kDeepseekV3 };
enum class ScoringFunc { kSoftmax, kSigmoid };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

// Where the two halves of each rotated RoPE pair sit in q_pe/k_pe after rotation, as the Hugging
// Face implementation leaves them (and hence how k_pe is stored in the cache and in blocks):
//  - kInterleaved: pair i is lanes (2i, 2i+1) before and after (DeepSeek-V2, complex form);
//  - kDeinterleaved: lanes are permuted to [even lanes | odd lanes] first, then rotated as halves
//    (DeepSeek-V3 with rope_interleave = true, the default);
//  - kHalves: pair i is lanes (i, i + d/2), no permutation (DeepSeek-V3, rope_interleave = false).
enum class RopeLayout { kInterleaved, kDeinterleaved, kHalves };

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;  // else default RoPE
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: absent
  double mscale_all_dim = 0.0;    // 0: absent
  double attention_factor = 0.0;  // 0: derived (HF's rule)
  bool truncate = true;
};

struct ModelConfig {
  ModelType type = ModelType::kDeepseekV3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t n_shared_experts = 0;
  int64_t n_routed_experts = 0;  // 0: no MoE layers
  int64_t num_experts_per_tok = 0;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;
  TopkMethod topk_method = TopkMethod::kNoauxTc;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t q_lora_rank = 0;  // 0: no q compression (q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  RopeLayout rope_layout = RopeLayout::kDeinterleaved;
  RopeConfig rope;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool IsMoeLayer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace &&
           layer % (moe_layer_freq > 0 ? moe_layer_freq : 1) == 0;
  }
  // YaRN attention-factor applied to cos/sin (1 without YaRN), as transformers computes it.
  double RopeAttentionFactor() const;
  // 1/sqrt(qk_head_dim) × mscale(factor, mscale_all_dim)²: the softmax scale, in both the MHA and
  // the absorbed MQA form.
  double SoftmaxScale() const;
};

// Parses config.json text. InvalidArgument with the offending field on any inconsistency.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);
absl::Status ValidateModelConfig(const ModelConfig& config);

// config.json in the original form (rope_theta + rope_scaling), loadable by transformers.
std::string ModelConfigToJson(const ModelConfig& config);

std::string_view ModelTypeName(ModelType type);

}  // namespace strata::model
