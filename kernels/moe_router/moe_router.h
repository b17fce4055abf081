// MoE router of DeepSeek-V2/V3: expert scores, optional correction bias, group-limited top-k and
// the weight normalization/scaling, with the exact rules of the CPU backend (cpu::RouteToken in
// compute_nodes/backend/cpu/cpu_ops.cc, itself transformers' DeepSeek routers):
//
//   score[e]  = softmax(logits)[e]  or  sigmoid(logits[e])     (double, rounded to fp32)
//   choice[e] = score[e] (+ bias[e] for noaux_tc)
//   groups (topk_method != greedy, n_group > 1): group score = top-2 sum (noaux_tc) or max
//     (group_limited_greedy) of choice; the best topk_group groups are kept; experts of dropped
//     groups get choice 0.0 (not -inf, as transformers)
//   experts   = top_k of choice, descending, ties to the lower index
//   weight[k] = score[experts[k]]; if normalize: / (sum + 1e-20); then * routed_scaling_factor
// `normalize` is the caller's (type == DeepSeek-V3 && norm_topk_prob), as RouteToken decides.
//
// One warp per token; logits are the fp32 router GEMM output. Thread safety: stateless.
//
// A one-token call (a batch-1 decode step) can also write what LaunchMoeAlign
// (kernels/moe_experts/moe_experts.h) would for its choices, so no alignment launch follows it
// on the step's critical path (MoeRouterAlign below).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

enum class MoeScoring { kSoftmax = 0, kSigmoid = 1 };
enum class MoeTopkMethod { kGreedy = 0, kGroupLimitedGreedy = 1, kNoauxTc = 2 };

inline constexpr int kMoeMaxExperts = 512;
inline constexpr int kMoeMaxTopK = 32;

// LaunchMoeAlign's outputs for one token's choices, written by the router's warp. The contract of
// MoeAlignParams holds with two differences: the active experts are listed in choice order (slot
// i holds the i-th valid choice), not ascending, and expert_offset is written for the chosen
// experts and at [num_experts] only. A choice outside [0, num_experts) (NaN logits) gets
// token_slot -1 and sets *error, as there.
struct MoeRouterAlign {
  int32_t* expert_count = nullptr;   // [num_experts]
  int32_t* expert_offset = nullptr;  // [num_experts + 1]
  int32_t* active = nullptr;         // [num_experts]
  int32_t* num_active = nullptr;     // [1]
  int32_t* slot_token = nullptr;     // [top_k]
  int64_t* token_slot = nullptr;     // [top_k]
  int32_t* error = nullptr;          // [1]
};

struct MoeRouterParams {
  int num_tokens = 0;
  int num_experts = 0;  // <= kMoeMaxExperts
  int top_k = 0;        // <= min(kMoeMaxTopK, num_experts)
  MoeScoring scoring = MoeScoring::kSigmoid;
  MoeTopkMethod topk_method = MoeTopkMethod::kNoauxTc;
  int n_group = 1;     // divides num_experts, <= 32
  int topk_group = 1;  // <= n_group
  bool normalize = true;
  float routed_scaling_factor = 1.f;
  const float* logits = nullptr;  // [num_tokens][ld_logits]
  int64_t ld_logits = 0;
  const float* bias = nullptr;  // [num_experts] or null (used by noaux_tc only)
  int32_t* experts = nullptr;   // [num_tokens][top_k]
  float* weights = nullptr;     // [num_tokens][top_k]
  // Set (every pointer) for num_tokens == 1 only: the alignment of the choices (see above).
  MoeRouterAlign align;
};

absl::Status ValidateMoeRouterParams(const MoeRouterParams& params);
absl::Status LaunchMoeRouter(const MoeRouterParams& params, cudaStream_t stream);

}  // namespace strata::kernels
