// MoE expert block for decode-sized token counts, with the routing kept on the device (no host
// sync, so a whole decode step can be captured in a CUDA graph). Two launchers:
//
// 1. LaunchMoeAlign: the router's choices (experts[t][k], kernels/moe_router) become per-expert
//    groups of "slots" (one slot per (token, choice)):
//      expert_count[e]    = #{(t, k) : experts[t][k] == e}
//      expert_offset[e]   = sum_{e' < e} expert_count[e']    (expert_offset[E] = valid choices)
//      active[0:num_active] = the experts with expert_count > 0, ascending
//      slot_token[s]      = t of slot s; slots [expert_offset[e], expert_offset[e + 1]) are e's
//      token_slot[t][k]   = slot of choice (t, k), or -1 when experts[t][k] is outside [0, E)
//                           (then *error is set to 1; it is never cleared by the kernel)
//    The order of the slots inside one expert's range is unspecified (shared-memory atomics); the
//    outputs of every slot do not depend on it.
//
// 2. LaunchMoeExperts: for every active expert e and each of its slots s (token t = slot_token[s]):
//      act[s][i] = bf16( SiLU(bf16(gate_e · x[t])[i]) * bf16(up_e · x[t])[i] )     i < inter
//      out[s][j] = bf16( down_e[j] · act[s] )                                        j < hidden
//    (fp32 accumulation; the same roundings as a bf16 gate|up GEMM, SiluMul and a bf16 down GEMM).
//    Weight-bandwidth bound: each CTA streams 16 or 32 weight rows of one expert once with 16-byte
//    loads (split over its 8 warps along the reduction), the expert's few token rows go through
//    mma.sync (bf16, m16n8k16) with the weights as the 16-row operand; up to 8 * tile tokens per
//    pass, more tokens re-read the rows (L2) per further pass. Grid sizes come from the host's
//    bounds (max_active); CTAs of experts past *num_active exit at once.
//
// Thread safety: stateless launchers; all work on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/moe_router/moe_router.h"
#include "kernels/norm_rope/rms_norm.h"

