// Token sampling on the GPU: per row its own temperature, top-k, top-p and uniform draw, with the
// CPU sampler's exact rule (runtime::PickToken, the reference): the logits of a row in descending
// order (ties: the lower index first), softmax of the top_k at the temperature, the smallest
// prefix whose probability mass reaches top_p, and the first token of that prefix at which the
// running mass exceeds uniform × its mass. A greedy row (temperature <= 0 or top_k 1) takes the
// first maximum.
//
// Nothing is sorted: a cluster of up to 8 blocks per row (as many as the rows leave SMs for, each
// over its own slice) finds each threshold of that walk by radix selection over the logits'
// order-preserving keys (see sample.cu), summing probabilities in double, as the CPU does; only
// the order of the additions differs, so a pick can differ from the CPU's only when the uniform
// lands within ~1e-15 of a boundary between two tokens. No workspace, no host synchronisation
// (graph-capturable). Needs thread block clusters (sm_90).
//
// Thread safety: stateless. Rows holding NaN give an unspecified index in [0, vocab).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

// One row's draw (runtime::TokenDraw as the device reads it).
struct SampleRowDraw {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: every token
  int32_t pad = 0;
  double uniform = 0.0;  // [0, 1)
};

struct SampleParams {
  int rows = 0;
  int vocab = 0;
  const float* logits = nullptr;  // [rows][ld_logits], device
  int64_t ld_logits = 0;
  const SampleRowDraw* draws = nullptr;  // [rows], device
  int32_t* tokens = nullptr;             // [rows], device
};

absl::Status ValidateSampleParams(const SampleParams& params);
absl::Status LaunchSample(const SampleParams& params, cudaStream_t stream);

}  // namespace strata::kernels
