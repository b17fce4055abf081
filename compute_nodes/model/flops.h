// Floating-point work of a forward pass of a DeepSeek-V2/V3 model, for MFU figures: 2 FLOP per
// multiply-add of every matrix product the MHA (prefill) form runs, by kind.
//
//   ForwardFlops f = PrefillFlops(config, /*new_tokens=*/4096, /*cached_tokens=*/0, /*outputs=*/1);
//   double mfu = f.total() / seconds / 790e12;
//
// Per layer and new token: the q path (q_a + q_b, or q_proj), kv_a, o_proj, and the MLP (dense
// gate/up/down, or router + shared experts + the num_experts_per_tok routed experts a token goes
// to); kv_b decompresses every context token (cached + new), as the MHA form does; attention
// scores and values count 2 (qk_head_dim + v_head_dim) per visible (query, key) pair and head,
// causal; the LM head counts `output_rows` rows (the engines compute logits of the last token).
#pragma once

#include <cstdint>

#include "compute_nodes/model/model_config.h"

namespace strata::model {

struct ForwardFlops {
  double projections = 0;  // q, kv_a, kv_b, o_proj
  double attention = 0;    // Q K^T and P V
  double mlp = 0;          // dense MLPs, routers, shared and routed experts
  double lm_head = 0;
  double total() const { return projections + attention + mlp + lm_head; }
};

ForwardFlops PrefillFlops(const ModelConfig& config, int64_t new_tokens, int64_t cached_tokens,
                          int64_t output_rows);

}  // namespace strata::model
