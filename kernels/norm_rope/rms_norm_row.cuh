// The pieces of one RMSNorm row (rms_norm.h) for a block of kThreads threads, each thread taking
// the 8-element chunks c = threadIdx.x, c + kThreads, ...: the norm kernel and the GEMVs that form
// their one input row themselves (MoeExpertsParams::norm_in) both use them, so the two give
// bit-identical rows.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/sm80_ptx.cuh"
#include "kernels/norm_rope/rms_norm.h"

namespace strata::kernels::norm_row {

// A row's MoE choices, staged in shared memory once per block (each chunk reads them all).
struct MoeChoices {
  int64_t slot[kRmsNormMaxTopK];
  float weight[kRmsNormMaxTopK];
};

// Threads < top_k stage row `row`'s choices; the caller synchronizes the block before use.
__device__ __forceinline__ void LoadChoices(const RmsNormMoeSum& m, int64_t row, MoeChoices& ch) {
  if (static_cast<int>(threadIdx.x) < m.top_k) {
    ch.slot[threadIdx.x] = m.slot[row * m.top_k + threadIdx.x];
    ch.weight[threadIdx.x] = m.weight[row * m.top_k + threadIdx.x];
  }
}

// Chunk c (8 lanes) of a MoE block's output row (rms_norm.h's order of operations). The expert
// rows of up to kBatch choices are loaded before any is summed, so their loads overlap (one after
// another they made a one-row norm 7.2 us under Nsight Compute, against 3.9 without the sum).
__device__ __forceinline__ uint4 MoeSumChunk(const RmsNormMoeSum& m, const MoeChoices& ch,
                                             int64_t row, int c) {
  constexpr int kBatch = 8;
  float acc[8] = {};
  for (int k0 = 0; k0 < m.top_k; k0 += kBatch) {
    Bf16x8 e[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j;
      e[j].u =
          k < m.top_k && ch.slot[k] >= 0
              ? *reinterpret_cast<const uint4*>(m.expert_out + ch.slot[k] * m.ld_expert_out + c * 8)
              : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j;
      if (k >= m.top_k || ch.slot[k] < 0) continue;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        acc[i] = __fmaf_rn(ch.weight[k], __bfloat162float(e[j].h[i]), acc[i]);
      }
    }
  }
  if (m.shared != nullptr) {
    Bf16x8 sh;
    sh.u = *reinterpret_cast<const uint4*>(m.shared + row * m.ld_shared + c * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __bfloat162float(sh.h[i]));
  }
  Bf16x8 x;
#pragma unroll
  for (int i = 0; i < 8; ++i) x.h[i] = __float2bfloat16_rn(acc[i]);
  return x.u;
}

// Chunk c of h = bf16(x + residual) (x read, or the MoE sum; h = x without a residual).
__device__ __forceinline__ uint4 InputChunk(const RmsNormParams& p, const MoeChoices& ch,
                                            int64_t row, int c) {
  Bf16x8 h;
  h.u = p.moe.top_k > 0 ? MoeSumChunk(p.moe, ch, row, c)
                        : *reinterpret_cast<const uint4*>(p.x + row * p.ld_x + c * 8);
  if (p.residual != nullptr) {
    Bf16x8 r;
    r.u = *reinterpret_cast<const uint4*>(p.residual + row * p.ld_residual + c * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      h.h[i] = __float2bfloat16_rn(__bfloat162float(h.h[i]) + __bfloat162float(r.h[i]));
    }
  }
  return h.u;
}

// ss + the squares of h's 8 lanes, in lane order.
__device__ __forceinline__ float AddSquares(float ss, uint4 h) {
  Bf16x8 v;
  v.u = h;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float f = __bfloat162float(v.h[i]);
    ss += f * f;
  }
  return ss;
}

// The block's sum of v (warps in order); scratch holds kThreads / 32 floats and is used once.
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

// 1 / rms of a row whose squares summed to `ss` (this thread's share).
template <int kThreads>
__device__ __forceinline__ float InverseRms(const RmsNormParams& p, float ss, float* scratch) {
  return rsqrtf(BlockSum<kThreads>(ss, scratch) / static_cast<float>(p.dim) + p.eps);
}

// Chunk c of out = bf16(weight * bf16(h * inv)).
__device__ __forceinline__ uint4 OutputChunk(const RmsNormParams& p, uint4 h_chunk, int c,
                                             float inv) {
  Bf16x8 h, w, o;
  h.u = h_chunk;
  w.u = *reinterpret_cast<const uint4*>(p.weight + c * 8);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float n = __bfloat162float(__float2bfloat16_rn(__bfloat162float(h.h[i]) * inv));
    o.h[i] = __float2bfloat16_rn(__bfloat162float(w.h[i]) * n);
  }
  return o.u;
}

// Row 0 of `p`, normed into row[0 : dim / 8] (shared memory) by the whole block; `writer`: also
// stores residual_out (when there is a residual) and out, as LaunchRmsNorm would. Ends with a
// block barrier (row complete). ch and scratch (kThreads / 32 floats) are the block's.
template <int kThreads>
__device__ __forceinline__ void NormRowInto(const RmsNormParams& p, bool writer, uint4* row,
                                            MoeChoices& ch, float* scratch) {
  const int chunks = p.dim / 8;
  if (p.moe.top_k > 0) {
    LoadChoices(p.moe, 0, ch);
    __syncthreads();
  }
  float ss = 0.f;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 h = InputChunk(p, ch, 0, c);
    if (writer && p.residual != nullptr) reinterpret_cast<uint4*>(p.residual_out)[c] = h;
    row[c] = h;
    ss = AddSquares(ss, h);
  }
  const float inv = InverseRms<kThreads>(p, ss, scratch);
  for (int c = threadIdx.x; c < chunks; c += kThreads) {  // only the chunks this thread wrote
    const uint4 o = OutputChunk(p, row[c], c, inv);
    row[c] = o;
    if (writer) reinterpret_cast<uint4*>(p.out)[c] = o;
  }
  __syncthreads();
}

}  // namespace strata::kernels::norm_row
