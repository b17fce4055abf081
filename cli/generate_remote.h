// `strata generate --worker ADDR` and `--prefill ADDR --decode ADDR`: the same generation, run by
// worker daemons over the Worker gRPC API instead of in this process (one combined worker, or a
// prefill worker handing over through the cache to a decode worker). Prints the streamed text, then
// the usage: prompt tokens, how many came from the cache (by tier), TTFT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compute_nodes/runtime/sampler.h"

namespace strata::cli {

struct RemoteGenerate {
  std::string worker;   // Generate on this worker, or
  std::string prefill;  // Prefill here, then
  std::string decode;   // Decode there
  std::vector<int32_t> prompt;
  runtime::SamplingParams sampling;
  std::string cache_salt;
};

// Exits through Fail() on an error.
void RunRemoteGenerate(const RemoteGenerate& r);

}  // namespace strata::cli
