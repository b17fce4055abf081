// SiLU x mul: a grid-stride loop over 16-byte chunks of all rows.
#include <algorithm>
#include <string>

#include "kernels/activation/silu_mul.h"
#include "kernels/common/alignment.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm80_ptx.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

using Vec8 = Bf16x8;

__global__ void __launch_bounds__(kThreads) SiluMulKernel(SiluMulParams p) {
  PdlGridSync();
  const int64_t chunks_per_row = p.dim / 8;
  const int64_t total = chunks_per_row * p.rows;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; c < total;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = c / chunks_per_row, col = (c % chunks_per_row) * 8;
    Vec8 g, u, o;
    g.u = *reinterpret_cast<const uint4*>(p.gate + row * p.ld_gate + col);
    u.u = *reinterpret_cast<const uint4*>(p.up + row * p.ld_up + col);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float gv = __bfloat162float(g.h[i]);
      o.h[i] = __float2bfloat16_rn(gv / (1.f + expf(-gv)) * __bfloat162float(u.h[i]));
    }
    *reinterpret_cast<uint4*>(p.out + row * p.ld_out + col) = o.u;
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchSiluMul: " + what);
}

}  // namespace

absl::Status ValidateSiluMulParams(const SiluMulParams& p) {
  if (p.rows < 0) return Invalid("rows must be >= 0");
  if (p.dim <= 0 || p.dim % 8 != 0) return Invalid("dim must be a positive multiple of 8");
  if (p.gate == nullptr || p.up == nullptr || p.out == nullptr) {
    return Invalid("gate, up and out must be set");
  }
  if (p.ld_gate < p.dim || p.ld_up < p.dim || p.ld_out < p.dim || p.ld_gate % 8 != 0 ||
      p.ld_up % 8 != 0 || p.ld_out % 8 != 0) {
    return Invalid("row strides must be multiples of 8 and >= dim");
  }
  if (Misaligned(p.gate) || Misaligned(p.up) || Misaligned(p.out)) {
    return Invalid("gate, up and out must be 16-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status LaunchSiluMul(const SiluMulParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateSiluMulParams(params); !st.ok()) return st;
  const int64_t chunks = static_cast<int64_t>(params.rows) * (params.dim / 8);
  if (chunks == 0) return absl::OkStatus();
  const int64_t blocks = std::min<int64_t>((chunks + kThreads - 1) / kThreads, 132 * 16);
  (void)LaunchPdl(SiluMulKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                  params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchSiluMul: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
