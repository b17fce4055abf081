// MoE router: one warp per token, scores and choices in shared memory; the top-k in the order of
// cpu::RouteToken's partial sort (value descending, index ascending on ties): up to 128 experts
// from every choice's rank, counted by its lane, beyond that by k rounds of a warp arg-max; with
// the alignment (MoeAlignment) for one token from the same warp, for up to
// kMoeRouterAlignMaxTokens from the block that routed them all.
#include <cmath>
#include <string>

#include "kernels/common/pdl.cuh"
#include "kernels/moe_router/align_block.cuh"
#include "kernels/moe_router/moe_router.h"

namespace strata::kernels {
namespace {

constexpr int kWarps = 4;  // tokens per block, unless the block aligns its tokens' choices
constexpr int kMaxThreads = 32 * kMoeRouterAlignMaxTokens;

// Better of (v, i) and (w, j): larger value, then lower index.
__device__ __forceinline__ bool Better(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}

__device__ __forceinline__ void WarpArgMax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    const int j = __shfl_xor_sync(0xffffffffu, i, o);
    if (Better(w, j, v, i)) {
      v = w;
      i = j;
    }
  }
}

// Experts per lane whose logits, exponentials and ranks a warp keeps in registers.
constexpr int kKept = 4;

// The top_k of choice[0:E) by top_k rounds of a warp arg-max, each winner removed from its lane's
// candidates. Every lane gets the sum of the chosen scores (double, in choice order); lane k <
// top_k gets choice k and its score (expert 1 << 30 and weight 0 where no candidate is left: NaN
// choices never compare Better).
__device__ void TopKByRounds(int top_k, int E, int lane, const float* score, const float* choice,
                             double& weight_sum, int32_t& my_expert, float& my_weight) {
  uint32_t taken = 0;  // bit s: this lane's expert lane + 32 s is already chosen
  for (int k = 0; k < top_k; ++k) {
    float bv = -INFINITY;
    int bi = 1 << 30;
    for (int e = lane, slot = 0; e < E; e += 32, ++slot) {
      if ((taken >> slot) & 1u) continue;
      if (Better(choice[e], e, bv, bi)) {
        bv = choice[e];
        bi = e;
      }
    }
    WarpArgMax(bv, bi);
    const bool found = bi < E;
    if (found && bi % 32 == lane) taken |= 1u << (bi / 32);
    const float w = found ? score[bi] : 0.f;
    weight_sum += w;
    if (lane == k) {
      my_expert = bi;
      my_weight = w;
    }
  }
}

// The same result for E <= 32 * kPer from ranks: a lane counts, for each of its kPer choices,
// the choices Better than it (every one read from shared memory: E independent compares instead
// of top_k rounds of dependent shuffles). Better orders (value, index) totally, so the choices of
// rank 0..top_k-1 are the rounds' winners in order; NaN choices are not ranked.
template <int kPer>
__device__ void TopKByRank(int top_k, int E, int lane, const float* score, float* choice,
                           double& weight_sum, int32_t& my_expert, float& my_weight) {
  float mine[kPer];
  int rank[kPer];
  int valid = 0;
#pragma unroll
  for (int s = 0; s < kPer; ++s) {
    const int e = lane + 32 * s;
    mine[s] = e < E ? choice[e] : NAN;
    valid += !isnan(mine[s]);
    rank[s] = 0;
  }
#pragma unroll 4
  for (int j = 0; j < E; ++j) {
    const float y = choice[j];
#pragma unroll
    for (int s = 0; s < kPer; ++s) rank[s] += Better(y, j, mine[s], lane + 32 * s);
  }
  const int found = min(top_k, __reduce_add_sync(0xffffffffu, valid));
  int32_t* picked = reinterpret_cast<int32_t*>(choice);  // [top_k], once every lane has ranked
  __syncwarp();
#pragma unroll
  for (int s = 0; s < kPer; ++s) {
    if (!isnan(mine[s]) && rank[s] < top_k) picked[rank[s]] = lane + 32 * s;
  }
  __syncwarp();
  for (int k = 0; k < top_k; ++k) {
    const int e = k < found ? picked[k] : 1 << 30;
    const float w = k < found ? score[e] : 0.f;
    weight_sum += w;
    if (lane == k) {
      my_expert = e;
      my_weight = w;
    }
  }
}

