#include "compute_nodes/model/model_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"

namespace strata::model {
namespace {

using nlohmann::json;

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(StrCat("config.json: ", field, ": ", why));
}

// Reads an optional integer field; null or absent gives `fallback`.
absl::StatusOr<int64_t> GetInt(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_number_integer() || it->is_number_unsigned()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (v == std::floor(v)) return static_cast<int64_t>(v);
  }
  return Bad(key, "expected an integer");
}

absl::StatusOr<int64_t> GetRequiredInt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Bad(key, "missing");
  return GetInt(j, key, 0);
}

absl::StatusOr<double> GetDouble(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return Bad(key, "expected a number");
  return it->get<double>();
}

absl::StatusOr<bool> GetBool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Bad(key, "expected true or false");
  return it->get<bool>();
}

std::string GetString(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

// mscale of YaRN as DeepSeek and transformers define it.
double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

absl::Status ParseRope(const json& rope, bool new_form, ModelConfig& c) {
  if (rope.is_null()) return absl::OkStatus();
  if (!rope.is_object()) return Bad(new_form ? "rope_parameters" : "rope_scaling", "not an object");
  std::string type = GetString(rope, "rope_type", GetString(rope, "type", "default"));
  if (new_form) {
    ASSIGN_OR_RETURN(c.rope.theta, GetDouble(rope, "rope_theta", c.rope.theta));
  }
  if (type == "default") return absl::OkStatus();
  if (type != "yarn")
    return Bad("rope type", StrCat("'", type, "' is not supported (default, yarn)"));
  c.rope.yarn = true;
  ASSIGN_OR_RETURN(c.rope.factor, GetDouble(rope, "factor", 0.0));
  ASSIGN_OR_RETURN(c.rope.original_max_position_embeddings,
                   GetInt(rope, "original_max_position_embeddings", 0));
  if (c.rope.factor == 0.0) {
    if (c.rope.original_max_position_embeddings <= 0) return Bad("rope factor", "missing");
    c.rope.factor = static_cast<double>(c.max_position_embeddings) /
                    static_cast<double>(c.rope.original_max_position_embeddings);
  }
  ASSIGN_OR_RETURN(c.rope.beta_fast, GetDouble(rope, "beta_fast", 32.0));
  ASSIGN_OR_RETURN(c.rope.beta_slow, GetDouble(rope, "beta_slow", 1.0));
  ASSIGN_OR_RETURN(c.rope.mscale, GetDouble(rope, "mscale", 0.0));
  ASSIGN_OR_RETURN(c.rope.mscale_all_dim, GetDouble(rope, "mscale_all_dim", 0.0));
  ASSIGN_OR_RETURN(c.rope.attention_factor, GetDouble(rope, "attention_factor", 0.0));
  ASSIGN_OR_RETURN(c.rope.truncate, GetBool(rope, "truncate", true));
  return absl::OkStatus();
}

}  // namespace

std::string_view ModelTypeName(ModelType type) {
  return type == ModelType::kDeepseekV2 ? "deepseek_v2" : "deepseek_v3";
}

