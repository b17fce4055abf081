// The tail of absorbed MLA decode for a few rows, in one kernel: the split-KV merge of
// LaunchMlaDecode's partials and the per-head value up-projection that follows it,
//   o_lat[b][h] = bf16( sum_s e^(lse_s - lse) O_s[b][h] )        (the combine kernel's row)
//   out[b][h][j] = bf16( W_UV[h][j] · o_lat[b][h] )               j < v_dim
// (fp32 accumulation; the roundings of the combine kernel followed by a bf16 GEMM). With one
// split the split kernel's bf16 rows are projected as they are.
//
// Why: in a decode step of a few rows the combine kernel and the projection GEMM are two more
// launches on the critical path, each mostly fixed cost. Here each block loads its share of W_UV
// (weights: ready before the step) before the programmatic-launch wait, while the split kernel
// (a few dozen blocks at batch 1) still runs, and merges and projects after it.
//
// Usage: LaunchMlaDecode with skip_combine (partials left in the workspace), then
//   MlaCombineProjectParams p = {...};  RETURN_IF_ERROR(LaunchMlaCombineProject(p, stream));
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

inline constexpr int kMlaCombineProjectRows = 32;  // output features per block

struct MlaCombineProjectParams {
  int batch = 0;
  int num_heads = 0;    // heads projected (h < num_heads)
  int num_heads_q = 0;  // the MLA call's h_q (row stride of its outputs), >= num_heads
  int num_splits = 1;   // the MLA call's
  int v_dim = 0;        // W_UV rows per head, a multiple of kMlaCombineProjectRows
  // num_splits > 1: the MLA call's partials (MlaDecodeSetWorkspace).
  const float* o_accum = nullptr;    // [batch][num_splits][num_heads_q][512]
  const float* lse_accum = nullptr;  // [batch][num_splits][num_heads_q]
  // num_splits == 1: the MLA call's output rows.
  const __nv_bfloat16* o_lat = nullptr;  // [batch][num_heads_q][512]
  // W_UV of head h: rows [v_dim][512] at w_uv + h * w_head_stride (row stride 512).
  const __nv_bfloat16* w_uv = nullptr;
  int64_t w_head_stride = 0;
  // out[b][h][j] at out + b * ld_out + h * v_dim + j.
  __nv_bfloat16* out = nullptr;
  int64_t ld_out = 0;
};

absl::Status ValidateMlaCombineProjectParams(const MlaCombineProjectParams& params);
absl::Status LaunchMlaCombineProject(const MlaCombineProjectParams& params, cudaStream_t stream);

}  // namespace strata::kernels
