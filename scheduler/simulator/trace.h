// Mooncake-format request traces (FAST'25 release): one JSON object per line,
//   {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}
// where hash_ids[i] names the i-th 512-token block of the prompt and everything before it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/block_key.h"

namespace strata::scheduler::sim {

inline constexpr uint32_t kMooncakeBlockTokens = 512;

struct TraceRequest {
  double arrival_s = 0;
  uint32_t input_tokens = 0;
  uint32_t output_tokens = 0;
  std::vector<uint64_t> hash_ids;
};

// NotFound when the file is missing; InvalidArgument (with the line number) on a malformed line.
// Requests are returned sorted by arrival.
absl::StatusOr<std::vector<TraceRequest>> LoadMooncakeTrace(const std::string& path);

// The index key standing for a trace hash id (the simulator's stand-in for a real block key).
BlockKey TraceBlockKey(uint64_t hash_id);

// Keys of the full blocks of `request` (a trailing partial block is not cacheable).
std::vector<BlockKey> FullBlockKeys(const TraceRequest& request, uint32_t block_tokens);

// Token hit ratio with one unlimited cache shared by everything: the upper bound any placement
// can reach on this trace.
double UnlimitedCacheHitRatio(const std::vector<TraceRequest>& trace, uint32_t block_tokens);

}  // namespace strata::scheduler::sim
