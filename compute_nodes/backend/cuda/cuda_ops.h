// Small data-movement kernels of the CUDA backend (the math kernels live in kernels/): embedding
// rows, KV rows into pages, row gathers/scatters, head-strided copies with zero padding, batched
// transposes, and random bf16 fills for benchmark weights. All bf16, all enqueued on the given
// stream; each returns the launch error. Stateless and thread-compatible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::cuda {

// dst[i][0:width] = src[idx[i]][0:width] for i < rows (row strides in elements). idx on device.
absl::Status GatherRows(const __nv_bfloat16* src, int64_t src_ld, const int64_t* idx, int64_t rows,
                        int64_t width, __nv_bfloat16* dst, int64_t dst_ld, cudaStream_t stream);
// Same with int32 indices (token ids into the embedding table).
absl::Status GatherRows32(const __nv_bfloat16* src, int64_t src_ld, const int32_t* idx,
                          int64_t rows, int64_t width, __nv_bfloat16* dst, int64_t dst_ld,
                          cudaStream_t stream);
// dst[idx[i]][0:width] = src[i][0:width].
absl::Status ScatterRows(const __nv_bfloat16* src, int64_t src_ld, const int64_t* idx, int64_t rows,
                         int64_t width, __nv_bfloat16* dst, int64_t dst_ld, cudaStream_t stream);

// For rows r < rows, heads h < heads, lanes j < dst_width:
//   dst[r * dst_tok + h * dst_head + j] = j < width ? src[r * src_tok + h * src_head + j] : 0
// (src_head may be 0: one vector broadcast to every head).
struct CopyHeadsParams {
  int64_t rows = 0, heads = 0, width = 0, dst_width = 0;
  const __nv_bfloat16* src = nullptr;
  int64_t src_tok = 0, src_head = 0;
  __nv_bfloat16* dst = nullptr;
  int64_t dst_tok = 0, dst_head = 0;
};
absl::Status CopyHeads(const CopyHeadsParams& p, cudaStream_t stream);

// dst[b][j][i] = src[b * src_batch_stride + i * cols + j] for b < batch, i < rows, j < cols (a
// batch of row-major [rows][cols] matrices transposed into dense [cols][rows] ones).
absl::Status TransposeBatched(const __nv_bfloat16* src, int64_t src_batch_stride, int64_t batch,
                              int64_t rows, int64_t cols, __nv_bfloat16* dst, cudaStream_t stream);

// Random bf16 of `n` elements: normal(0, stddev) (kind 0), 1 + 0.2 (U - 0.5) (kind 1, norms) or
// 0.15 U (kind 2, correction bias), from a counter-based hash of (seed, index). Benchmarks only:
// not the bytes `strata model make-random` writes.
absl::Status FillRandomBf16(__nv_bfloat16* dst, int64_t n, int kind, float stddev, uint64_t seed,
                            cudaStream_t stream);

}  // namespace strata::cuda
