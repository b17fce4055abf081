// Pieces the WorkerCore source files share (internal to compute_nodes/worker).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/time/time.h"
#include "common/block_format.h"
#include "common/metrics.h"
#include "compute_nodes/runtime/kv_pool.h"

namespace strata::worker::internal {

struct CoreMetrics {
  Counter& computed;
  Counter& cached;    // fetched from a cache server
  Counter& resident;  // found in the KV pool itself (ResidentBlocks)
  Counter& generated;
  MetricFamily<Counter>& swaps;
  MetricFamily<Counter>& requests;
  Histogram& step;
  Gauge& queued;      // waiting + swapped-out requests
  Gauge& running;     // requests holding pages (loading, prefilling, decoding)
  Gauge& free_pages;  // free KV pages, idle resident ones included
  Gauge& resident_blocks;
};
CoreMetrics& Metrics();

inline double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

inline std::vector<uint32_t> AsU32(std::span<const int32_t> ids) {
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

// The block layout of a pool's pages in `codec`.
inline BlockLayout BlockLayoutOf(const runtime::KvLayout& kv, KvCodec codec) {
  return BlockLayout{.codec = codec,
                     .n_layers = static_cast<uint32_t>(kv.num_layers),
                     .block_tokens = static_cast<uint32_t>(kv.block_tokens),
                     .kv_lora_rank = static_cast<uint32_t>(kv.latent_dim),
                     .rope_dim = static_cast<uint32_t>(kv.rope_dim)};
}

// The pool's payload dtype for blocks in `codec`.
inline runtime::PayloadDtype PayloadDtypeOf(KvCodec codec) {
  return codec == KvCodec::kFp8E4M3 ? runtime::PayloadDtype::kFp8E4M3
                                    : runtime::PayloadDtype::kBf16;
}

}  // namespace strata::worker::internal
