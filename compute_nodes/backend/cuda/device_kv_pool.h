// The CUDA backend's paged latent KV pool: pages in GPU memory as bf16, one pool per layer in the
// layout the MLA decode kernel reads ([layer][page][token][latent_dim + rope_dim]: token rows of
// 576 values, latent then k_pe). Page allocation is the base KvPool's.
//
// ExportPage/ImportPage move one page to/from a block payload (block format v1, layer-major
// latent [B][R] then k_pe [B][P] per layer) through the kv_pages gather/scatter kernels, which
// read/write a pinned, device-mapped staging buffer directly (zero-copy over PCIe); bf16 payloads
// move bits unchanged, fp32 payloads are widened/rounded on the host. Both are synchronous (the
// page or payload is complete on return) and serialized by a mutex; they run on the pool's own
// stream, so the caller must not run a Forward that writes the same page concurrently (the engine
// is single-threaded anyway).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include <mutex>
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

  // Fills every page with random bf16 N(0, 1) (benchmarks that start from a full context).
  absl::Status FillRandom(uint64_t seed);

 private:
  DeviceKvPool(runtime::KvLayout layout, int64_t num_pages) : KvPool(layout, num_pages) {}
  // Runs the gather (to_payload) or scatter between `page` and the staging buffer.
  absl::Status Move(int32_t page, bool to_payload) const;

  __nv_bfloat16* pool_ = nullptr;
  int64_t layer_stride_ = 0;  // elements
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  uint8_t* staging_ = nullptr;    // pinned, mapped: one bf16 payload
  int32_t* host_page_ = nullptr;  // pinned: [1] page, then the payload pointer
  int32_t* dev_page_ = nullptr;   // device: [1] page
  uint8_t** dev_payloads_ = nullptr;
};

}  // namespace strata::cuda
