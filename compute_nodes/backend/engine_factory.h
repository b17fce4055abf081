// Opens a model on a named backend ("cpu", or "cuda" in CUDA builds): what `strata generate`,
// `strata model logits` and `strata worker` call with their --backend flag.
//
// Errors: InvalidArgument for an unknown backend name; Unimplemented for "cuda" in a binary built
// without CUDA; Unavailable when no GPU is present; the loader's status otherwise.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/block_key.h"
#include "compute_nodes/runtime/engine.h"

namespace strata::backend {

struct EngineOptions {
  std::string backend = "cpu";
  std::string model_dir;
  int64_t num_pages = 256;
  int64_t block_tokens = 64;
  // CPU: what the pool rounds KV values to (the CUDA pool always holds bf16).
  runtime::KvPrecision kv_precision = runtime::KvPrecision::kF32;
  int device = 0;                 // CUDA device index
  bool want_fingerprint = false;  // the CPU loader always computes it
  // cuda: import cached blocks from a same-host cache server's shm arena in place
  // (CudaEngineOptions::read_cache_in_place).
  bool read_cache_in_place = true;
};

struct OpenedEngine {
  std::unique_ptr<runtime::Engine> engine;
  ModelFingerprint fingerprint;  // zero unless computed
};

absl::StatusOr<OpenedEngine> OpenEngine(const EngineOptions& options);

// The backends compiled into this binary ("cpu", and "cuda" in CUDA builds).
std::vector<std::string> CompiledBackends();

}  // namespace strata::backend
