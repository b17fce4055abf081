// A step's new latent KV rows into their pages, in one kernel. For token t, with
// src = in + t * ld_in (the kv_a_proj output [c_kv | k_pe]) and dst = out + out_rows[t] * ld_out:
//
//   dst[0, rank)                = RMSNorm(src[0, rank)) · norm_weight   (rms_norm.h's roundings)
//   dst[rank, rank + rope_dim)  = RoPE(src[rank, rank + rope_dim), positions[t])   (rope.h)
//
// It stands for the norm in place, the RoPE in place and the row scatter: three dependent kernels
// on every layer's KV path become one. `in` is only read.
//
// Optionally the same launch also rotates the step's query q_pe vectors (q_heads > 0): rope.h's
// math with the positions, inv_freq, layout and attention_factor above, vector h of token t at
// q + t * q_token_stride + h * q_head_stride, in place or, when q_out is set, written at
// q_out + t * q_out_token_stride + h * q_out_head_stride (q is then only read). Both halves of an
// attention layer's RoPE in one kernel: the query rows and the KV rows come out of one fused
// q|kv_a projection, so nothing else separates them.
//
// Preconditions the launcher cannot check: device pointers covering the rows, out_rows distinct
// and inside `out`. Thread safety: stateless.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/norm_rope/rope.h"

namespace strata::kernels {

inline constexpr int kLatentRowsMaxRank = 2048;

struct LatentRowsParams {
  int num_tokens = 0;
  int rank = 512;     // normed lanes: a multiple of 8, <= kLatentRowsMaxRank
  int rope_dim = 64;  // rotated lanes after them: even, <= kRopeMaxDim
  float eps = 1e-6f;
  const __nv_bfloat16* in = nullptr;           // [num_tokens][ld_in]
  int64_t ld_in = 0;                           // >= rank + rope_dim, a multiple of 8
  const __nv_bfloat16* norm_weight = nullptr;  // [rank]
  RopeLanes layout = RopeLanes::kDeinterleaved;
  float attention_factor = 1.f;
  const int32_t* positions = nullptr;  // [num_tokens], >= 0
  const float* inv_freq = nullptr;     // [rope_dim / 2]
  __nv_bfloat16* out = nullptr;        // page rows
  int64_t ld_out = 0;                  // >= rank + rope_dim, a multiple of 8
  const int64_t* out_rows = nullptr;   // [num_tokens]: the row of `out` each token goes to
  // The query part (above); q_heads = 0 leaves it out.
  int q_heads = 0;
  __nv_bfloat16* q = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;  // elements
  __nv_bfloat16* q_out = nullptr;                 // optional; must not overlap q
  int64_t q_out_token_stride = 0, q_out_head_stride = 0;
  // Run beside the kernel ahead of this launch on the stream (pdl.cuh's PdlLaunchNext): that
  // kernel calls PdlGridSync, every input above was written by the kernels before it, and it
  // neither writes what this launch reads or writes nor reads what it writes. The rows are then
  // written at once, and the kernel waits for that kernel only before it exits, so whatever comes
  // next finds both complete. A decode step launches q·W_UK first and this beside it.
  bool beside_previous = false;
};

// InvalidArgument naming the bad field.
absl::Status ValidateLatentRowsParams(const LatentRowsParams& params);
absl::Status LaunchLatentRows(const LatentRowsParams& params, cudaStream_t stream);

}  // namespace strata::kernels
