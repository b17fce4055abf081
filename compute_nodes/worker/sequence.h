// One request inside the worker loop (internal to worker_core.cc).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/time/time.h"
#include "compute_nodes/runtime/kv_pool.h"
#include "compute_nodes/runtime/sampler.h"
#include "compute_nodes/worker/request.h"
#include "compute_nodes/worker/worker_core.h"

namespace strata::worker {

struct WorkerCore::Sequence {
  enum class State { kWaiting, kLoading, kRunning, kSwapped, kDone };

  Sequence(RequestSpec s, RequestEvents e, uint64_t n)
      : spec(std::move(s)), events(std::move(e)), serial(n), sampler(spec.sampling) {}

  RequestSpec spec;
  RequestEvents events;
  uint64_t serial;  // admission order: older sequences win pages, newer ones are swapped first
  runtime::Sampler sampler;

  // Loop thread (and the loader while kLoading).
  State state = State::kWaiting;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t prompt_len = 0;
  int64_t kv_len = 0;  // positions whose KV is in `pages`
  runtime::PageTable pages;
  std::vector<BlockKey> keys;    // of the leading full blocks of `tokens`, as far as computed
  int64_t saved_blocks = 0;      // leading blocks known to be in the cache or being saved
  int64_t fetch_blocks = 0;      // the loader fetches blocks [resident_blocks, fetch_blocks)
  int64_t resident_blocks = 0;   // leading blocks whose pages came from ResidentBlocks
  int64_t published_blocks = 0;  // leading full blocks offered to ResidentBlocks::Publish
  int64_t emitted = 0;           // generated tokens handed to on_tokens
  bool first_load = true;        // only the first load counts as cached prompt tokens
  bool cancelled = false;        // guarded by WorkerCore::mu_
  CachedTokenCounts cached;
  int64_t computed_tokens = 0;
  absl::Time submitted = absl::Now();
  absl::Time admitted = absl::InfinitePast();
  absl::Time first_token_at = absl::InfinitePast();
  absl::Time last_token_at = absl::InfinitePast();
  double tbt_sum_ms = 0;
  int64_t tbt_count = 0;

  // The completion, guarded by done_mu: saves complete on the cache client's thread.
  std::mutex done_mu;
  int64_t pending_saves = 0;
  bool finished = false;
  bool done_sent = false;
  std::vector<char> block_in_cache;  // by block index: fetched, or committed by a save
  RequestOutcome outcome;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // KV needed before the next decode step: the prompt, or, once a token exists, everything but
  // the newest token (which the next step feeds).
  int64_t prefill_target() const {
    return generated() == 0 ? prompt_len : static_cast<int64_t>(tokens.size()) - 1;
  }
  bool decoding() const { return generated() > 0 && kv_len >= prefill_target(); }
  // The name for the engine (runtime::SequenceInput::sequence_id): serials are never reused, and
  // 0 means "none" to the engine.
  uint64_t engine_id() const { return serial + 1; }
};

}  // namespace strata::worker
