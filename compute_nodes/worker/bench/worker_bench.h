// `strata bench worker`: a worker on the CPU "cluster" in one process — a real CacheServer
// (DRAM tier, tcp data plane on loopback), a CpuEngine (bf16 KV pool) and a WorkerCore, wired
// as the worker daemon wires them (worker_server.cc) minus gRPC — measured end to end:
//
//   - TTFT of a long prompt (8K tokens) computed cold (nothing cached) and 90 % cached (a
//     previous request sharing its first 90 % of tokens was served and its blocks committed),
//     the cached prefix once still resident in the worker's KV pool (ResidentBlocks) and once
//     loaded from the cache server (the pool's idle blocks dropped first); medians over
//     `repeats`, each repeat with fresh prompts;
//   - prefill tokens/s of the cold run (prompt tokens / cold TTFT);
//   - decode tokens/s at several batch sizes: N concurrent requests with short prompts, tokens
//     delivered between the moment every request has its first token and the moment the last
//     token arrives, divided by that window (prefill excluded).
//
// The model is a preset (by default `v2-lite-shape` cut to 2 layers: the layer shapes of
// DeepSeek-V2-Lite; `tiny` for quick runs) with a longer context (max_position_embeddings raised so
// the long prompt fits) and optionally fewer layers, written once into `model_dir` (or a temp dir),
// fixed seed.
//
// Not thread-safe; runs everything it needs itself and tears it down before returning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/block_key.h"
#include "nlohmann/json.hpp"

namespace strata::worker {

struct WorkerBenchOptions {
  int64_t prompt_tokens = 8192;
  double cached_fraction = 0.9;
  int repeats = 3;
  std::vector<int> batches = {1, 8, 32};
  int64_t decode_tokens = 64;  // new tokens per decode request
  int64_t decode_prompt_tokens = 128;
  int64_t token_budget = 512;  // WorkerCoreOptions::token_budget (the daemon's default)
  int64_t block_tokens = 64;
  KvCodec cache_codec = KvCodec::kBf16;  // of the cached blocks (worker.cache_codec)
  // The bench model's shape (model::PresetNames()); by default one dense and one MoE layer of
  // DeepSeek-V2-Lite's shape, whose mix of linear and attention work at 8K is the real model's.
  std::string preset = "v2-lite-shape";
  int64_t layers = 2;     // > 0: keep only this many of the preset's layers
  std::string model_dir;  // a checkpoint to use, or where to write the bench's own; empty: temp
  std::string work_dir;   // cache server data; empty: a temp dir (removed afterwards)
};

// The JSON of docs/benchmarks.md: "ratios.ttft_cached_vs_cold_8k" (from the cache server),
// "ratios.ttft_resident_vs_{cold,cached}_8k", "ttft_ms.{cold,cached,resident}" (medians, plus the
// per-repeat samples), "resident_tokens", "prefill_tokens_per_s", "decode_tokens_per_s.{N}",
// "cached_tokens", "computed_tokens" (of the cached run), "model", "machine", "options"; and,
// to explain the ratio: "ttft_ms.fetch_cached_prefix" (fetching and verifying the cached blocks
// alone), "ttft_ms.computed_part_without_context" (a fresh prompt as long as the computed part),
// "ttft_cpu_ms" and "ratios.ttft_cpu_cached_vs_cold_8k" (process CPU time from submit to the
// first token: this process's work only, not time lost to other processes on a shared machine).
absl::StatusOr<nlohmann::json> RunWorkerBench(const WorkerBenchOptions& options);

// The small human-readable table of a result (with PASS/MISS against the TTFT ratio target).
std::string FormatWorkerBench(const nlohmann::json& result);

inline constexpr double kTtftRatioTarget = 0.15;

}  // namespace strata::worker
