// MoE routed experts for prefill-sized token counts on Hopper (sm_90a): the same contract as
// LaunchMoeExperts (moe_experts.h), computed as two grouped GEMMs with TMA and wgmma, the routing
// kept on the device (no host sync; the launches can be captured in a graph).
//
//   act[s][i] = bf16( SiLU(bf16(gate_e · x[t])[i]) * bf16(up_e · x[t])[i] )      i < inter
//   out[s][j] = bf16( down_e[j] · act[s] )                                         j < hidden
// for every slot s of expert e (token t = slot_token[s]), fp32 accumulation.
//
// Four launches on `stream`:
//  1. schedule: expert_offset (from LaunchMoeAlign) -> the list of row tiles, 128 slots each,
//     expert after expert (an expert with c slots has ceil(c / 128) tiles);
//  2. gather: xs[s] = x[slot_token[s]] (the tiles' A operand, contiguous per expert);
//  3. gate|up: per (row tile, 128 columns of inter) one block reads 128 gate and the 128 matching
//     up rows, so SiLU×mul is its epilogue;
//  4. down: per (row tile, 256 columns of hidden).
// A block is a TMA producer warpgroup and two consumer warpgroups of 64 rows (wgmma m64n256k16,
// both operands 128-byte swizzled in shared memory, a 4-stage ring over K). The blocks of one
// expert are adjacent in the grid, row tiles fastest, so its weights come from HBM about once.
// Grids are sized from the host's bound on the tiles; blocks past the device's count exit.
//
// Thread safety: stateless launchers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

inline constexpr int kMoeGroupedTileRows = 128;

// Upper bound on the row tiles of `slots` slots over `num_experts` experts.
inline int64_t MoeGroupedMaxTiles(int64_t slots, int64_t num_experts) {
  return (slots + kMoeGroupedTileRows - 1) / kMoeGroupedTileRows +
         (slots < num_experts ? slots : num_experts);
}
// Bytes of the schedule workspace.
inline int64_t MoeGroupedScheduleBytes(int64_t slots, int64_t num_experts) {
  return (MoeGroupedMaxTiles(slots, num_experts) + 1) * 16;
}

struct MoeGroupedParams {
  int num_tokens = 0;
  int top_k = 0;        // slots = num_tokens * top_k (an upper bound on the valid ones)
  int num_experts = 0;  // 1..kMoeAlignMaxExperts
  int hidden = 0;       // H, a multiple of 8
  int inter = 0;        // I, a multiple of 8
  const __nv_bfloat16* x = nullptr;  // [num_tokens][ld_x]
  int64_t ld_x = 0;                  // >= hidden, a multiple of 8
  // Expert e: gate [I][H], up [I][H] then down [H][I], at weights + e * expert_stride (elements, a
  // multiple of 8, >= 3 I H), 16-byte aligned.
  const __nv_bfloat16* weights = nullptr;
  int64_t expert_stride = 0;
  // From LaunchMoeAlign.
  const int32_t* expert_offset = nullptr;  // [num_experts + 1]
  const int32_t* slot_token = nullptr;     // [slots]
  // Workspaces and outputs (16-byte aligned).
  void* schedule = nullptr;      // MoeGroupedScheduleBytes(slots, num_experts)
  __nv_bfloat16* xs = nullptr;   // [slots][hidden]
  __nv_bfloat16* act = nullptr;  // [slots][inter]
  __nv_bfloat16* out = nullptr;  // [slots][hidden]
};

// Whether LaunchMoeGrouped runs on the current device (compute capability 9.x).
bool MoeGroupedApplies();
absl::Status ValidateMoeGroupedParams(const MoeGroupedParams& params);
absl::Status LaunchMoeGrouped(const MoeGroupedParams& params, cudaStream_t stream);

}  // namespace strata::kernels
