// Log-sum-exp merge of the split-KV partials into the bf16 output and the lse.
#include "common/cuda/cuda_status.h"
#include "kernels/mla_decode/mla_decode.cuh"

namespace strata::kernels {
namespace mla_detail {

__global__ void __launch_bounds__(128) MlaDecodeCombineKernel(MlaDecodeParams p) {
  const int head = blockIdx.x, b = blockIdx.y, h_q = p.num_heads_q, ns = p.num_splits;
  const float* lse_in = p.lse_accum + static_cast<size_t>(b) * ns * h_q + head;
  float lse_max = -INFINITY;
  for (int s = 0; s < ns; ++s) lse_max = fmaxf(lse_max, lse_in[s * h_q]);
  float total = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < ns; ++s) total += __expf(lse_in[s * h_q] - lse_max);
  }
  const float lse = total > 0.f ? lse_max + __logf(total) : -INFINITY;
  const int col = threadIdx.x * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (total > 0.f) {
    for (int s = 0; s < ns; ++s) {
      const float w = __expf(lse_in[s * h_q] - lse);
      if (w == 0.f) continue;  // empty split: its partial is 0, skip the read
      const float4 v = *reinterpret_cast<const float4*>(
          p.o_accum + ((static_cast<size_t>(b) * ns + s) * h_q + head) * kMlaValueDim + col);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
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
  mla_detail::MlaDecodeCombineKernel<<<grid, kMlaValueDim / 4, 0, stream>>>(params);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
