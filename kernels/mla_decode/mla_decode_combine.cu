// Log-sum-exp merge of the split-KV partials into the bf16 output and the lse.
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode.cuh"
#include "kernels/mla_decode/split_weights.cuh"

namespace strata::kernels {
namespace mla_detail {

// One block per (sequence, head). Warp 0 reduces the split lse values (lanes over splits) into
// the merged lse and each split's weight exp(lse_s - lse) in shared memory; then warp w sums
// splits w, w + 8, ... for all 512 columns (lane: 4 float4 of columns, two splits' loads in flight
// together), and the warps' partial sums are added in shared memory in warp order. At batch 1
// one block had walked all splits for its 4 columns per thread, the lse loops included, serially
// (~7.4 us for 32 splits of 16 heads on the H200). Each warp's first two splits are read before
// the weights are known (their L2 round trip overlaps the lse's), and dropped if empty (weight 0:
// the partial may hold anything); later empty splits are not read.

__global__ void __launch_bounds__(kCombineThreads) MlaDecodeCombineKernel(MlaDecodeParams p) {
  __shared__ float weight[kMlaMaxSplits];
  __shared__ float merged_lse;
  __shared__ float4 part[kCombineWarps][kMlaValueDim / 4];
  PdlGridSync();
  const int head = blockIdx.x, b = blockIdx.y, h_q = p.num_heads_q, ns = p.num_splits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float4* base = reinterpret_cast<const float4*>(
      p.o_accum + (static_cast<size_t>(b) * ns * h_q + head) * kMlaValueDim);
  const size_t split_stride = static_cast<size_t>(h_q) * kMlaValueDim / 4;  // in float4
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  // Splits s and t = s + kCombineWarps of one step into vs and vt (zeros past ns, or where
  // `read` says no).
  auto load = [&](int s, bool read_s, bool read_t, float4(&vs)[4], float4(&vt)[4]) {
    const int t = s + kCombineWarps;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      vs[j] = read_s && s < ns ? base[s * split_stride + lane + 32 * j] : zero;
      vt[j] = read_t && t < ns ? base[t * split_stride + lane + 32 * j] : zero;
    }
  };
  float4 vs[4], vt[4];
  load(warp, true, true, vs, vt);  // the first step, before the weights
  if (warp == 0) {
    const float lse = MergeSplitWeights(p.lse_accum + static_cast<size_t>(b) * ns * h_q + head, h_q,
                                        ns, lane, weight);
    if (lane == 0) merged_lse = lse;
  }
  __syncthreads();
  float4 acc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) acc[j] = zero;
  auto add = [&](float w, const float4(&v)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) AddScaled(acc[j], w, v[j]);
  };
  for (int s = warp; s < ns; s += 2 * kCombineWarps) {
    const int t = s + kCombineWarps;
    const float ws = weight[s], wt = t < ns ? weight[t] : 0.f;
    if (s != warp) load(s, ws != 0.f, wt != 0.f, vs, vt);
    if (ws != 0.f) add(ws, vs);
    if (wt != 0.f) add(wt, vt);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) part[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (threadIdx.x < kMlaValueDim / 4) {
    float4 sum = part[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kCombineWarps; ++w) {
      const float4 q = part[w][threadIdx.x];
      sum.x += q.x;
      sum.y += q.y;
      sum.z += q.z;
      sum.w += q.w;
    }
    __nv_bfloat16* out =
        p.out + (static_cast<size_t>(b) * h_q + head) * kMlaValueDim + 4 * threadIdx.x;
    reinterpret_cast<__nv_bfloat162*>(out)[0] = __floats2bfloat162_rn(sum.x, sum.y);
    reinterpret_cast<__nv_bfloat162*>(out)[1] = __floats2bfloat162_rn(sum.z, sum.w);
  }
  if (threadIdx.x == 0) p.lse[static_cast<size_t>(b) * h_q + head] = merged_lse;
}

}  // namespace mla_detail

absl::Status LaunchMlaDecodeCombine(const MlaDecodeParams& params, cudaStream_t stream) {
  const dim3 grid(params.num_heads_q, params.batch);
  (void)LaunchPdl(mla_detail::MlaDecodeCombineKernel, grid, dim3(mla_detail::kCombineThreads), 0,
                  stream, params);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
