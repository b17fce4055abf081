// The model config the RoPE-using kernel tests rotate with: DeepSeek head dims, 160K positions,
// and with `yarn` DeepSeek-V3's rope_scaling (factor 40, attention factor != 1).
#pragma once

#include "compute_nodes/model/model_config.h"

namespace strata::kernels::testing {

inline model::ModelConfig RopeTestConfig(bool yarn, model::RopeLayout layout) {
  model::ModelConfig c;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.max_position_embeddings = 163840;
  c.rope_layout = layout;
  c.rope.theta = 10000.0;
  c.rope.yarn = yarn;
  if (yarn) {
    c.rope.factor = 40.0;
    c.rope.original_max_position_embeddings = 4096;
    c.rope.beta_fast = 32.0;
    c.rope.beta_slow = 1.0;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 0.707;  // attention factor != 1 (mscale ratio)
  }
  return c;
}

}  // namespace strata::kernels::testing
