#include "compute_nodes/model/weights.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "common/sha256.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/model/safetensors.h"

namespace strata::model {
namespace {

std::string LayerPrefix(int64_t l) { return StrCat("model.layers.", l, "."); }

void AddMlp(std::vector<TensorSpec>& out, const std::string& p, int64_t hidden, int64_t inter) {
  out.push_back({p + "gate_proj.weight", {inter, hidden}});
  out.push_back({p + "up_proj.weight", {inter, hidden}});
  out.push_back({p + "down_proj.weight", {hidden, inter}});
}

absl::StatusOr<Linear> LoadLinear(const TensorStore& s, const std::string& name, int64_t out,
                                  int64_t in) {
  Linear l{out, in, {}};
  const int64_t shape[2] = {out, in};
  ASSIGN_OR_RETURN(l.w, s.LoadFloat(name, shape));
  return l;
}

absl::StatusOr<std::vector<float>> LoadVector(const TensorStore& s, const std::string& name,
                                              int64_t n) {
  const int64_t shape[1] = {n};
  return s.LoadFloat(name, shape);
}

absl::StatusOr<Mlp> LoadMlp(const TensorStore& s, const std::string& p, int64_t hidden,
                            int64_t inter) {
  Mlp m;
  ASSIGN_OR_RETURN(m.gate, LoadLinear(s, p + "gate_proj.weight", inter, hidden));
  ASSIGN_OR_RETURN(m.up, LoadLinear(s, p + "up_proj.weight", inter, hidden));
  ASSIGN_OR_RETURN(m.down, LoadLinear(s, p + "down_proj.weight", hidden, inter));
  return m;
}

// Experts stored fused, as transformers 5.x holds them: gate_up_proj [E, 2I, H] (gate rows
// first), down_proj [E, H, I].
absl::StatusOr<std::vector<Mlp>> LoadFusedExperts(const TensorStore& s, const std::string& p,
                                                  int64_t experts, int64_t hidden, int64_t inter) {
  const int64_t gu_shape[3] = {experts, 2 * inter, hidden};
  const int64_t d_shape[3] = {experts, hidden, inter};
  ASSIGN_OR_RETURN(std::vector<float> gu, s.LoadFloat(p + "gate_up_proj", gu_shape));
  ASSIGN_OR_RETURN(std::vector<float> d, s.LoadFloat(p + "down_proj", d_shape));
  std::vector<Mlp> out(experts);
  const int64_t half = inter * hidden;
  for (int64_t e = 0; e < experts; ++e) {
    const float* base = gu.data() + e * 2 * half;
    out[e].gate = {inter, hidden, std::vector<float>(base, base + half)};
    out[e].up = {inter, hidden, std::vector<float>(base + half, base + 2 * half)};
    const float* db = d.data() + e * half;
    out[e].down = {hidden, inter, std::vector<float>(db, db + half)};
  }
  return out;
}

}  // namespace

std::vector<TensorSpec> CheckpointTensors(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = LayerPrefix(l);
    out.push_back({p + "input_layernorm.weight", {h}, InitKind::kOnesish});
    out.push_back({p + "post_attention_layernorm.weight", {h}, InitKind::kOnesish});
    const std::string a = p + "self_attn.";
    // The two projections of the layer's normed input adjacent (q_proj or q_a_proj, then
    // kv_a_proj_with_mqa): the CUDA backend runs them as one.
    out.push_back(c.q_lora_rank > 0
                      ? TensorSpec{a + "q_a_proj.weight", {c.q_lora_rank, h}}
                      : TensorSpec{a + "q_proj.weight", {heads * c.qk_head_dim(), h}});
    out.push_back({a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h}});
    if (c.q_lora_rank > 0) {
      out.push_back({a + "q_a_layernorm.weight", {c.q_lora_rank}, InitKind::kOnesish});
      out.push_back({a + "q_b_proj.weight", {heads * c.qk_head_dim(), c.q_lora_rank}});
    }
    out.push_back({a + "kv_a_layernorm.weight", {c.kv_lora_rank}, InitKind::kOnesish});
    out.push_back(
        {a + "kv_b_proj.weight", {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}});
    out.push_back({a + "o_proj.weight", {h, heads * c.v_head_dim}});
    const std::string m = p + "mlp.";
    if (c.IsMoeLayer(l)) {
      out.push_back({m + "gate.weight", {c.n_routed_experts, h}});
      if (c.type == ModelType::kDeepseekV3) {
        out.push_back({m + "gate.e_score_correction_bias", {c.n_routed_experts}, InitKind::kBias});
      }
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        AddMlp(out, StrCat(m, "experts.", e, "."), h, c.moe_intermediate_size);
      }
      if (c.n_shared_experts > 0) {
        AddMlp(out, m + "shared_experts.", h, c.moe_intermediate_size * c.n_shared_experts);
      }
    } else {
      AddMlp(out, m, h, c.intermediate_size);
    }
  }
  out.push_back({"model.norm.weight", {h}, InitKind::kOnesish});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

