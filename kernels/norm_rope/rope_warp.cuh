// One RoPE vector rotated by one warp (the math of rope.h): every lane reads its pairs before any
// lane writes, so `y` may be `x` (in place, also for the de-interleaving layout).
#pragma once

#include <cuda_bf16.h>

#include "kernels/norm_rope/rope.h"

namespace strata::kernels::rope_detail {

inline constexpr int kPairsPerLane = kRopeMaxDim / 2 / 32;

__device__ __forceinline__ void RopeWarp(const __nv_bfloat16* x, __nv_bfloat16* y, int rope_dim,
                                         RopeLanes layout, float pos, const float* inv_freq,
                                         float attention_factor, int lane) {
  const int half = rope_dim / 2;
  float ra[kPairsPerLane], rb[kPairsPerLane];
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i >= half) break;
    float a, b;
    if (layout == RopeLanes::kHalves) {
      a = __bfloat162float(x[i]);
      b = __bfloat162float(x[i + half]);
    } else {
      a = __bfloat162float(x[2 * i]);
      b = __bfloat162float(x[2 * i + 1]);
    }
    const float f = inv_freq[i] * pos;
    float sn, cs;
    sincosf(f, &sn, &cs);  // full-range reduction (no fast-math intrinsics)
    cs *= attention_factor;
    sn *= attention_factor;
    ra[k] = a * cs - b * sn;
    rb[k] = b * cs + a * sn;
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i >= half) break;
    if (layout == RopeLanes::kInterleaved) {
      y[2 * i] = __float2bfloat16_rn(ra[k]);
      y[2 * i + 1] = __float2bfloat16_rn(rb[k]);
    } else {
      y[i] = __float2bfloat16_rn(ra[k]);
      y[i + half] = __float2bfloat16_rn(rb[k]);
    }
  }
}

}  // namespace strata::kernels::rope_detail
