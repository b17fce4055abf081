// The router's per-token routine for one warp, shared by the router kernel (moe_router.cu) and
// the expert kernels that route a one-token step themselves (kernels/moe_experts,
// MoeExpertsParams::route), so both choose bit-identically.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/moe_router/moe_router.h"

namespace strata::kernels::moe_route {

struct RoutedChoice {
  int32_t expert;  // lanes < top_k: choice `lane`'s expert
  float weight;    // its weight, normalized and scaled
};

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

// The alignment of the one token routed by this warp; lane k < top_k holds choice k. Every
// global write has one owner (no ordering between lanes needed).
__device__ inline void AlignOneToken(const MoeAlignment& a, int num_experts, int top_k, int expert,
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

// Routes `token` by one warp (score and choice: num_experts floats of shared memory each,
// private to the warp); lane k < top_k gets choice k: its expert (out of range when no candidate
// was left: NaN scores) and its final weight. Writes nothing to global memory.
__device__ inline RoutedChoice RouteToken(const MoeRouterParams& p, int64_t token, int lane,
                                          float* score, float* choice) {
  const float* logits = p.logits + token * p.ld_logits;
  const int E = p.num_experts;

  if (p.scoring == MoeScoring::kSoftmax) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, logits[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int e = lane; e < E; e += 32) sum += exp(static_cast<double>(logits[e] - mx));
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int e = lane; e < E; e += 32) {
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

  // top_k rounds of arg-max over choice; the winner is removed from its lane's candidates.
  double weight_sum = 0;
  int32_t my_expert = 0;
  float my_weight = 0.f;
  uint32_t taken = 0;  // bit s: this lane's expert lane + 32 s is already chosen
  for (int k = 0; k < p.top_k; ++k) {
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
    // No candidate compares when the choices are NaN: bi stays out of range, the alignment
    // flags it.
    const bool found = bi < E;
    if (found && bi % 32 == lane) taken |= 1u << (bi / 32);
    const float w = found ? score[bi] : 0.f;
    weight_sum += w;
    if (lane == k) {
      my_expert = bi;
      my_weight = w;
    }
  }
  float w = my_weight;
  if (p.normalize) w = static_cast<float>(w / (weight_sum + 1e-20));
  return {my_expert, w * p.routed_scaling_factor};
}

}  // namespace strata::kernels::moe_route