ModelFingerprint CheckpointFingerprint(const std::string& config_text, const TensorStore& s) {
  // The fingerprint covers the config text and every stored tensor (name, dtype, shape, bytes).
  Sha256 sha;
  sha.Update("strata-model-fingerprint-v1");
  sha.Update(config_text);
  for (const auto& [name, t] : s.tensors()) {
    sha.Update(name);
    sha.Update(DTypeName(t.dtype));
    for (int64_t d : t.shape) sha.Update(&d, sizeof(d));
    sha.Update(t.data, t.bytes);
  }
  ModelFingerprint f;
  f.bytes = sha.Final();
  return f;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& dir) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(const std::string config_text, ReadFile(config_path));
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN_WITH(w->config, ParseModelConfig(config_text), config_path);
  const ModelConfig& c = w->config;
  ASSIGN_OR_RETURN(std::unique_ptr<TensorStore> store, TensorStore::Open(dir));
  const TensorStore& s = *store;

  w->fingerprint = CheckpointFingerprint(config_text, s);

  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  {
    const int64_t shape[2] = {c.vocab_size, h};
    ASSIGN_OR_RETURN(w->embed, s.LoadFloat("model.embed_tokens.weight", shape));
  }
  w->layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& L = w->layers[l];
    const std::string p = LayerPrefix(l);
    ASSIGN_OR_RETURN(L.input_norm, LoadVector(s, p + "input_layernorm.weight", h));
    ASSIGN_OR_RETURN(L.post_attention_norm,
                     LoadVector(s, p + "post_attention_layernorm.weight", h));
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank > 0) {
      ASSIGN_OR_RETURN(L.q_a_proj, LoadLinear(s, a + "q_a_proj.weight", c.q_lora_rank, h));
      ASSIGN_OR_RETURN(L.q_a_norm, LoadVector(s, a + "q_a_layernorm.weight", c.q_lora_rank));
      ASSIGN_OR_RETURN(
          L.q_b_proj, LoadLinear(s, a + "q_b_proj.weight", heads * c.qk_head_dim(), c.q_lora_rank));
    } else {
      ASSIGN_OR_RETURN(L.q_proj, LoadLinear(s, a + "q_proj.weight", heads * c.qk_head_dim(), h));
    }
    ASSIGN_OR_RETURN(L.kv_a_proj, LoadLinear(s, a + "kv_a_proj_with_mqa.weight",
                                             c.kv_lora_rank + c.qk_rope_head_dim, h));
    ASSIGN_OR_RETURN(L.kv_a_norm, LoadVector(s, a + "kv_a_layernorm.weight", c.kv_lora_rank));
    ASSIGN_OR_RETURN(L.kv_b_proj,
                     LoadLinear(s, a + "kv_b_proj.weight",
                                heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank));
    ASSIGN_OR_RETURN(L.o_proj, LoadLinear(s, a + "o_proj.weight", h, heads * c.v_head_dim));
    const std::string m = p + "mlp.";
    L.moe = c.IsMoeLayer(l);
    if (!L.moe) {
      ASSIGN_OR_RETURN(L.dense, LoadMlp(s, m, h, c.intermediate_size));
      continue;
    }
    ASSIGN_OR_RETURN(L.router, LoadLinear(s, m + "gate.weight", c.n_routed_experts, h));
    if (s.Find(m + "gate.e_score_correction_bias") != nullptr) {
      ASSIGN_OR_RETURN(L.score_bias,
                       LoadVector(s, m + "gate.e_score_correction_bias", c.n_routed_experts));
    } else if (c.topk_method == TopkMethod::kNoauxTc && c.type == ModelType::kDeepseekV3) {
      return absl::InvalidArgumentError(
          StrCat("missing tensor ", m, "gate.e_score_correction_bias (needed by noaux_tc)"));
    }
    if (s.Find(m + "experts.gate_up_proj") != nullptr) {
      ASSIGN_OR_RETURN(L.experts, LoadFusedExperts(s, m + "experts.", c.n_routed_experts, h,
                                                   c.moe_intermediate_size));
    } else {
      L.experts.resize(c.n_routed_experts);
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        ASSIGN_OR_RETURN(L.experts[e],
                         LoadMlp(s, StrCat(m, "experts.", e, "."), h, c.moe_intermediate_size));
      }
    }
    if (c.n_shared_experts > 0) {
      L.has_shared = true;
      ASSIGN_OR_RETURN(L.shared, LoadMlp(s, m + "shared_experts.", h,
                                         c.moe_intermediate_size * c.n_shared_experts));
    }
  }
  ASSIGN_OR_RETURN(w->final_norm, LoadVector(s, "model.norm.weight", h));
  if (c.tie_word_embeddings && s.Find("lm_head.weight") == nullptr) {
    w->lm_head = {c.vocab_size, h, w->embed};
  } else {
    ASSIGN_OR_RETURN(w->lm_head, LoadLinear(s, "lm_head.weight", c.vocab_size, h));
  }
  return w;
}

}  // namespace strata::model
