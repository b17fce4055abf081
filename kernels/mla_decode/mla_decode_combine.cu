// Log-sum-exp merge of the split-KV partials into the bf16 output and the lse.
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode.cuh"

namespace strata::kernels {
namespace mla_detail {

// The split lse values go through shared memory in one load each, and the partials are read
// eight splits at a time, so the loads of a (sequence, head) are in flight together instead of one
// L2 round trip per split (at batch 1 with 64 splits that chain was ~24 us). Same arithmetic, in
// the same order, as a plain loop over the splits.
__global__ void __launch_bounds__(128) MlaDecodeCombineKernel(MlaDecodeParams p) {
  __shared__ float split_lse[kMlaMaxSplits];
  PdlGridSync();
  const int head = blockIdx.x, b = blockIdx.y, h_q = p.num_heads_q, ns = p.num_splits;
  const float* lse_in = p.lse_accum + static_cast<size_t>(b) * ns * h_q + head;
  if (threadIdx.x < ns) split_lse[threadIdx.x] = lse_in[threadIdx.x * h_q];
  __syncthreads();
  float lse_max = -INFINITY;
  for (int s = 0; s < ns; ++s) lse_max = fmaxf(lse_max, split_lse[s]);
  float total = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < ns; ++s) total += __expf(split_lse[s] - lse_max);
  }
  const float lse = total > 0.f ? lse_max + __logf(total) : -INFINITY;
  const int col = threadIdx.x * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (total > 0.f) {
    constexpr int kBatch = 8;
    for (int s0 = 0; s0 < ns; s0 += kBatch) {
      float w[kBatch];
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int s = s0 + j;
        w[j] = s < ns ? __expf(split_lse[s] - lse) : 0.f;
        // An empty split (weight 0) has a partial of 0: skip its read.
        v[j] = w[j] != 0.f
                   ? *reinterpret_cast<const float4*>(
                         p.o_accum +
                         ((static_cast<size_t>(b) * ns + s) * h_q + head) * kMlaValueDim + col)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (w[j] == 0.f) continue;
        acc.x += w[j] * v[j].x;
        acc.y += w[j] * v[j].y;
        acc.z += w[j] * v[j].z;
        acc.w += w[j] * v[j].w;
      }
    }
  }
  __nv_bfloat16* out = p.out + (static_cast<size_t>(b) * h_q + head) * kMlaValueDim + col;
  reinterpret_cast<__nv_bfloat162*>(out)[0] = __floats2bfloat162_rn(acc.x, acc.y);
  reinterpret_cast<__nv_bfloat162*>(out)[1] = __floats2bfloat162_rn(acc.z, acc.w);
  if (threadIdx.x == 0) p.lse[static_cast<size_t>(b) * h_q + head] = lse;
}

}  // namespace mla_detail

absl::Status LaunchMlaDecodeCombine(const MlaDecodeParams& params, cudaStream_t stream) {
  const dim3 grid(params.num_heads_q, params.batch);
  (void)LaunchPdl(mla_detail::MlaDecodeCombineKernel, grid, dim3(kMlaValueDim / 4), 0, stream,
                  params);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
