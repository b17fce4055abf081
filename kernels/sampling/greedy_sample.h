// Greedy sampling: the index of the first maximum of each row of fp32 logits, as torch.argmax and
// the CPU sampler's greedy path (runtime::Sampler with temperature 0: std::max_element).
// Temperature / top-k / top-p sampling is sample.h. Up to 8 blocks (a thread block cluster, sm_90)
// share one row when the rows leave SMs idle.
//
// Thread safety: stateless. Rows holding NaN give an unspecified index in [0, vocab).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

struct GreedySampleParams {
  int rows = 0;
  int vocab = 0;
  const float* logits = nullptr;  // [rows][ld_logits]
  int64_t ld_logits = 0;
  int32_t* tokens = nullptr;  // [rows]
};

absl::Status ValidateGreedySampleParams(const GreedySampleParams& params);
absl::Status LaunchGreedySample(const GreedySampleParams& params, cudaStream_t stream);

}  // namespace strata::kernels
