// RMSNorm (+ residual add, + the MoE combine before it): one block per row, 16-byte vectors, fp32
// sum of squares.
#include <string>

#include "kernels/common/alignment.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm80_ptx.cuh"
#include "kernels/norm_rope/rms_norm.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

using Vec8 = Bf16x8;

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

// A row's MoE choices, staged in shared memory once per block (each chunk reads them all).
struct MoeChoices {
  int64_t slot[kRmsNormMaxTopK];
  float weight[kRmsNormMaxTopK];
};

// Chunk c (8 lanes) of a MoE block's output row (rms_norm.h's order of operations). The expert
// rows of up to kBatch choices are loaded before any is summed, so their loads overlap (one after
// another they made a one-row norm 7.2 us under Nsight Compute, against 3.9 without the sum).
__device__ __forceinline__ uint4 MoeSumChunk(const RmsNormMoeSum& m, const MoeChoices& ch,
                                             int64_t row, int c) {
  constexpr int kBatch = 8;
  float acc[8] = {};
  for (int k0 = 0; k0 < m.top_k; k0 += kBatch) {
    Vec8 e[kBatch];
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
    Vec8 sh;
    sh.u = *reinterpret_cast<const uint4*>(m.shared + row * m.ld_shared + c * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __bfloat162float(sh.h[i]));
  }
  Vec8 x;
#pragma unroll
  for (int i = 0; i < 8; ++i) x.h[i] = __float2bfloat16_rn(acc[i]);
  return x.u;
}

__global__ void __launch_bounds__(kThreads) RmsNormKernel(RmsNormParams p) {
  PdlGridSync();
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int chunks = p.dim / 8;
  const bool moe = p.moe.top_k > 0;
  const __nv_bfloat16* x = moe ? nullptr : p.x + row * p.ld_x;
  __shared__ MoeChoices choices;
  if (moe) {
    if (threadIdx.x < p.moe.top_k) {
      choices.slot[threadIdx.x] = p.moe.slot[row * p.moe.top_k + threadIdx.x];
      choices.weight[threadIdx.x] = p.moe.weight[row * p.moe.top_k + threadIdx.x];
    }
    __syncthreads();
  }
  float ss = 0.f;
  // Pass 1: h = bf16(x + residual), stored if fused; sum of squares of the rounded h.
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    Vec8 h;
    h.u = moe ? MoeSumChunk(p.moe, choices, row, c) : *reinterpret_cast<const uint4*>(x + c * 8);
    if (p.residual != nullptr) {
      Vec8 r;
      r.u = *reinterpret_cast<const uint4*>(p.residual + row * p.ld_residual + c * 8);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        h.h[i] = __float2bfloat16_rn(__bfloat162float(h.h[i]) + __bfloat162float(r.h[i]));
      }
      *reinterpret_cast<uint4*>(p.residual_out + row * p.ld_residual_out + c * 8) = h.u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float f = __bfloat162float(h.h[i]);
      ss += f * f;
    }
  }
  const float inv = rsqrtf(BlockSum(ss, scratch) / static_cast<float>(p.dim) + p.eps);
  // Pass 2: each thread re-reads only the chunks it wrote, so no barrier is needed.
  const __nv_bfloat16* h_src = p.residual != nullptr ? p.residual_out + row * p.ld_residual_out : x;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    Vec8 h, w, o;
    h.u = *reinterpret_cast<const uint4*>(h_src + c * 8);
    w.u = *reinterpret_cast<const uint4*>(p.weight + c * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float n = __bfloat162float(__float2bfloat16_rn(__bfloat162float(h.h[i]) * inv));
      o.h[i] = __float2bfloat16_rn(__bfloat162float(w.h[i]) * n);
    }
    *reinterpret_cast<uint4*>(p.out + row * p.ld_out + c * 8) = o.u;
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchRmsNorm: " + what);
}

}  // namespace

absl::Status ValidateRmsNormParams(const RmsNormParams& p) {
  if (p.rows < 0 || p.rows > (1 << 30)) return Invalid("rows out of range");
  if (p.dim <= 0 || p.dim % 8 != 0 || p.dim > 16384) {
    return Invalid("dim must be a positive multiple of 8 up to 16384, got " +
                   std::to_string(p.dim));
  }
  const RmsNormMoeSum& m = p.moe;
  if (m.top_k < 0 || m.top_k > kRmsNormMaxTopK) return Invalid("moe.top_k out of range");
  if (m.top_k > 0) {
    if (m.expert_out == nullptr || m.slot == nullptr || m.weight == nullptr) {
      return Invalid("moe needs expert_out, slot and weight");
    }
    if (p.residual == nullptr) return Invalid("moe needs the residual (its only consumer)");
    if (m.ld_expert_out < p.dim || m.ld_expert_out % 8 != 0 || Misaligned(m.expert_out)) {
      return Invalid("moe.expert_out: 16-byte aligned rows, ld a multiple of 8 and >= dim");
    }
    if (m.shared != nullptr &&
        (m.ld_shared < p.dim || m.ld_shared % 8 != 0 || Misaligned(m.shared))) {
      return Invalid("moe.shared: 16-byte aligned rows, ld a multiple of 8 and >= dim");
    }
  } else {
    if (p.x == nullptr) return Invalid("x must be set");
    if (p.ld_x < p.dim || p.ld_x % 8 != 0) return Invalid("ld_x must be a multiple of 8, >= dim");
    if (Misaligned(p.x)) return Invalid("x must be 16-byte aligned");
  }
  if (p.weight == nullptr || p.out == nullptr) return Invalid("weight and out must be set");
  if (p.ld_out < p.dim || p.ld_out % 8 != 0) {
    return Invalid("ld_out must be a multiple of 8 and >= dim");
  }
  if (Misaligned(p.out) || Misaligned(p.weight)) {
    return Invalid("weight and out must be 16-byte aligned");
  }
  if (p.residual != nullptr) {
    if (p.residual_out == nullptr) return Invalid("residual needs residual_out");
    if (p.ld_residual < p.dim || p.ld_residual_out < p.dim || p.ld_residual % 8 != 0 ||
        p.ld_residual_out % 8 != 0) {
      return Invalid("ld_residual and ld_residual_out must be multiples of 8 and >= dim");
    }
    if (Misaligned(p.residual) || Misaligned(p.residual_out)) {
      return Invalid("residual and residual_out must be 16-byte aligned");
    }
  }
  if (!(p.eps >= 0.f)) return Invalid("eps must be >= 0");
  return absl::OkStatus();
}

absl::Status LaunchRmsNorm(const RmsNormParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateRmsNormParams(params); !st.ok()) return st;
  if (params.rows == 0) return absl::OkStatus();
  (void)LaunchPdl(RmsNormKernel, dim3(params.rows), dim3(kThreads), 0, stream, params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return absl::InternalError(std::string("LaunchRmsNorm: ") + cudaGetErrorString(err));
  return absl::OkStatus();
}

}  // namespace strata::kernels