double ModelConfig::RopeAttentionFactor() const {
  if (!rope.yarn) return 1.0;
  if (rope.attention_factor > 0.0) return rope.attention_factor;
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    return YarnMscale(rope.factor, rope.mscale) / YarnMscale(rope.factor, rope.mscale_all_dim);
  }
  return YarnMscale(rope.factor, 1.0);
}

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.yarn && rope.mscale_all_dim != 0.0) {
    const double m = YarnMscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad("(file)", "not a JSON object");
  ModelConfig c;
  const std::string model_type = GetString(j, "model_type", "");
  if (model_type == "deepseek_v2") {
    c.type = ModelType::kDeepseekV2;
    c.scoring_func = ScoringFunc::kSoftmax;
    c.topk_method = TopkMethod::kGreedy;
    c.norm_topk_prob = false;
    c.rope_layout = RopeLayout::kInterleaved;
  } else if (model_type == "deepseek_v3") {
    c.type = ModelType::kDeepseekV3;
    ASSIGN_OR_RETURN(bool interleave, GetBool(j, "rope_interleave", true));
    c.rope_layout = interleave ? RopeLayout::kDeinterleaved : RopeLayout::kHalves;
  } else {
    return Bad("model_type", StrCat("'", model_type, "' is not deepseek_v2 or deepseek_v3"));
  }
  ASSIGN_OR_RETURN(c.vocab_size, GetRequiredInt(j, "vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, GetRequiredInt(j, "hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, GetRequiredInt(j, "intermediate_size"));
  ASSIGN_OR_RETURN(c.moe_intermediate_size, GetInt(j, "moe_intermediate_size", 0));
  ASSIGN_OR_RETURN(c.num_hidden_layers, GetRequiredInt(j, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_attention_heads, GetRequiredInt(j, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.n_shared_experts, GetInt(j, "n_shared_experts", 0));
  ASSIGN_OR_RETURN(c.n_routed_experts, GetInt(j, "n_routed_experts", 0));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, GetInt(j, "num_experts_per_tok", 0));
  ASSIGN_OR_RETURN(c.routed_scaling_factor, GetDouble(j, "routed_scaling_factor", 1.0));
  const std::string scoring = GetString(j, "scoring_func", "");
  if (scoring == "softmax") {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else if (scoring == "sigmoid") {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (!scoring.empty()) {
    return Bad("scoring_func", StrCat("'", scoring, "' is not softmax or sigmoid"));
  }
  const std::string method = GetString(j, "topk_method", "");
  if (method == "greedy") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (method == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else if (!method.empty()) {
    return Bad("topk_method",
               StrCat("'", method, "' is not greedy, group_limited_greedy or noaux_tc"));
  }
  ASSIGN_OR_RETURN(c.n_group, GetInt(j, "n_group", 1));
  ASSIGN_OR_RETURN(c.topk_group, GetInt(j, "topk_group", 1));
  ASSIGN_OR_RETURN(c.norm_topk_prob, GetBool(j, "norm_topk_prob", c.norm_topk_prob));
  ASSIGN_OR_RETURN(c.first_k_dense_replace, GetInt(j, "first_k_dense_replace", 0));
  ASSIGN_OR_RETURN(c.moe_layer_freq, GetInt(j, "moe_layer_freq", 1));
  ASSIGN_OR_RETURN(c.q_lora_rank, GetInt(j, "q_lora_rank", 0));
  ASSIGN_OR_RETURN(c.kv_lora_rank, GetRequiredInt(j, "kv_lora_rank"));
  ASSIGN_OR_RETURN(c.qk_nope_head_dim, GetRequiredInt(j, "qk_nope_head_dim"));
  ASSIGN_OR_RETURN(c.v_head_dim, GetRequiredInt(j, "v_head_dim"));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 4096));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.bos_token_id, GetInt(j, "bos_token_id", 0));
  if (auto it = j.find("eos_token_id"); it != j.end() && it->is_array() && !it->empty()) {
    c.eos_token_id = (*it)[0].is_number() ? (*it)[0].get<int64_t>() : 1;
  } else {
    ASSIGN_OR_RETURN(c.eos_token_id, GetInt(j, "eos_token_id", 1));
  }

  // RoPE dimension: `qk_rope_head_dim`; in the transformers 5.x form `head_dim` carries the same
  // value (the rotary dimension), never the attention head size.
  ASSIGN_OR_RETURN(int64_t rope_dim, GetInt(j, "qk_rope_head_dim", 0));
  ASSIGN_OR_RETURN(int64_t head_dim, GetInt(j, "head_dim", 0));
  if (rope_dim == 0) rope_dim = head_dim;
  if (rope_dim == 0) return Bad("qk_rope_head_dim", "missing");
  if (head_dim != 0 && head_dim != rope_dim && head_dim != c.qk_nope_head_dim + rope_dim) {
    return Bad("head_dim", StrCat(head_dim, " is neither qk_rope_head_dim (", rope_dim,
                                  ") nor qk_nope_head_dim + qk_rope_head_dim"));
  }
  c.qk_rope_head_dim = rope_dim;

  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    RETURN_IF_ERROR(ParseRope(*it, /*new_form=*/true, c));
  } else {
    ASSIGN_OR_RETURN(c.rope.theta, GetDouble(j, "rope_theta", 10000.0));
    if (auto rs = j.find("rope_scaling"); rs != j.end()) {
      RETURN_IF_ERROR(ParseRope(*rs, /*new_form=*/false, c));
    }
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  auto positive = [](int64_t v, std::string_view name) -> absl::Status {
    if (v <= 0) return Bad(name, StrCat("must be positive, got ", v));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
  RETURN_IF_ERROR(positive(c.hidden_size, "hidden_size"));
  RETURN_IF_ERROR(positive(c.intermediate_size, "intermediate_size"));
  RETURN_IF_ERROR(positive(c.num_hidden_layers, "num_hidden_layers"));
  RETURN_IF_ERROR(positive(c.num_attention_heads, "num_attention_heads"));
  RETURN_IF_ERROR(positive(c.kv_lora_rank, "kv_lora_rank"));
  RETURN_IF_ERROR(positive(c.qk_nope_head_dim, "qk_nope_head_dim"));
  RETURN_IF_ERROR(positive(c.v_head_dim, "v_head_dim"));
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0) {
    return Bad("qk_rope_head_dim", "must be positive and even");
  }
  if (c.qk_rope_head_dim > 1024) {
    return Bad("qk_rope_head_dim", "larger than 1024 is not supported");
  }
  if (c.q_lora_rank < 0) return Bad("q_lora_rank", "must not be negative");
  if (c.rms_norm_eps <= 0) return Bad("rms_norm_eps", "must be positive");
  if (c.rope.theta <= 0) return Bad("rope_theta", "must be positive");
  if (c.rope.yarn) {
    if (c.rope.factor <= 0) return Bad("rope factor", "must be positive");
    if (c.rope.beta_fast <= 0 || c.rope.beta_slow <= 0) return Bad("beta_fast/beta_slow", "<= 0");
  }
  if (c.n_routed_experts > 0) {
    RETURN_IF_ERROR(positive(c.moe_intermediate_size, "moe_intermediate_size"));
    RETURN_IF_ERROR(positive(c.num_experts_per_tok, "num_experts_per_tok"));
    if (c.num_experts_per_tok > c.n_routed_experts) {
      return Bad("num_experts_per_tok", "exceeds n_routed_experts");
    }
    if (c.n_group <= 0 || c.n_routed_experts % c.n_group != 0) {
      return Bad("n_group", "must divide n_routed_experts");
    }
    if (c.topk_group <= 0 || c.topk_group > c.n_group) {
      return Bad("topk_group", "must be in [1, n_group]");
    }
    if (c.topk_method != TopkMethod::kGreedy &&
        c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok) {
      return Bad("topk_group", "the selected groups hold fewer experts than num_experts_per_tok");
    }
    if (c.topk_method == TopkMethod::kNoauxTc && c.n_routed_experts / c.n_group < 2) {
      return Bad("n_group", "noaux_tc needs at least 2 experts per group");
    }
    if (c.moe_layer_freq <= 0) return Bad("moe_layer_freq", "must be positive");
  }
  if (c.n_shared_experts < 0) return Bad("n_shared_experts", "must not be negative");
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  auto config = ParseModelConfig(text);
  if (!config.ok()) return Annotate(config.status(), path);
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  const bool v3 = c.type == ModelType::kDeepseekV3;
  json j;
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["model_type"] = std::string(ModelTypeName(c.type));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func == ScoringFunc::kSoftmax ? "softmax" : "sigmoid";
  j["topk_method"] = c.topk_method == TopkMethod::kGreedy               ? "greedy"
                     : c.topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                        : "noaux_tc";
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = "bfloat16";
  if (v3) j["rope_interleave"] = c.rope_layout != RopeLayout::kHalves;
  j["rope_theta"] = c.rope.theta;
  if (c.rope.yarn) {
    json rs;
    rs["type"] = "yarn";
    rs["factor"] = c.rope.factor;
    if (c.rope.original_max_position_embeddings > 0) {
      rs["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
    }
    rs["beta_fast"] = c.rope.beta_fast;
    rs["beta_slow"] = c.rope.beta_slow;
    if (c.rope.mscale != 0.0) rs["mscale"] = c.rope.mscale;
    if (c.rope.mscale_all_dim != 0.0) rs["mscale_all_dim"] = c.rope.mscale_all_dim;
    j["rope_scaling"] = rs;
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j.dump(2) + "\n";
}

}  // namespace strata::model
