// CUDA graphs of whole decode steps, keyed by the step's shape. A step whose batch is all decode
// rows enqueues the same kernels with the same arguments whenever its shape is the same: the rows,
// the padded block-table width, the MLA decode split count, the output rows, and the device
// addresses (which change only when a buffer grows: `grows`). Per-step data (token ids, positions,
// KV rows, block tables, lengths) goes through fixed device buffers that the caller updates on the
// stream before Run. The first step of a shape is captured and instantiated, every later one
// replays it.
//
// Not thread-safe; owned by one engine, used on its one stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "absl/status/status.h"

namespace strata::cuda {

struct DecodeGraphKey {
  int64_t tokens = 0, table_pages = 0, num_splits = 0, outputs = 0, grows = 0;
  auto Tie() const { return std::tie(tokens, table_pages, num_splits, outputs, grows); }
  bool operator<(const DecodeGraphKey& o) const { return Tie() < o.Tie(); }
};

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  ~DecodeGraphs() { Clear(); }

  // Launches the graph of `key` on `stream`; without one, captures `enqueue` (which must only
  // enqueue work on `stream`, allocate nothing and synchronize nothing) into a new graph first.
  // On an error nothing of the failed capture is kept.
  absl::Status Run(const DecodeGraphKey& key, cudaStream_t stream,
                   const std::function<absl::Status()>& enqueue);
  void Clear();
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  static constexpr size_t kMaxGraphs = 16;
  std::map<DecodeGraphKey, cudaGraphExec_t> graphs_;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace strata::cuda
