// Rotary position embedding (default or YaRN) on bf16 q_pe / k_pe lanes, in place, with the same
// math and lane layouts as the CPU backend (compute_nodes/backend/cpu/cpu_ops.h, cpu::Rope):
//
//   f_i      = inv_freq[i] * float(position)                         (fp32, as transformers)
//   c_i, s_i = cos(f_i) * attention_factor, sin(f_i) * attention_factor   (fp32, full-range)
//   (a, b)   -> (a c_i - b s_i, b c_i + a s_i)                       (fp32, one bf16 rounding)
//
// where (a, b) and the output lanes of pair i depend on `layout`:
//   kInterleaved   in (2i, 2i+1), out (2i, 2i+1)        DeepSeek-V2
//   kDeinterleaved in (2i, 2i+1), out (i, i + d/2)      DeepSeek-V3, rope_interleave = true
//   kHalves        in (i, i + d/2), out (i, i + d/2)    DeepSeek-V3, rope_interleave = false
// inv_freq holds the YaRN-corrected frequencies (cpu::Rope::inv_freq(), uploaded once).
//
// Vector v (token t, head h) starts at x + t * token_stride + h * head_stride. Rotated in place,
// or, when `out` is set, written at out + t * out_token_stride + h * out_head_stride (x is then
// only read: the absorbed decode path ropes q_pe straight into its query rows). Thread safety:
// stateless; vectors must not overlap.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

enum class RopeLanes { kInterleaved = 0, kDeinterleaved = 1, kHalves = 2 };

inline constexpr int kRopeMaxDim = 256;

struct RopeParams {
  int num_tokens = 0;
  int num_heads = 0;  // vectors per token (1 for k_pe)
  int rope_dim = 64;  // even, <= kRopeMaxDim
  RopeLanes layout = RopeLanes::kDeinterleaved;
  float attention_factor = 1.f;
  __nv_bfloat16* x = nullptr;          // in place unless `out` is set
  int64_t token_stride = 0;            // elements
  int64_t head_stride = 0;             // elements
  __nv_bfloat16* out = nullptr;        // optional destination (must not overlap x)
  int64_t out_token_stride = 0;        // elements
  int64_t out_head_stride = 0;         // elements
  const int32_t* positions = nullptr;  // [num_tokens], >= 0
  const float* inv_freq = nullptr;     // [rope_dim / 2], device
};

absl::Status ValidateRopeParams(const RopeParams& params);
absl::Status LaunchRope(const RopeParams& params, cudaStream_t stream);

}  // namespace strata::kernels
