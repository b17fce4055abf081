// `strata bench kernels --only sample`: the GPU token pickers (kernels/sampling) by batch, vocab,
// logit spread and draw settings.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace strata::cli::bench_kernels {

// Times LaunchGreedySample and LaunchSample (temperature / top-k / top-p) over random fp32 logits
// (rows 1, 16, 64; vocab 102,400 and 129,280; a flat and a peaked spread), each point's variants
// in turns; device ms (median of `iters`) and the launcher's host time per call. Figures go to
// report["sample"].
absl::Status BenchSampling(int iters, nlohmann::json& report);

}  // namespace strata::cli::bench_kernels
