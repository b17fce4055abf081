// Double-precision CPU reference of prefill attention (kernels/prefill_attention): one sequence,
// one head, dense float inputs (bf16 values), bottom-right causal alignment.
#pragma once

#include <vector>

namespace strata::kernels {

// q [q_len][192], k [k_len][192], v [k_len][128] (row strides given); out [q_len][128] and
// lse [q_len] (natural log; rows that see no key: zeros and -inf).
void PrefillAttentionReference(const float* q, int q_stride, const float* k, int k_stride,
                               const float* v, int v_stride, int q_len, int k_len, bool causal,
                               float scale, std::vector<double>& out, std::vector<double>& lse);

}  // namespace strata::kernels
