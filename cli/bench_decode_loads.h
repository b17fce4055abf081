// strata bench decode --concurrent-loads: decode steps timed alone and beside a KV load into
// another device pool, zero copy and by the copy engine (bench_decode_loads.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "compute_nodes/backend/cuda/cuda_engine.h"

namespace strata::cli {

// Greedy steps of every batch size of `engine` (each sequence `context` tokens long, pages
// allocated here) alone, beside a zero-copy loader and beside a copy-engine loader of
// `load_pages` blocks, in turns; prints a table, adds "concurrent_loads" points and
// decode_step_greedy_with_loads_*_vs_alone_b<B> ratios to `report`. Fail()s on errors.
void BenchDecodeWithLoads(cuda::CudaEngine& engine, const std::vector<int64_t>& batches,
                          int64_t context, int64_t steps, int64_t load_pages,
                          nlohmann::json& report);

}  // namespace strata::cli
