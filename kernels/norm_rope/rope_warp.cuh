// One RoPE vector rotated by one warp (the math of rope.h): every lane reads its pairs before any
// lane writes, so `y` may be `x` (in place, also for the de-interleaving layout).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

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

// Vector `head` of token `token` in a strided set (vector (t, h) at x + t * token_stride +
// h * head_stride), rotated in place or, when out is set, into out at its own strides.
struct StridedVectors {
  __nv_bfloat16* x;
  int64_t token_stride, head_stride;
  __nv_bfloat16* out;
  int64_t out_token_stride, out_head_stride;
};
__device__ __forceinline__ void RopeStrided(const StridedVectors& v, int64_t token, int head,
                                            int rope_dim, RopeLanes layout,
                                            const int32_t* positions, const float* inv_freq,
                                            float attention_factor, int lane) {
  const __nv_bfloat16* x = v.x + token * v.token_stride + head * v.head_stride;
  __nv_bfloat16* y = v.out == nullptr
                         ? v.x + token * v.token_stride + head * v.head_stride
                         : v.out + token * v.out_token_stride + head * v.out_head_stride;
  RopeWarp(x, y, rope_dim, layout, static_cast<float>(positions[token]), inv_freq, attention_factor,
           lane);
}

}  // namespace strata::kernels::rope_detail
