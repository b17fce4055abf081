// MoE routing -> per-expert slot groups, in one CTA (decode and prefill sizes alike: the work is
// a few passes over tokens * top_k ints).
#include <string>

#include "kernels/common/pdl.cuh"
#include "kernels/moe_experts/moe_experts.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads) MoeAlignKernel(MoeAlignParams p) {
  __shared__ int count[kMoeAlignMaxExperts];
  __shared__ int offset[kMoeAlignMaxExperts + 1];
  __shared__ int fill[kMoeAlignMaxExperts];
  __shared__ int active_at[kMoeAlignMaxExperts];  // position in the active list, or -1
  __shared__ int bad;
  PdlGridSync();
  const int tid = threadIdx.x;
  const int num_e = p.num_experts;
  const int total = p.num_tokens * p.top_k;
  for (int e = tid; e < num_e; e += kThreads) {
    count[e] = 0;
    fill[e] = 0;
  }
  if (tid == 0) bad = 0;
  __syncthreads();
  for (int i = tid; i < total; i += kThreads) {
    const int e = p.experts[i];
    if (e >= 0 && e < num_e) {
      atomicAdd(&count[e], 1);
    } else {
      bad = 1;
    }
  }
  __syncthreads();
  // Exclusive scans of the counts and of the active flags by warp 0 (each lane owns a contiguous
  // run of experts).
  if (tid < 32) {
    const int per_lane = (num_e + 31) / 32;
    const int lo = min(num_e, tid * per_lane), hi = min(num_e, lo + per_lane);
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
      offset[num_e] = sum_incl;
      *p.out.num_active = act_incl;
    }
  }
  __syncthreads();
  for (int e = tid; e < num_e; e += kThreads) {
    p.out.expert_count[e] = count[e];
    p.out.expert_offset[e] = offset[e];
    p.out.active[e] = -1;
  }
  if (tid == 0) p.out.expert_offset[num_e] = offset[num_e];
  __syncthreads();  // the -1 fill above happens before the active entries below (same memory)
  for (int e = tid; e < num_e; e += kThreads) {
    if (active_at[e] >= 0) p.out.active[active_at[e]] = e;
  }
  for (int i = tid; i < total; i += kThreads) {
    const int e = p.experts[i];
    if (e >= 0 && e < num_e) {
      const int slot = offset[e] + atomicAdd(&fill[e], 1);
      p.out.slot_token[slot] = i / p.top_k;
      p.out.token_slot[i] = slot;
    } else {
      p.out.token_slot[i] = -1;
    }
  }
  if (tid == 0 && bad) *p.out.error = 1;
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
