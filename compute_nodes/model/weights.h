// Model weights in fp32, loaded from a Hugging Face DeepSeek-V2/V3 directory, and the list of
// tensors such a checkpoint holds (shared by the loader and `strata model make-random`).
//
// Tensor names are Hugging Face's (model.layers.L.self_attn.kv_a_proj_with_mqa.weight,
// model.layers.L.mlp.experts.E.gate_proj.weight, ...). Fused expert tensors as transformers 5.x
// keeps them in memory (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]) are
// accepted as well. ModelWeights is immutable after loading and safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/block_key.h"
#include "compute_nodes/model/model_config.h"

namespace strata::model {

// y[n][out] = x[n][in] · Wᵀ, W row-major [out][in] as in torch.nn.Linear.
struct Linear {
  int64_t out = 0;
  int64_t in = 0;
  std::vector<float> w;
};

struct Mlp {
  Linear gate, up, down;
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;
  // Attention (MLA).
  Linear q_proj;  // without q_lora_rank
  Linear q_a_proj, q_b_proj;
  std::vector<float> q_a_norm;
  Linear kv_a_proj;  // [kv_lora_rank + rope_dim, hidden]
  std::vector<float> kv_a_norm;
  Linear kv_b_proj;  // [heads * (nope + v), kv_lora_rank]
  Linear o_proj;
  // Feed-forward: dense, or MoE (router + experts + shared experts).
  bool moe = false;
  Mlp dense;
  Linear router;                  // [n_routed_experts, hidden]
  std::vector<float> score_bias;  // e_score_correction_bias, empty when absent
  std::vector<Mlp> experts;
  bool has_shared = false;
  Mlp shared;
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> embed;  // [vocab][hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  Linear lm_head;
  ModelFingerprint fingerprint;  // SHA-256 over config.json and every tensor
};

enum class InitKind { kNormal, kOnesish, kBias };
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  InitKind init = InitKind::kNormal;
};

// Every tensor of a checkpoint for `config`, in a fixed order.
std::vector<TensorSpec> CheckpointTensors(const ModelConfig& config);

class TensorStore;
// SHA-256 over config.json's text and every stored tensor (name, dtype, shape, bytes): the model
// identity in KV block keys. Backends that do not go through LoadModel call it directly.
ModelFingerprint CheckpointFingerprint(const std::string& config_text, const TensorStore& store);

// Loads config.json and the safetensors of `dir`.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& dir);

}  // namespace strata::model
