// Split-KV merge + W_UV projection of a few-row MLA decode call (see combine_project.h).
//
// Block (feature block f, head h, row b) of 256 threads: thread (r = tid / 8, c = tid % 8) owns
// output feature 32 f + r and the 16-byte chunks c, c + 8, ..., c + 56 of the 512-wide reduction
// (a row's 8 threads read 128 contiguous bytes per step, and their chunks of the merged row sit
// in 8 different bank groups of shared memory). Its 8 weight chunks are loaded before the
// programmatic-launch wait; after it the block merges the row (two halves of the threads over
// odd and even splits, float4 columns), rounds it to bf16 in shared memory, and each row's 8
// threads reduce their dot products by shuffles.
#include <string>

#include "kernels/common/alignment.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm80_ptx.cuh"
#include "kernels/mla_decode/combine_project.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/mla_decode/split_weights.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunks = kMlaValueDim / 8;  // 16-byte chunks of a 512-wide row
constexpr int kChunksPerThread = kChunks / 8;
constexpr int kColumns = kMlaValueDim / 4;  // float4 columns of a partial row
static_assert(kThreads == 8 * kMlaCombineProjectRows, "8 threads per output feature");
static_assert(kThreads == 2 * kColumns, "two halves of the block over the partials' columns");

__device__ __forceinline__ float Dot8(uint4 w, uint4 x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ws[i]));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[i]));
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads) MlaCombineProjectKernel(MlaCombineProjectParams p) {
  __shared__ float weight[kMlaMaxSplits];
  __shared__ float4 half_sum[kColumns];
  __shared__ uint4 row_bf16[kChunks];
  const int r = threadIdx.x / 8, c = threadIdx.x % 8;
  const int feature = blockIdx.x * kMlaCombineProjectRows + r, h = blockIdx.y, b = blockIdx.z;
  const uint4* w = reinterpret_cast<const uint4*>(p.w_uv + h * p.w_head_stride +
                                                  static_cast<int64_t>(feature) * kMlaValueDim);
  uint4 wv[kChunksPerThread];
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) wv[i] = LoadStream(w + c + 8 * i);
  PdlGridSync();

  const int ns = p.num_splits, h_q = p.num_heads_q;
  if (ns == 1) {
    if (threadIdx.x < kChunks) {
      row_bf16[threadIdx.x] = reinterpret_cast<const uint4*>(
          p.o_lat + (static_cast<int64_t>(b) * h_q + h) * kMlaValueDim)[threadIdx.x];
    }
  } else {
    // Half j of the block sums splits j, j + 2, ... of float4 column `col`. The first
    // kFirst of each half's splits are read before their weights are known, so that their L2
    // round trip and the lse's overlap; a split of weight 0 (empty: its partial may hold anything)
    // is replaced by zeros after the load instead of not being read.
    constexpr int kFirst = 16;
    const int half = threadIdx.x / kColumns, col = threadIdx.x % kColumns;
    const float4* o = reinterpret_cast<const float4*>(p.o_accum) +
                      (static_cast<int64_t>(b) * ns * h_q + h) * kColumns + col;
    const int64_t split_stride = static_cast<int64_t>(h_q) * kColumns;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 first[kFirst];
#pragma unroll
    for (int k = 0; k < kFirst; ++k) {
      const int s = half + 2 * k;
      first[k] = s < ns ? o[s * split_stride] : zero;
    }
    // The splits' weights e^(lse_s - lse) (warp 0; lanes over splits), as the combine kernel.
    if (threadIdx.x < 32) {
      (void)mla_detail::MergeSplitWeights(p.lse_accum + static_cast<int64_t>(b) * ns * h_q + h, h_q,
                                          ns, threadIdx.x, weight);
    }
    __syncthreads();
    float4 acc = zero;
#pragma unroll
    for (int k = 0; k < kFirst; ++k) {
      const int s = half + 2 * k;
      const float w = s < ns ? weight[s] : 0.f;
      mla_detail::AddScaled(acc, w, w != 0.f ? first[k] : zero);
    }
    // Splits past 2 * kFirst, 8 loads in flight, only those of nonzero weight read.
    for (int s0 = half + 2 * kFirst; s0 < ns; s0 += 16) {
      float4 v[8];
      float ws[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int s = s0 + 2 * k;
        ws[k] = s < ns ? weight[s] : 0.f;
        v[k] = ws[k] != 0.f ? o[s * split_stride] : zero;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) mla_detail::AddScaled(acc, ws[k], v[k]);
    }
    if (half == 1) half_sum[col] = acc;
    __syncthreads();
    if (half == 0) {
      const float4 other = half_sum[col];
      const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x + other.x, acc.y + other.y);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z + other.z, acc.w + other.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      reinterpret_cast<uint2*>(row_bf16)[col] = packed;
    }
  }
  __syncthreads();
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) dot = Dot8(wv[i], row_bf16[c + 8 * i], dot);
  for (int o = 4; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if (c == 0) {
    p.out[static_cast<int64_t>(b) * p.ld_out + static_cast<int64_t>(h) * p.v_dim + feature] =
        __float2bfloat16_rn(dot);
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchMlaCombineProject: " + what);
}

}  // namespace

absl::Status ValidateMlaCombineProjectParams(const MlaCombineProjectParams& p) {
  if (p.batch <= 0 || p.batch > 65535) return Invalid("batch must be in [1, 65535]");
  if (p.num_heads <= 0 || p.num_heads > p.num_heads_q || p.num_heads > 65535) {
    return Invalid("num_heads must be in [1, num_heads_q]");
  }
  if (p.num_splits < 1 || p.num_splits > kMlaMaxSplits) {
    return Invalid("num_splits must be in [1, " + std::to_string(kMlaMaxSplits) + "]");
  }
  if (p.v_dim <= 0 || p.v_dim % kMlaCombineProjectRows != 0) {
    return Invalid("v_dim must be a positive multiple of " +
                   std::to_string(kMlaCombineProjectRows));
  }
  if (p.ld_out < static_cast<int64_t>(p.num_heads) * p.v_dim) {
    return Invalid("ld_out must be >= num_heads * v_dim");
  }
  if (p.w_uv == nullptr || p.out == nullptr || Misaligned(p.w_uv) || p.w_head_stride % 8 != 0) {
    return Invalid("w_uv (16-byte aligned, head stride a multiple of 8) and out must be set");
  }
  if (p.num_splits == 1 ? p.o_lat == nullptr || Misaligned(p.o_lat)
                        : p.o_accum == nullptr || p.lse_accum == nullptr || Misaligned(p.o_accum)) {
    return Invalid("one split needs o_lat, more need o_accum and lse_accum (16-byte aligned)");
  }
  return absl::OkStatus();
}

absl::Status LaunchMlaCombineProject(const MlaCombineProjectParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateMlaCombineProjectParams(params); !st.ok()) return st;
  const dim3 grid(params.v_dim / kMlaCombineProjectRows, params.num_heads, params.batch);
  (void)LaunchPdl(MlaCombineProjectKernel, grid, dim3(kThreads), 0, stream, params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Invalid(cudaGetErrorString(err));
  return absl::OkStatus();
}

}  // namespace strata::kernels
