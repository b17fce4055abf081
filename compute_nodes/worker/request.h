// What a worker is asked to do and what it reports back, independent of gRPC (the service in
// worker_service.h translates to and from proto/strata/v1/worker.proto).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/block_key.h"
#include "compute_nodes/runtime/sampler.h"

namespace strata::worker {

enum class RequestKind {
  kPrefill,   // compute the prompt, publish its blocks, return the first token
  kDecode,    // load the handed-over prompt (blocks + recomputed tail), stream from first_token
  kGenerate,  // both, on this worker
};

enum class Finish { kNone, kStop, kLength, kCancelled, kError };

struct RequestSpec {
  std::string id;
  RequestKind kind = RequestKind::kGenerate;
  std::vector<int32_t> prompt;
  int32_t first_token = -1;  // kDecode: the token the prefill worker sampled
  runtime::SamplingParams sampling;
  Namespace ns;        // of the blocks (model, KV format, tenant salt)
  std::string tenant;  // for cache quotas
  bool save_blocks = true;
  // The cache server to fetch the prompt's blocks from; empty: this worker's own.
  std::string cache_address;
  int32_t priority = 0;  // higher runs first; lower is swapped out first
  absl::Time deadline = absl::InfiniteFuture();
};

// Prompt tokens whose KV came from the cache instead of being computed, by where they were.
struct CachedTokenCounts {
  int64_t total = 0;
  int64_t gpu = 0;
  int64_t dram = 0;
  int64_t ssd = 0;
  int64_t remote = 0;  // from a cache server other than this worker's
};

struct RequestOutcome {
  absl::Status status;  // OK unless finish == kError (or kCancelled: Cancelled)
  Finish finish = Finish::kNone;
  int32_t first_token = -1;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t computed_tokens = 0;  // prompt tokens this worker computed
  CachedTokenCounts cached;
  // kPrefill: keys of the prompt's full blocks that are in the cache now (the hand-off).
  std::vector<BlockKey> block_keys;
  int64_t tail_tokens = 0;  // prompt tokens after the last full block
  double queue_ms = 0;      // submit → first compute
  double prefill_ms = 0;    // first compute → first token
  double ttft_ms = 0;       // submit → first token
  double mean_tbt_ms = 0;   // between later tokens
};

// Callbacks of one request. Both run on worker threads and must not block for long.
struct RequestEvents {
  // New tokens, in order (kGenerate and kDecode; kDecode starts with first_token).
  std::function<void(std::span<const int32_t>)> on_tokens;
  // Exactly once, last.
  std::function<void(const RequestOutcome&)> on_done;
};

}  // namespace strata::worker
