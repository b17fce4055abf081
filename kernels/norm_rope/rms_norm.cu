// RMSNorm (+ residual add, + the MoE combine before it): one block per row, 16-byte vectors, fp32
// sum of squares.
#include <string>

#include "kernels/common/alignment.h"
#include "kernels/common/pdl.cuh"
#include "kernels/norm_rope/rms_norm.h"
#include "kernels/norm_rope/rms_norm_row.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) RmsNormKernel(RmsNormParams p) {
  PdlGridSync();
  __shared__ float scratch[kThreads / 32];
  __shared__ norm_row::MoeChoices choices;
  const int64_t row = blockIdx.x;
  const int chunks = p.dim / 8;
  if (p.moe.top_k > 0) {
    norm_row::LoadChoices(p.moe, row, choices);
    __syncthreads();
  }
  float ss = 0.f;
  // Pass 1: h = bf16(x + residual), stored if fused; sum of squares of the rounded h.
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 h = norm_row::InputChunk(p, choices, row, c);
    if (p.residual != nullptr) {
      *reinterpret_cast<uint4*>(p.residual_out + row * p.ld_residual_out + c * 8) = h;
    }
    ss = norm_row::AddSquares(ss, h);
  }
  const float inv = norm_row::InverseRms<kThreads>(p, ss, scratch);
  // Pass 2: each thread re-reads only the chunks it wrote, so no barrier is needed.
  const __nv_bfloat16* h_src =
      p.residual != nullptr ? p.residual_out + row * p.ld_residual_out : p.x + row * p.ld_x;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 h = *reinterpret_cast<const uint4*>(h_src + c * 8);
    *reinterpret_cast<uint4*>(p.out + row * p.ld_out + c * 8) = norm_row::OutputChunk(p, h, c, inv);
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