// The alignment of the one token routed by this warp; lane k < top_k holds choice k. Every
// global write has one owner (no ordering between lanes needed).
__device__ void AlignOneToken(const MoeAlignment& a, int num_experts, int top_k, int expert,
                              int lane) {
  const bool valid = lane < top_k && expert >= 0 && expert < num_experts;
  const unsigned valid_mask = __ballot_sync(0xffffffffu, valid);
  const int num_valid = __popc(valid_mask);
  const int slot = __popc(valid_mask & ((1u << lane) - 1u));
  for (int e0 = 0; e0 < num_experts; e0 += 32) {
    int count = 0;
    for (int k = 0; k < top_k; ++k) {
      count += __shfl_sync(0xffffffffu, expert, k) == e0 + lane && ((valid_mask >> k) & 1u);
    }
    if (e0 + lane < num_experts) a.expert_count[e0 + lane] = count;
  }
  if (valid) {
    a.active[slot] = expert;
    a.expert_offset[expert] = slot;
    a.slot_token[slot] = 0;
  }
  if (lane < top_k) a.token_slot[lane] = valid ? slot : -1;
  for (int i = num_valid + lane; i < num_experts; i += 32) a.active[i] = -1;
  if (lane == 0) {
    a.expert_offset[num_experts] = num_valid;
    *a.num_active = num_valid;
    if (num_valid < top_k) *a.error = 1;
  }
}

// Routes `token` by one warp (score and choice: num_experts floats of shared memory each) and
// writes its experts and weights; lane k < top_k returns choice k's expert.
__device__ int RouteToken(const MoeRouterParams& p, int64_t token, int lane, float* score,
                          float* choice) {
  const float* logits = p.logits + token * p.ld_logits;
  const int E = p.num_experts;

  if (p.scoring == MoeScoring::kSoftmax) {
    // The first kKept logits of the lane and their exponentials stay in registers (every expert
    // up to 32 * kKept); the sum runs in the same order either way.
    float logit[kKept];
    double ex[kKept];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kKept; ++s) {
      const int e = lane + 32 * s;
      logit[s] = e < E ? logits[e] : -INFINITY;
      mx = fmaxf(mx, logit[s]);
    }
    for (int e = lane + 32 * kKept; e < E; e += 32) mx = fmaxf(mx, logits[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
#pragma unroll
    for (int s = 0; s < kKept; ++s) {
      if (lane + 32 * s < E) {
        ex[s] = exp(static_cast<double>(logit[s] - mx));
        sum += ex[s];
      }
    }
    for (int e = lane + 32 * kKept; e < E; e += 32) sum += exp(static_cast<double>(logits[e] - mx));
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int s = 0; s < kKept; ++s) {
      const int e = lane + 32 * s;
      if (e < E) score[e] = static_cast<float>(ex[s] / sum);
    }
    for (int e = lane + 32 * kKept; e < E; e += 32) {
      score[e] = static_cast<float>(exp(static_cast<double>(logits[e] - mx)) / sum);
    }
  } else {
    for (int e = lane; e < E; e += 32) {
      score[e] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logits[e]))));
    }
  }
  const bool use_bias = p.topk_method == MoeTopkMethod::kNoauxTc && p.bias != nullptr;
  for (int e = lane; e < E; e += 32) choice[e] = use_bias ? score[e] + p.bias[e] : score[e];
  __syncwarp();

  if (p.topk_method != MoeTopkMethod::kGreedy && p.n_group > 1) {
    const int per = E / p.n_group;
    float group_score = -INFINITY;
    if (lane < p.n_group) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        const float v = choice[e];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      group_score = p.topk_method == MoeTopkMethod::kNoauxTc ? b1 + b2 : b1;
    }
    // Keep the topk_group best groups (ties to the lower group index).
    bool keep = false;
    float v = lane < p.n_group ? group_score : -INFINITY;
    for (int r = 0; r < p.topk_group; ++r) {
      float bv = v;
      int bi = lane < p.n_group && !keep ? lane : 1 << 30;
      WarpArgMax(bv, bi);
      if (lane == bi) {
        keep = true;
        v = -INFINITY;
      }
    }
    const unsigned kept = __ballot_sync(0xffffffffu, keep);
    __syncwarp();
    for (int e = lane; e < E; e += 32) {
      if (((kept >> (e / per)) & 1u) == 0) choice[e] = 0.0f;
    }
    __syncwarp();
  }

  double weight_sum = 0;
  int32_t my_expert = 0;
  float my_weight = 0.f;
  if (E <= 64) {
    TopKByRank<2>(p.top_k, E, lane, score, choice, weight_sum, my_expert, my_weight);
  } else if (E <= 32 * kKept) {
    TopKByRank<kKept>(p.top_k, E, lane, score, choice, weight_sum, my_expert, my_weight);
  } else {
    TopKByRounds(p.top_k, E, lane, score, choice, weight_sum, my_expert, my_weight);
  }
  if (lane < p.top_k) {
    float w = my_weight;
    if (p.normalize) w = static_cast<float>(w / (weight_sum + 1e-20));
    w *= p.routed_scaling_factor;
    p.experts[token * p.top_k + lane] = my_expert;
    p.weights[token * p.top_k + lane] = w;
  }
  return my_expert;
}

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
    const int expert = RouteToken(p, token, lane, score, score + p.num_experts);
    if (!kAlignBlock && p.align.expert_count != nullptr) {
      AlignOneToken(p.align, p.num_experts, p.top_k, expert, lane);
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
