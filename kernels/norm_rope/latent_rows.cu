// Latent rows: one block per token; warps 0-1 norm the rank lanes (one 16-byte chunk per thread
// per turn, the sum of squares reduced in rms_norm.cu's order), warp 2 rotates k_pe. The query
// part: blocks (token, y >= 1), one q_pe vector per warp.
#include <string>

#include "kernels/common/alignment.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm80_ptx.cuh"
#include "kernels/norm_rope/latent_rows.h"
#include "kernels/norm_rope/rope_warp.cuh"

namespace strata::kernels {
namespace {

constexpr int kNormWarps = 2;
constexpr int kNormThreads = 32 * kNormWarps;
constexpr int kThreads = kNormThreads + 32;
constexpr int kMaxTurns = kLatentRowsMaxRank / 8 / kNormThreads;

constexpr int kQueryHeadsPerBlock = kThreads / 32;

__device__ __forceinline__ void LatentRowsBody(const LatentRowsParams& p) {
  __shared__ float scratch[kNormWarps];
  const int64_t token = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (blockIdx.y > 0) {
    const int head = (blockIdx.y - 1) * kQueryHeadsPerBlock + warp;
    if (head >= p.q_heads) return;
    rope_detail::RopeStrided({p.q, p.q_token_stride, p.q_head_stride, p.q_out, p.q_out_token_stride,
                              p.q_out_head_stride},
                             token, head, p.rope_dim, p.layout, p.positions, p.inv_freq,
                             p.attention_factor, lane);
    return;
  }
  const __nv_bfloat16* src = p.in + token * p.ld_in;
  __nv_bfloat16* dst = p.out + p.out_rows[token] * p.ld_out;
  const int chunks = p.rank / 8;
  Bf16x8 h[kMaxTurns];
  if (warp < kNormWarps) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxTurns; ++k) {
      const int c = threadIdx.x + k * kNormThreads;
      if (c >= chunks) break;
      h[k].u = *reinterpret_cast<const uint4*>(src + c * 8);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float f = __bfloat162float(h[k].h[i]);
        ss += f * f;
      }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) scratch[warp] = ss;
  }
  __syncthreads();
  if (warp < kNormWarps) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kNormWarps; ++w) total += scratch[w];
    const float inv = rsqrtf(total / static_cast<float>(p.rank) + p.eps);
#pragma unroll
    for (int k = 0; k < kMaxTurns; ++k) {
      const int c = threadIdx.x + k * kNormThreads;
      if (c >= chunks) break;
      Bf16x8 w, o;
      w.u = *reinterpret_cast<const uint4*>(p.norm_weight + c * 8);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float n = __bfloat162float(__float2bfloat16_rn(__bfloat162float(h[k].h[i]) * inv));
        o.h[i] = __float2bfloat16_rn(__bfloat162float(w.h[i]) * n);
      }
      *reinterpret_cast<uint4*>(dst + c * 8) = o.u;
    }
  } else {
    rope_detail::RopeWarp(src + p.rank, dst + p.rank, p.rope_dim, p.layout,
                          static_cast<float>(p.positions[token]), p.inv_freq, p.attention_factor,
                          lane);
  }
}

// kBeside: LatentRowsParams::beside_previous (pdl.cuh's PdlLaunchNext / PdlWaitBeforeExit).
template <bool kBeside>
__global__ void __launch_bounds__(kThreads) LatentRowsKernel(LatentRowsParams p) {
  if constexpr (kBeside) {
    PdlLaunchNext();
    LatentRowsBody(p);
    PdlWaitBeforeExit();
  } else {
    PdlGridSync();
    LatentRowsBody(p);
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchLatentRows: " + what);
}

}  // namespace

absl::Status ValidateLatentRowsParams(const LatentRowsParams& p) {
  if (p.num_tokens < 0) return Invalid("num_tokens must be >= 0");
  if (p.rank <= 0 || p.rank % 8 != 0 || p.rank > kLatentRowsMaxRank) {
    return Invalid("rank must be a positive multiple of 8, <= " +
                   std::to_string(kLatentRowsMaxRank));
  }
  if (p.rope_dim <= 0 || p.rope_dim % 2 != 0 || p.rope_dim > kRopeMaxDim) {
    return Invalid("rope_dim must be even and <= " + std::to_string(kRopeMaxDim));
  }
  if (static_cast<int>(p.layout) < 0 || static_cast<int>(p.layout) > 2) {
    return Invalid("unknown layout");
  }
  const int64_t width = p.rank + p.rope_dim;
  if (p.ld_in < width || p.ld_in % 8 != 0 || p.ld_out < width || p.ld_out % 8 != 0) {
    return Invalid("ld_in and ld_out must be multiples of 8 and >= rank + rope_dim");
  }
  if (p.in == nullptr || p.norm_weight == nullptr || p.positions == nullptr ||
      p.inv_freq == nullptr || p.out == nullptr || p.out_rows == nullptr) {
    return Invalid("in, norm_weight, positions, inv_freq, out and out_rows must be set");
  }
  if (Misaligned(p.in) || Misaligned(p.norm_weight) || Misaligned(p.out)) {
    return Invalid("in, norm_weight and out must be 16-byte aligned");
  }
  if (!(p.attention_factor > 0.f)) return Invalid("attention_factor must be positive");
  if (p.q_heads < 0 || p.q_heads > 65534 * kQueryHeadsPerBlock) {  // grid y: 1 + query blocks
    return Invalid("q_heads out of range");
  }
  if (p.q_heads > 0) {
    if (p.q == nullptr) return Invalid("q_heads needs q");
    if (p.q_token_stride < 0 || p.q_head_stride < 0 || p.q_out_token_stride < 0 ||
        p.q_out_head_stride < 0) {
      return Invalid("query strides must be >= 0");
    }
  }
  return absl::OkStatus();
}

absl::Status LaunchLatentRows(const LatentRowsParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateLatentRowsParams(params); !st.ok()) return st;
  if (params.num_tokens == 0) return absl::OkStatus();
  const unsigned query_blocks =
      static_cast<unsigned>((params.q_heads + kQueryHeadsPerBlock - 1) / kQueryHeadsPerBlock);
  (void)LaunchPdl(params.beside_previous ? LatentRowsKernel<true> : LatentRowsKernel<false>,
                  dim3(static_cast<unsigned>(params.num_tokens), 1 + query_blocks), dim3(kThreads),
                  0, stream, params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchLatentRows: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
