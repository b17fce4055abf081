// SwiGLU activation of the DeepSeek MLPs and experts: out = bf16(silu(gate) * up), computed in
// fp32 from bf16 inputs (silu(g) = g / (1 + exp(-g))), as the CPU backend's MlpForward does.
//
// gate and up are [rows][dim] at row strides ld_gate / ld_up (elements); a fused gate|up GEMM
// output [rows][2 * dim] is gate = base, up = base + dim, ld = 2 * dim. out may alias gate.
// Thread safety: stateless.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

struct SiluMulParams {
  int rows = 0;
  int dim = 0;  // a multiple of 8
  const __nv_bfloat16* gate = nullptr;
  int64_t ld_gate = 0;
  const __nv_bfloat16* up = nullptr;
  int64_t ld_up = 0;
  __nv_bfloat16* out = nullptr;
  int64_t ld_out = 0;
};

absl::Status ValidateSiluMulParams(const SiluMulParams& params);
absl::Status LaunchSiluMul(const SiluMulParams& params, cudaStream_t stream);

}  // namespace strata::kernels
