// MoE routing -> per-expert slot groups, in one CTA (decode and prefill sizes alike: the work is
// a few passes over tokens * top_k ints).
#include <string>

#include "kernels/common/pdl.cuh"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_router/align_block.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads) MoeAlignKernel(MoeAlignParams p) {
  PdlGridSync();
  moe_align::AlignChoices<kMoeAlignMaxExperts>(p.experts, p.num_tokens, p.top_k, p.num_experts,
                                               p.out);
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchMoeAlign: " + what);
}

}  // namespace

absl::Status ValidateMoeAlignParams(const MoeAlignParams& p) {
  if (p.num_tokens < 0 || p.top_k <= 0) return Invalid("num_tokens >= 0 and top_k > 0 needed");
  if (p.num_experts <= 0 || p.num_experts > kMoeAlignMaxExperts) {
    return Invalid("num_experts must be in 1.." + std::to_string(kMoeAlignMaxExperts));
  }
  if (static_cast<int64_t>(p.num_tokens) * p.top_k > (int64_t{1} << 30)) {
    return Invalid("too many choices");
  }
  if (p.experts == nullptr || MoeAlignmentArraysSet(p.out) != kMoeAlignmentArrays) {
    return Invalid("every pointer must be set");
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeAlign(const MoeAlignParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateMoeAlignParams(params); !st.ok()) return st;
  (void)LaunchPdl(MoeAlignKernel, dim3(1), dim3(kThreads), 0, stream, params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchMoeAlign: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
