// Single-sequence generation over any Engine: chunked prefill of the prompt (optionally over a
// prefix already in the pages), then decode steps until a stop condition. Pages are allocated
// from the engine's pool and released at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "compute_nodes/runtime/engine.h"
#include "compute_nodes/runtime/sampler.h"

namespace strata::runtime {

struct GenerateResult {
  std::vector<int32_t> tokens;
  StopReason stop = StopReason::kNone;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// `on_token` (optional) sees each new id as it is produced.
absl::StatusOr<GenerateResult> Generate(Engine& engine, std::span<const int32_t> prompt,
                                        const SamplingParams& params, int64_t prefill_chunk = 256,
                                        const std::function<void(int32_t)>& on_token = {});

}  // namespace strata::runtime
