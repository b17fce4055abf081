// RMSNorm over bf16 rows, optionally fused with the residual add that precedes it (DeepSeek-V2/V3
// pre-norm blocks), with the roundings of the transformers bf16 model:
//
//   h   = bf16(x + residual)                  (written to residual_out; h = x without residual)
//   out = bf16(weight * bf16(h / sqrt(mean(h^2) + eps)))      (mean in fp32)
//
// Rows are `dim` wide at strides ld_* (elements), so a norm can run over the first kv_lora_rank
// lanes of [kv_lora_rank + rope_dim] rows. Element-wise aliasing is allowed: residual_out may be
// residual (the usual in-place residual stream) and out may be x.
//
// With `moe` set (top_k > 0), x is not read but formed in the kernel from a MoE block's outputs,
// as the block's combine would have written it before the norm:
//
//   x[r][i] = bf16(fma-chain over k of weight[r][k] * expert_out[slot[r][k]][i], k ascending,
//                  from 0, slots < 0 skipped; + shared[r][i] when shared is set)   (fp32)
//
// Preconditions the launcher cannot check: the pointers are device (or mapped) memory covering
// `rows` rows (and the slots they name). Thread safety: stateless.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

// A MoE block's output rows, summed by the norm (above).
struct RmsNormMoeSum {
  int top_k = 0;                              // 0: off; <= kRmsNormMaxTopK
  const __nv_bfloat16* expert_out = nullptr;  // [slots][ld_expert_out]
  int64_t ld_expert_out = 0;
  const int64_t* slot = nullptr;  // [rows][top_k]: the expert_out row of each choice, or < 0
  const float* weight = nullptr;  // [rows][top_k]
  const __nv_bfloat16* shared = nullptr;  // optional [rows][ld_shared]: the shared experts
  int64_t ld_shared = 0;
};
inline constexpr int kRmsNormMaxTopK = 32;

struct RmsNormParams {
  int rows = 0;
  int dim = 0;  // a multiple of 8, <= 16384
  float eps = 1e-6f;
  const __nv_bfloat16* x = nullptr;  // [rows][ld_x]; unused with moe
  int64_t ld_x = 0;
  RmsNormMoeSum moe;
  const __nv_bfloat16* residual = nullptr;  // optional, [rows][ld_residual]
  int64_t ld_residual = 0;
  __nv_bfloat16* residual_out = nullptr;  // required with residual, [rows][ld_residual_out]
  int64_t ld_residual_out = 0;
  const __nv_bfloat16* weight = nullptr;  // [dim]
  __nv_bfloat16* out = nullptr;           // [rows][ld_out]
  int64_t ld_out = 0;
};

// InvalidArgument naming the bad field (dim, strides, 16-byte alignment, missing pointers).
absl::Status ValidateRmsNormParams(const RmsNormParams& params);
absl::Status LaunchRmsNorm(const RmsNormParams& params, cudaStream_t stream);

}  // namespace strata::kernels
