// MoE router: one warp per token, scores and choices in shared memory; top-k by k rounds of a warp
// arg-max (value descending, index ascending on ties), as cpu::RouteToken's partial sort orders;
// with the alignment (MoeAlignment) for one token from the same warp, for up to
// kMoeRouterAlignMaxTokens from the block that routed them all.
#include <cmath>
#include <string>

#include "kernels/common/pdl.cuh"
#include "kernels/moe_router/align_block.cuh"
#include "kernels/moe_router/moe_router.h"
#include "kernels/moe_router/route_token.cuh"

namespace strata::kernels {
namespace {

constexpr int kWarps = 4;  // tokens per block, unless the block aligns its tokens' choices
constexpr int kMaxThreads = 32 * kMoeRouterAlignMaxTokens;

// One warp per token (blockDim.x / 32 tokens per block; shared memory: RouterSmemBytes).
// kAlignBlock: the block holds every token, and aligns their choices once they are all written.
template <bool kAlignBlock>
__global__ void __launch_bounds__(kMaxThreads) MoeRouterKernel(MoeRouterParams p) {
  PdlGridSync();
  extern __shared__ float s_route[];  // [warps][2][num_experts]: scores, choices
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (token < p.num_tokens) {
    float* score = s_route + 2 * warp * p.num_experts;
    const moe_route::RoutedChoice c =
        moe_route::RouteToken(p, token, lane, score, score + p.num_experts);
    if (lane < p.top_k) {
      p.experts[token * p.top_k + lane] = c.expert;
      p.weights[token * p.top_k + lane] = c.weight;
    }
    const int expert = c.expert;
    if (!kAlignBlock && p.align.expert_count != nullptr) {
      moe_route::AlignOneToken(p.align, p.num_experts, p.top_k, expert, lane);
    }
  }
  if constexpr (kAlignBlock) {
    __syncthreads();  // every token's choices are written (global writes, seen by the block)
    moe_align::AlignChoices<kMoeMaxExperts>(p.experts, p.num_tokens, p.top_k, p.num_experts,
                                            p.align);
  }
}

size_t RouterSmemBytes(int warps, int num_experts) {
  return static_cast<size_t>(warps) * 2 * num_experts * sizeof(float);
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchMoeRouter: " + what);
}

}  // namespace

absl::Status ValidateMoeRouterParams(const MoeRouterParams& p) {
  if (p.num_tokens < 0) return Invalid("num_tokens must be >= 0");
  if (p.num_experts <= 0 || p.num_experts > kMoeMaxExperts) {
    return Invalid("num_experts must be in [1, " + std::to_string(kMoeMaxExperts) + "]");
  }
  if (p.top_k <= 0 || p.top_k > kMoeMaxTopK || p.top_k > p.num_experts) {
    return Invalid("top_k must be in [1, min(32, num_experts)]");
  }
  if (p.n_group <= 0 || p.n_group > 32 || p.num_experts % p.n_group != 0) {
    return Invalid("n_group must divide num_experts and be <= 32");
  }
  if (p.topk_group <= 0 || p.topk_group > p.n_group) return Invalid("topk_group out of range");
  if (p.topk_method == MoeTopkMethod::kNoauxTc && p.n_group > 1 && p.num_experts / p.n_group < 2) {
    return Invalid("noaux_tc groups need at least 2 experts");
  }
  if (p.logits == nullptr || p.experts == nullptr || p.weights == nullptr) {
    return Invalid("logits, experts and weights must be set");
  }
  if (p.ld_logits < p.num_experts) return Invalid("ld_logits < num_experts");
  if (!std::isfinite(p.routed_scaling_factor)) return Invalid("routed_scaling_factor not finite");
  if (const int set = MoeAlignmentArraysSet(p.align); set > 0) {
    if (p.num_tokens > kMoeRouterAlignMaxTokens) {
      return Invalid("align outputs are for calls of up to " +
                     std::to_string(kMoeRouterAlignMaxTokens) + " tokens");
    }
    if (set != kMoeAlignmentArrays) return Invalid("align: every array must be set, or none");
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeRouter(const MoeRouterParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateMoeRouterParams(params); !st.ok()) return st;
  if (params.num_tokens == 0) return absl::OkStatus();
  // Two or more tokens with their alignment: one block of a warp per token, which aligns them.
  const bool align_block = params.num_tokens > 1 && MoeAlignmentArraysSet(params.align) > 0;
  const int warps = align_block ? params.num_tokens : kWarps;
  const int blocks = (params.num_tokens + warps - 1) / warps;
  const size_t smem = RouterSmemBytes(warps, params.num_experts);
  auto* kernel = align_block ? MoeRouterKernel<true> : MoeRouterKernel<false>;
  cudaError_t err = cudaSuccess;
  if (smem > 32 * 1024) {  // past the default once AlignChoices' own arrays are added
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
  }
  if (err == cudaSuccess) {
    (void)LaunchPdl(kernel, dim3(blocks), dim3(32 * warps), smem, stream, params);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchMoeRouter: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
