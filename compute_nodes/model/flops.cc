#include "compute_nodes/model/flops.h"

namespace strata::model {

ForwardFlops PrefillFlops(const ModelConfig& c, int64_t new_tokens, int64_t cached_tokens,
                          int64_t output_rows) {
  const double n = static_cast<double>(new_tokens);
  const double ctx = static_cast<double>(cached_tokens + new_tokens);
  const double h = static_cast<double>(c.hidden_size);
  const double heads = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_head_dim()), v = static_cast<double>(c.v_head_dim);
  const double q_macs = c.q_lora_rank > 0 ? h * static_cast<double>(c.q_lora_rank) +
                                                static_cast<double>(c.q_lora_rank) * heads * qk
                                          : h * heads * qk;
  const double kv_a_macs = h * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim);
  const double kv_b_macs = static_cast<double>(c.kv_lora_rank) * heads *
                           static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
  const double o_macs = heads * v * h;
  // Visible (query, key) pairs of the new tokens, causal: query i sees cached + i + 1 keys.
  const double pairs = n * static_cast<double>(cached_tokens) + n * (n + 1) / 2;
  const double dense_macs = 3 * h * static_cast<double>(c.intermediate_size);
  const double expert_macs = 3 * h * static_cast<double>(c.moe_intermediate_size);
  const double moe_macs = h * static_cast<double>(c.n_routed_experts) +
                          expert_macs * static_cast<double>(c.n_shared_experts) +
                          expert_macs * static_cast<double>(c.num_experts_per_tok);
  ForwardFlops f;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    f.projections += 2 * (n * (q_macs + kv_a_macs + o_macs) + ctx * kv_b_macs);
    f.attention += 2 * pairs * heads * (qk + v);
    f.mlp += 2 * n * (c.IsMoeLayer(layer) ? moe_macs : dense_macs);
  }
  f.lm_head = 2 * static_cast<double>(output_rows) * h * static_cast<double>(c.vocab_size);
  return f;
}

}  // namespace strata::model
