// Paged latent KV pool (ARCHITECTURE.md §3, §6): a page holds one block of B tokens for every
// layer, laid out exactly like a block payload — layer-major, per layer latent [B][kv_lora_rank]
// then k_pe [B][rope_dim] — so a cache block maps one-to-one onto a page.
//
// KvPool is what the worker sees: page allocation (shared by every backend) and page <-> block
// payload movement (ExportPage/ImportPage, one implementation per backend). HostKvPool holds the
// pages in host memory as fp32 (the CPU backend); the CUDA backend's DeviceKvPool
// (compute_nodes/backend/cuda/device_kv_pool.h) holds them in GPU memory as bf16.
//
// HostKvPool: with KvPrecision::kBf16 every value written through StoreRow is first rounded to
// bf16, as a bf16 KV cache would hold it, so a bf16 block payload (block format codec 1) exports
// and imports losslessly: a prefix restored from the cache is bit-identical to one computed in
// place. kF32 keeps full precision (numerics tests); then bf16 export is lossy. Export/Import
// convert to and from a payload in either dtype. Allocate/Free are thread-safe; a page's contents
// belong to the one sequence holding it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/host_buffer.h"

namespace strata::runtime {

struct KvLayout {
  int64_t num_layers = 0;
  int64_t block_tokens = 64;
  int64_t latent_dim = 512;
  int64_t rope_dim = 64;
  int64_t floats_per_layer() const { return block_tokens * (latent_dim + rope_dim); }
  int64_t floats_per_page() const { return num_layers * floats_per_layer(); }
};

// The codec of a block payload moved in or out of pages (common/block_format.h): bf16, fp32 (the
// CPU backend's native values), or block-scaled fp8 e4m3 (per layer: latent codes [B][R], one fp32
// scale per 128 latent values of a token [B][R/128], k_pe bf16 [B][P]; needs R % 128 == 0). An fp8
// export quantizes as strata::QuantizeFp8E4M3 does; an import dequantizes (rounded to bf16 where
// the pages hold bf16).
enum class PayloadDtype { kBf16, kF32, kFp8E4M3 };

// What the values held in the pages are rounded to when written.
enum class KvPrecision { kF32, kBf16 };

class KvPool {
 public:
  KvPool(KvLayout layout, int64_t num_pages);
  virtual ~KvPool() = default;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const;

  // ResourceExhausted when no page is free.
  absl::StatusOr<int32_t> Allocate();
  void Free(int32_t page);

  size_t PayloadBytes(PayloadDtype dtype) const;
  // Page → block payload and back. InvalidArgument on a bad page id or a wrong payload size
  // (`out` and `payload` must be PayloadBytes(dtype) long); a device pool also returns the CUDA
  // error of the copy.
  virtual absl::Status ExportPageInto(int32_t page, PayloadDtype dtype,
                                      std::span<uint8_t> out) const = 0;
  absl::Status ExportPage(int32_t page, PayloadDtype dtype, std::vector<uint8_t>* payload) const;
  virtual absl::Status ImportPage(int32_t page, PayloadDtype dtype,
                                  std::span<const uint8_t> payload) = 0;
  // Many pages at once (a cached prefix loaded, a sequence's blocks saved): payloads[i] <->
  // pages[i]. Every page and payload size is checked before anything moves. On an error after
  // that, the pages before `*done` (Import) or the payloads before it (Export) are complete and
  // the rest may or may not be. The base versions call the per-page ones, on up to 8 threads
  // when the pages are distinct and the payloads add up to megabytes (so ImportPage and
  // ExportPageInto must be safe to call concurrently for distinct pages); a device pool overlaps
  // the host copies with the transfers, and skips them for payloads in its own host buffers
  // (below).
  virtual absl::Status ImportPages(std::span<const int32_t> pages, PayloadDtype dtype,
                                   std::span<const std::span<const uint8_t>> payloads,
                                   int64_t* done);
  // Into caller memory: outs[i] must be PayloadBytes(dtype) bytes.
  virtual absl::Status ExportPagesInto(std::span<const int32_t> pages, PayloadDtype dtype,
                                       std::span<const std::span<uint8_t>> outs,
                                       int64_t* done) const;
  // Into vectors, resized to PayloadBytes(dtype).
  absl::Status ExportPages(std::span<const int32_t> pages, PayloadDtype dtype,
                           std::vector<std::vector<uint8_t>>* payloads, int64_t* done) const;

