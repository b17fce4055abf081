// The log-sum-exp merge of split-KV partials, shared by the kernels that merge them
// (mla_decode_combine.cu, combine_project.cu).
#pragma once

#include <cstdint>

#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels::mla_detail {

static_assert(kMlaMaxSplits % 32 == 0, "a lane holds kMlaMaxSplits / 32 splits");

// acc += w * v, column by column (one fused multiply-add each): a split's weighted partial.
__device__ __forceinline__ void AddScaled(float4& acc, float w, float4 v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
}

// Called by all 32 lanes of one warp. Split s < ns (ns <= kMlaMaxSplits) of one (sequence, head)
// has its lse at lse_in[s * stride]; lane l takes splits l, l + 32. Writes weight[s] =
// e^(lse_s - lse) for s < ns (all 0 when every split is empty, lse -inf) and returns the merged
// lse = ln(sum_s e^lse_s) to every lane (-inf when every split is empty).
__device__ __forceinline__ float MergeSplitWeights(const float* lse_in, int64_t stride, int ns,
                                                   int lane, float* weight) {
  float l[kMlaMaxSplits / 32];
#pragma unroll
  for (int k = 0; k < kMlaMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    l[k] = s < ns ? lse_in[s * stride] : -INFINITY;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMlaMaxSplits / 32; ++k) mx = fmaxf(mx, l[k]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float total = 0.f;
  if (mx != -INFINITY) {
#pragma unroll
    for (int k = 0; k < kMlaMaxSplits / 32; ++k) total += __expf(l[k] - mx);
  }
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  const float lse = total > 0.f ? mx + __logf(total) : -INFINITY;
#pragma unroll
  for (int k = 0; k < kMlaMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    if (s < ns) weight[s] = total > 0.f ? __expf(l[k] - lse) : 0.f;
  }
  return lse;
}

}  // namespace strata::kernels::mla_detail
