// `strata bench kernels --only barrier`: what a grid-wide barrier inside a persistent kernel costs
// against the kernel boundary it would replace (kernels/common/grid_barrier.h).
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace strata::cli::bench_kernels {

// Times the rounds kernel at 1, 2 and the most CTAs per SM: µs per round with the hand-rolled
// barrier (ordinary and cooperative launch), with cooperative groups' grid.sync(), with the
// hand-rolled barrier in launches captured into a graph (programmatic and cooperative), and µs
// per launch of one-round launches in a graph, with and without programmatic launch. Every
// variant's rounds are checked; a failed check is an error. Figures go to report["barrier"].
absl::Status BenchGridBarrier(int iters, nlohmann::json& report);

}  // namespace strata::cli::bench_kernels
