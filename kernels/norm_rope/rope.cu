// RoPE: one warp per (token, head) vector (rope_warp.cuh).
#include <string>

#include "kernels/common/pdl.cuh"
#include "kernels/norm_rope/rope.h"
#include "kernels/norm_rope/rope_warp.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) RopeKernel(RopeParams p) {
  PdlGridSync();
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (vec >= static_cast<int64_t>(p.num_tokens) * p.num_heads) return;
  const int lane = threadIdx.x % 32;
  rope_detail::RopeStrided(
      {p.x, p.token_stride, p.head_stride, p.out, p.out_token_stride, p.out_head_stride},
      vec / p.num_heads, static_cast<int>(vec % p.num_heads), p.rope_dim, p.layout, p.positions,
      p.inv_freq, p.attention_factor, lane);
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchRope: " + what);
}

}  // namespace

absl::Status ValidateRopeParams(const RopeParams& p) {
  if (p.num_tokens < 0 || p.num_heads <= 0) return Invalid("num_tokens >= 0, num_heads > 0");
  if (p.rope_dim <= 0 || p.rope_dim % 2 != 0 || p.rope_dim > kRopeMaxDim) {
    return Invalid("rope_dim must be even and <= " + std::to_string(kRopeMaxDim));
  }
  if (static_cast<int>(p.layout) < 0 || static_cast<int>(p.layout) > 2) {
    return Invalid("unknown layout");
  }
  if (p.x == nullptr || p.positions == nullptr || p.inv_freq == nullptr) {
    return Invalid("x, positions and inv_freq must be set");
  }
  if (p.num_heads > 1 && p.head_stride < p.rope_dim) return Invalid("head_stride < rope_dim");
  if (p.num_tokens > 1 && p.token_stride < p.rope_dim) return Invalid("token_stride < rope_dim");
  if (p.out != nullptr) {
    if (p.num_heads > 1 && p.out_head_stride < p.rope_dim)
      return Invalid("out_head_stride < rope_dim");
    if (p.num_tokens > 1 && p.out_token_stride < p.rope_dim) {
      return Invalid("out_token_stride < rope_dim");
    }
  }
  if (!(p.attention_factor > 0.f)) return Invalid("attention_factor must be positive");
  return absl::OkStatus();
}

absl::Status LaunchRope(const RopeParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateRopeParams(params); !st.ok()) return st;
  const int64_t vectors = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  if (vectors == 0) return absl::OkStatus();
  const int64_t blocks = (vectors + kThreads / 32 - 1) / (kThreads / 32);
  if (blocks > 0x7fffffff) return Invalid("too many vectors");
  (void)LaunchPdl(RopeKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                  params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchRope: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
