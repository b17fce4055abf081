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
// A call of up to kMoeRouterAlignMaxTokens tokens (a decode step of few rows) can also write what
// LaunchMoeAlign (kernels/moe_experts/moe_experts.h) would for its choices, so no alignment launch
// follows it on the step's critical path (MoeAlignment below).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

enum class MoeScoring { kSoftmax = 0, kSigmoid = 1 };
enum class MoeTopkMethod { kGreedy = 0, kGroupLimitedGreedy = 1, kNoauxTc = 2 };

inline constexpr int kMoeMaxExperts = 512;
inline constexpr int kMoeMaxTopK = 32;
// The most tokens of a call that also writes its alignment (one block of a warp per token).
inline constexpr int kMoeRouterAlignMaxTokens = 16;

// The alignment of a routing into per-expert slot groups (device arrays; their contents are
// LaunchMoeAlign's, kernels/moe_experts/moe_experts.h). The router writes them for a call of up
// to kMoeRouterAlignMaxTokens tokens. One token: its warp, with two differences: the active
// experts are listed in choice order (slot i holds the i-th valid choice), not ascending, and
// expert_offset is written for the chosen experts and at [num_experts] only. More: the call runs
// as one block of a warp per token, which aligns the choices by LaunchMoeAlign's own code
// (align_block.cuh) once they are written. A choice outside [0, num_experts) gets token_slot -1
// and sets *error in all three.
struct MoeAlignment {
  int32_t* expert_count = nullptr;   // [num_experts]
  int32_t* expert_offset = nullptr;  // [num_experts + 1]
  int32_t* active = nullptr;         // [num_experts] (entries past *num_active: -1)
  int32_t* num_active = nullptr;     // [1]
  int32_t* slot_token = nullptr;     // [num_tokens * top_k]
  int64_t* token_slot = nullptr;     // [num_tokens][top_k]
  int32_t* error = nullptr;          // [1]
};

// How many of the alignment's 7 arrays are set (host-side checks: all or none).
inline int MoeAlignmentArraysSet(const MoeAlignment& a) {
  const void* arrays[] = {a.expert_count, a.expert_offset, a.active, a.num_active,
                          a.slot_token,   a.token_slot,    a.error};
  int set = 0;
  for (const void* p : arrays) set += p != nullptr;
  return set;
}
inline constexpr int kMoeAlignmentArrays = 7;

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
  // Set (every array) for num_tokens <= kMoeRouterAlignMaxTokens only: the alignment of the
  // choices (see above).
  MoeAlignment align;
};

absl::Status ValidateMoeRouterParams(const MoeRouterParams& params);
absl::Status LaunchMoeRouter(const MoeRouterParams& params, cudaStream_t stream);

}  // namespace strata::kernels