namespace strata::kernels {

inline constexpr int kMoeAlignMaxExperts = 1024;
// The widest input row a launch may form from a norm (MoeNormIn).
inline constexpr int kMoeNormInMaxDim = 7168;

// A one-token launch's input row formed by every CTA itself, as LaunchRmsNorm(params) would form
// it (bit-identical: the same routine, kernels/norm_rope/rms_norm_row.cuh), in shared memory: no
// norm launch precedes the GEMV on the step's critical path. The launch's x is then not read.
// With `writes`, the grid's first CTA also stores the norm's residual_out and out, for the kernels
// after it; those must then not overlap the norm's inputs, which the other CTAs still read (the
// residual stream alternates between two buffers instead of being updated in place).
// Every CTA reads the norm's inputs (up to 8 rows from L2) and runs its dependent steps before
// its first MMA, so it pays on grids of one wave: H200, v2-lite-shape batch-1 decode, GPU ms
// per step: norm kernels 2.087-2.098; formed in the router logits (4 CTAs) 2.073-2.074; also in
// the q|kv_a projection (228) 2.061-2.069; also in the shared experts' gate|up (352, two waves)
// 2.164 (the CUDA engine forms the first two only).
struct MoeNormIn {
  RmsNormParams params;  // rows 0: off; else rows 1 and dim the launch's input width
  bool writes = false;
};

struct MoeAlignParams {
  int num_tokens = 0;
  int top_k = 0;
  int num_experts = 0;               // 1..kMoeAlignMaxExperts
  const int32_t* experts = nullptr;  // [num_tokens][top_k]
  MoeAlignment out;                  // every array set
};

absl::Status ValidateMoeAlignParams(const MoeAlignParams& params);
absl::Status LaunchMoeAlign(const MoeAlignParams& params, cudaStream_t stream);

struct MoeExpertsParams {
  int num_tokens = 0;  // rows of x; every expert has at most this many slots
  int num_experts = 0;
  int max_active = 0;  // grid bound: >= the device's *num_active (e.g. min(E, tokens * top_k))
  int hidden = 0;      // H, a multiple of 8
  int inter = 0;       // I, a multiple of 8
  // Token rows per pass: 8 * token_tiles, token_tiles 1 or 2 (pick from num_tokens).
  int token_tiles = 2;
  const __nv_bfloat16* x = nullptr;  // [num_tokens][ld_x] (not read with norm_in)
  int64_t ld_x = 0;                  // >= hidden, a multiple of 8
  // num_tokens 1, token_tiles 1, identity only: the gate|up kernel's row x (dim hidden), or the
  // down kernel's input row when it runs alone (LaunchSkinnyGemm, dim k), formed from a norm.
  MoeNormIn norm_in;
  // Expert e: gate [I][H], up [I][H] (adjacent rows: one [2I][H] gate|up) then down [H][I], at
  // weights + e * expert_stride (elements, a multiple of 8).
  const __nv_bfloat16* weights = nullptr;
  int64_t expert_stride = 0;
  // Expert e's down [H][I] at down + e * expert_stride instead (null: the layout above).
  const __nv_bfloat16* down = nullptr;
  // One expert (e = 0) holding every token, slot t = token t (a dense or shared-expert MLP): the
  // alignment arrays below are not read, max_active must be 1 and expert_stride is not used.
  bool identity = false;
  // From LaunchMoeAlign.
  const int32_t* expert_count = nullptr;   // [num_experts]
  const int32_t* expert_offset = nullptr;  // [num_experts + 1]
  const int32_t* active = nullptr;         // [num_experts]
  const int32_t* num_active = nullptr;     // [1]
  const int32_t* slot_token = nullptr;     // [slots]
  __nv_bfloat16* act = nullptr;            // [slots][inter] (workspace)
  __nv_bfloat16* out = nullptr;            // [slots][hidden]
  // Input rows of the down kernel instead of act (null: act), [slots][ld_down_in].
  const __nv_bfloat16* down_in = nullptr;
  int64_t ld_down_in = 0;    // 0: inter
  int64_t ld_out = 0;        // row stride of out / out_f32 (0: hidden)
  float* out_f32 = nullptr;  // fp32 output of the down kernel instead of out
  // The weights were complete before the kernel ahead of this launch on the stream started (model
  // weights): the down kernel then loads its first pass of them before the programmatic-launch
  // wait, while that kernel still runs (H200, v2-lite-shape decode: batch-1 step 2.45 -> 2.41 ms
  // GPU). Routed experts: the alignment arrays are read then too (LaunchMoeAlign ran before the
  // gate|up kernel, which the down kernel waits for).
  bool weights_static = false;
  // Internal (LaunchSkinnyGemm): grid z, strides in elements between batch entries.
  int batch = 1;
  int64_t batch_stride_w = 0, batch_stride_in = 0, batch_stride_out = 0;
};

absl::Status ValidateMoeExpertsParams(const MoeExpertsParams& params);
// Enqueues the gate|up + SiLU×mul kernel, then the down kernel.
absl::Status LaunchMoeExperts(const MoeExpertsParams& params, cudaStream_t stream);

// The down kernel alone as a (batched) GEMM for few token rows, reading each weight row once:
//   out[b][t][j] = w[b][j] · x[b][t]     b < batch, t < tokens, j < n_out (w [n_out][k] a torch
//                                        Linear), bf16 out (rounded) or fp32 out_f32
// For tokens <= 16 (one pass: the weights are read once); more tokens re-read them per 16.
struct SkinnyGemmParams {
  int tokens = 0;
  int n_out = 0;
  int k = 0;  // a multiple of 8
  int batch = 1;
  const __nv_bfloat16* x = nullptr;  // [batch][tokens][ld_x] at x + b * batch_stride_x
  // tokens 1, batch 1 only: x (dim k) formed from a norm instead (MoeNormIn); x is not read.
  MoeNormIn norm_in;
  int64_t ld_x = 0;                  // 0: k; a multiple of 8
  const __nv_bfloat16* w = nullptr;  // [batch][n_out][k] at w + b * batch_stride_w
  __nv_bfloat16* out = nullptr;      // [batch][tokens][ld_out] at out + b * batch_stride_out
  float* out_f32 = nullptr;          // instead of out
  int64_t ld_out = 0;                // 0: n_out
  int64_t batch_stride_x = 0, batch_stride_w = 0, batch_stride_out = 0;  // multiples of 8 (x, w)
  // w was complete before the kernel ahead of this launch on the stream started (model weights):
  // its first pass is loaded before the programmatic-launch wait (MoeExpertsParams).
  bool weights_static = false;
};
absl::Status ValidateSkinnyGemmParams(const SkinnyGemmParams& params);
absl::Status LaunchSkinnyGemm(const SkinnyGemmParams& params, cudaStream_t stream);

}  // namespace strata::kernels
