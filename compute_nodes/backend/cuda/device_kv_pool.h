// The CUDA backend's paged latent KV pool: pages in GPU memory as bf16, one pool per layer in the
// layout the MLA decode kernel reads ([layer][page][token][latent_dim + rope_dim]: token rows of
// 576 values, latent then k_pe). Page allocation is the base KvPool's.
//
// ExportPage/ImportPage move one page to/from a block payload (block format v1, layer-major
// latent [B][R] then k_pe [B][P] per layer) through the kv_pages gather/scatter kernels, which
// read/write a pinned, device-mapped staging buffer directly (zero-copy over PCIe); bf16 payloads
// move bits unchanged, fp32 payloads are widened/rounded on the host. Both are synchronous (the
// page or payload is complete on return) and serialized by a mutex; they run on the pool's own
// stream, beside the engine's (the worker loads cached prefixes from its loader thread while the
// loop runs Forward), so the caller must not run a Forward that touches the same page
// concurrently. ImportPages/ExportPages move many pages in batches of kBatchPages through two
// sets of staging slots: the host copies one batch's payloads (on up to 8 threads) while the
// kernel moves the other's, one launch per batch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "compute_nodes/runtime/kv_pool.h"

namespace strata::cuda {

class DeviceKvPool final : public runtime::KvPool {
 public:
  // ResourceExhausted when the GPU has too little memory; InvalidArgument on a layout the kernels
  // cannot serve.
  static absl::StatusOr<std::unique_ptr<DeviceKvPool>> Create(runtime::KvLayout layout,
                                                              int64_t num_pages);
  ~DeviceKvPool() override;

  int64_t row_width() const { return layout().latent_dim + layout().rope_dim; }
  // [num_pages][block_tokens][row_width] of `layer`.
  __nv_bfloat16* layer_base(int64_t layer) const { return pool_ + layer * layer_stride_; }
  int64_t device_bytes() const { return layer_stride_ * layout().num_layers * 2; }

  absl::Status ExportPage(int32_t page, runtime::PayloadDtype dtype,
                          std::vector<uint8_t>* payload) const override;
  absl::Status ImportPage(int32_t page, runtime::PayloadDtype dtype,
                          std::span<const uint8_t> payload) override;
  absl::Status ImportPages(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                           std::span<const std::span<const uint8_t>> payloads,
                           int64_t* done) override;
  absl::Status ExportPages(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                           std::vector<std::vector<uint8_t>>* payloads,
                           int64_t* done) const override;

  static constexpr int kBatchPages = 8;

  // Fills every page with random bf16 N(0, 1) (benchmarks that start from a full context).
  absl::Status FillRandom(uint64_t seed);

 private:
  DeviceKvPool(runtime::KvLayout layout, int64_t num_pages) : KvPool(layout, num_pages) {}
  // Runs the gather (to_payload) or scatter between `page` and the staging buffer.
  absl::Status Move(int32_t page, bool to_payload) const;
  // The batched moves' staging (allocated on first use) and one batch of `count` pages of set
  // `set` (pages already in batch_host_pages_), enqueued with its event.
  absl::Status EnsureBatchStaging() const;
  absl::Status LaunchBatch(int set, int count, bool to_payload) const;
  uint8_t* BatchSlot(int set, int i) const;

  __nv_bfloat16* pool_ = nullptr;
  int64_t layer_stride_ = 0;  // elements
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  uint8_t* staging_ = nullptr;    // pinned, mapped: one bf16 payload
  int32_t* host_page_ = nullptr;  // pinned: [1] page, then the payload pointer
  int32_t* dev_page_ = nullptr;   // device: [1] page
  uint8_t** dev_payloads_ = nullptr;
  // Batched moves (under mu_): [2][kBatchPages] bf16 payload slots, pinned and mapped; the pages
  // of each set (pinned, and on the device); the slots' device pointers; an event per set.
  mutable uint8_t* batch_staging_ = nullptr;
  mutable int32_t* batch_host_pages_ = nullptr;
  mutable int32_t* batch_dev_pages_ = nullptr;
  mutable uint8_t** batch_dev_payloads_ = nullptr;
  mutable cudaEvent_t batch_done_[2] = {nullptr, nullptr};
};

}  // namespace strata::cuda
