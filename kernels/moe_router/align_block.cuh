// The alignment of a routing into per-expert slot groups (MoeAlignment, moe_router.h), computed by
// one block: LaunchMoeAlign's kernel (kernels/moe_experts/moe_align.cu) and, for a few tokens, the
// router's own block after its warps have chosen (no alignment launch between them).
#pragma once

#include <cstdint>

#include "kernels/moe_router/moe_router.h"

namespace strata::kernels::moe_align {

// The calling block (every thread, blockDim.x a multiple of 32 and at least 32) aligns the
// num_tokens * top_k choices at `experts` (written before the call by this block or complete
// before the kernel) for up to kMaxExperts experts: expert_count, expert_offset, active
// (ascending, -1 after *num_active), num_active, slot_token and token_slot as moe_experts.h
// describes; a choice outside [0, num_experts) gets token_slot -1 and sets *error.
template <int kMaxExperts>
__device__ void AlignChoices(const int32_t* experts, int num_tokens, int top_k, int num_experts,
                             const MoeAlignment& out) {
  __shared__ int count[kMaxExperts];
  __shared__ int offset[kMaxExperts + 1];
  __shared__ int fill[kMaxExperts];
  __shared__ int active_at[kMaxExperts];  // position in the active list, or -1
  __shared__ int bad;
  const int tid = threadIdx.x, threads = blockDim.x;
  const int total = num_tokens * top_k;
  for (int e = tid; e < num_experts; e += threads) {
    count[e] = 0;
    fill[e] = 0;
  }
  if (tid == 0) bad = 0;
  __syncthreads();
  for (int i = tid; i < total; i += threads) {
    const int e = experts[i];
    if (e >= 0 && e < num_experts) {
      atomicAdd(&count[e], 1);
    } else {
      bad = 1;
    }
  }
  __syncthreads();
  // Exclusive scans of the counts and of the active flags by warp 0 (each lane owns a contiguous
  // run of experts).
  if (tid < 32) {
    const int per_lane = (num_experts + 31) / 32;
    const int lo = min(num_experts, tid * per_lane), hi = min(num_experts, lo + per_lane);
    int sum = 0, act = 0;
    for (int e = lo; e < hi; ++e) {
      sum += count[e];
      act += count[e] > 0 ? 1 : 0;
    }
    int sum_incl = sum, act_incl = act;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int s = __shfl_up_sync(0xffffffffu, sum_incl, d);
      const int a = __shfl_up_sync(0xffffffffu, act_incl, d);
      if (tid >= d) {
        sum_incl += s;
        act_incl += a;
      }
    }
    int run = sum_incl - sum, run_act = act_incl - act;
    for (int e = lo; e < hi; ++e) {
      offset[e] = run;
      run += count[e];
      active_at[e] = count[e] > 0 ? run_act++ : -1;
    }
    if (tid == 31) {
      offset[num_experts] = sum_incl;
      *out.num_active = act_incl;
    }
  }
  __syncthreads();
  for (int e = tid; e < num_experts; e += threads) {
    out.expert_count[e] = count[e];
    out.expert_offset[e] = offset[e];
    out.active[e] = -1;
  }
  if (tid == 0) out.expert_offset[num_experts] = offset[num_experts];
  __syncthreads();  // the -1 fill above happens before the active entries below (same memory)
  for (int e = tid; e < num_experts; e += threads) {
    if (active_at[e] >= 0) out.active[active_at[e]] = e;
  }
  for (int i = tid; i < total; i += threads) {
    const int e = experts[i];
    if (e >= 0 && e < num_experts) {
      const int slot = offset[e] + atomicAdd(&fill[e], 1);
      out.slot_token[slot] = i / top_k;
      out.token_slot[i] = slot;
    } else {
      out.token_slot[i] = -1;
    }
  }
  if (tid == 0 && bad) *out.error = 1;
}

}  // namespace strata::kernels::moe_align