  // Host memory the batched moves read and write without a staging copy: pinned and mapped for
  // the GPU in a device pool (bf16 and fp8 payloads in it cross PCIe as they are, by the copy
  // engine, ~50 GB/s on an H200 host, against ~15 GB/s through staging from ordinary memory),
  // heap memory in the host pool.
  // Allocating pinned memory is slow (milliseconds per hundred MB): keep and reuse buffers.
  // ResourceExhausted when the memory cannot be had.
  virtual absl::StatusOr<std::shared_ptr<HostBuffer>> AllocateHostBuffer(size_t bytes) const;

  // Whether imports should read payloads that lie in `region` (host memory another process
  // shares, e.g. a cache server's shm arena) straight from there rather than from a copy: the
  // host pool reads any host memory at memcpy speed, so yes. The device pool says yes once it has
  // registered the region with CUDA (pinned, so it can be moved without a copy into its own
  // buffer; DeviceKvPoolOptions::register_shared_regions). `owner` keeps the region mapped, for a
  // pool that holds on to it.
  virtual bool ReadsInPlace(std::span<const uint8_t> /*region*/,
                            const std::shared_ptr<const void>& /*owner*/) {
    return false;
  }

 protected:
  absl::Status CheckPage(int32_t page) const;
  absl::Status CheckPayload(PayloadDtype dtype, size_t bytes) const;
  // The checks of a batched move, before anything moves: as many payloads as pages, every page
  // id valid, every payload PayloadBytes(dtype) long. `what` names the call in the error.
  template <typename Byte>
  absl::Status CheckMoves(const char* what, std::span<const int32_t> pages, PayloadDtype dtype,
                          std::span<const std::span<Byte>> payloads) const {
    if (pages.size() != payloads.size()) {
      return absl::InvalidArgumentError(std::string(what) + ": pages and payloads differ in count");
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      if (auto st = CheckPage(pages[i]); !st.ok()) return st;
      if (auto st = CheckPayload(dtype, payloads[i].size()); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  KvLayout layout_;
  int64_t num_pages_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> in_use_ ABSL_GUARDED_BY(mu_);
};

// Pages in host memory, fp32 (the CPU backend).
class HostKvPool final : public KvPool {
 public:
  HostKvPool(KvLayout layout, int64_t num_pages, KvPrecision precision = KvPrecision::kF32);

  KvPrecision precision() const { return precision_; }

  // [block_tokens][latent_dim] and [block_tokens][rope_dim] of `layer` in `page`.
  float* Latent(int32_t page, int64_t layer);
  float* KPe(int32_t page, int64_t layer);
  const float* Latent(int32_t page, int64_t layer) const;
  const float* KPe(int32_t page, int64_t layer) const;
  // Writes one token's latent [latent_dim] and k_pe [rope_dim] into row `slot` of `page`'s
  // `layer`, rounded to the pool's precision.
  void StoreRow(int32_t page, int64_t layer, int64_t slot, const float* latent, const float* k_pe);

  absl::Status ExportPageInto(int32_t page, PayloadDtype dtype,
                              std::span<uint8_t> out) const override;
  absl::Status ImportPage(int32_t page, PayloadDtype dtype,
                          std::span<const uint8_t> payload) override;
  bool ReadsInPlace(std::span<const uint8_t> /*region*/,
                    const std::shared_ptr<const void>& /*owner*/) override {
    return true;
  }

 private:
  KvPrecision precision_;
  std::vector<float> storage_;
};

// A sequence's pages in token order: token t lives in page pages[t / B], row t % B.
struct PageTable {
  std::vector<int32_t> pages;
};

// Allocates pages until `table` covers `tokens` tokens. On failure nothing new is kept.
absl::Status EnsureCapacity(KvPool& pool, PageTable& table, int64_t tokens);
void ReleasePages(KvPool& pool, PageTable& table);

}  // namespace strata::runtime
