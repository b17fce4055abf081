// The CUDA backend's paged latent KV pool: pages in GPU memory as bf16, one pool per layer in the
// layout the MLA decode kernel reads ([layer][page][token][latent_dim + rope_dim]: token rows of
// 576 values, latent then k_pe). Page allocation is the base KvPool's.
//
// Payloads are bf16, fp8 (the kernels quantize on export and dequantize on import) or fp32
// (rounded to and widened from bf16 on the host). Every move (one page or many) goes through the
// kv_pages gather/scatter kernels, kBatchPages pages per launch, on the pool's own stream beside
// the engine's (the worker loads cached prefixes from its loader thread while the loop runs
// Forward), so the caller must not run a Forward that touches the same pages concurrently. Moves
// are synchronous (pages or payloads complete on return) and serialized by a mutex.
//
// Payloads in pinned host memory (AllocateHostBuffer, a registered shared region, or the pool's
// host staging slots) cross PCIe by the copy engine: each run of payloads that lie back to back
// is one DMA copy, as it is, into device staging slots on a copy stream of the pool's, and the
// kernels convert them there (device to pages at ~1.8 TB/s); the copies of one batch overlap the
// kernel of the one before. Costs 2 x kBatchPages device slots of one bf16 payload (72 MB for
// DeepSeek-V3's 61 layers), allocated with the host staging slots.
// Zero copy, the kernels read and write the pinned memory over PCIe themselves: with
// DeviceKvPoolOptions::copy_engine off, or when the device slots cannot be had. That holds SMs
// for the whole transfer: on the H200 host, 2026-12-02, V2-Lite's greedy decode steps ran
// 6.3-14.5x slower beside a zero-copy load of 64 blocks, 1.06-1.07x beside the same load by the
// copy engine (`strata bench decode --concurrent-loads 64`). Alone, 64 back-to-back payloads
// moved 4.5-5.9 % faster by the copy engine; payloads scattered 4 KiB apart about as fast or up
// to ~15 % slower (a copy each). docs/gpu-benchmarks.md has the runs.
// Any other payload (ordinary memory, or fp32, which is widened/rounded on the host) goes through
// one of two sets of pinned host staging slots, which the host fills or drains (on up to 8
// threads) while the other set moves.
//
// With DeviceKvPoolOptions::register_shared_regions, host memory that another process shares
// (a same-host cache server's shm arena, offered through ReadsInPlace) is registered with CUDA,
// mapped, the first time it is offered, so that the kernels read cached blocks in it in place.
// Registering pins every page of it (15-32 ms per 512 MiB on the H200 machine, so seconds for a
// production DRAM tier): by default that runs on a thread of its own, and the region is
// declined (its blocks copied) until it is done.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "compute_nodes/runtime/kv_pool.h"

namespace strata::cuda {

struct DeviceKvPoolOptions {
  // ReadsInPlace registers the regions it is offered (cudaHostRegister, mapped): pins them and
  // keeps them mapped while registered. Off: it declines, and cached blocks are copied into the
  // pool's pinned buffers instead.
  bool register_shared_regions = false;
  // Registers on a thread of its own, declining the region until that is done; else within the
  // first ReadsInPlace call that offers it.
  bool register_in_background = true;
  // The oldest is unregistered past this many. A region nothing but the pool holds any more (a
  // restarted server's old arena, once the client re-opened its data path) goes at the next offer.
  int max_registered_regions = 2;
  // Pinned payloads cross PCIe by DMA into device staging slots (see above); off: the kernels
  // read and write them over PCIe in place (zero copy), holding SMs while they do.
  bool copy_engine = true;
};

class DeviceKvPool final : public runtime::KvPool {
 public:
  // ResourceExhausted when the GPU has too little memory; InvalidArgument on a layout the kernels
  // cannot serve.
  static absl::StatusOr<std::unique_ptr<DeviceKvPool>> Create(runtime::KvLayout layout,
                                                              int64_t num_pages,
                                                              DeviceKvPoolOptions options = {});
  ~DeviceKvPool() override;

  int64_t row_width() const { return layout().latent_dim + layout().rope_dim; }
  // [num_pages][block_tokens][row_width] of `layer`.
  __nv_bfloat16* layer_base(int64_t layer) const { return pool_ + layer * layer_stride_; }
  int64_t device_bytes() const { return layer_stride_ * layout().num_layers * 2; }

  absl::Status ExportPageInto(int32_t page, runtime::PayloadDtype dtype,
                              std::span<uint8_t> out) const override;
  absl::Status ImportPage(int32_t page, runtime::PayloadDtype dtype,
                          std::span<const uint8_t> payload) override;
  absl::Status ImportPages(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                           std::span<const std::span<const uint8_t>> payloads,
                           int64_t* done) override;
  absl::Status ExportPagesInto(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                               std::span<const std::span<uint8_t>> outs,
                               int64_t* done) const override;
  // Pinned (cudaHostAlloc, mapped and portable).
  absl::StatusOr<std::shared_ptr<HostBuffer>> AllocateHostBuffer(size_t bytes) const override;
  // True when `region` is registered with CUDA, mapped (register_shared_regions). The first offer
  // starts the registration, in the background (then this offer and those until it is done are
  // declined) or within the call. A failure is logged and remembered, so the region is declined
  // at once from then on.
  bool ReadsInPlace(std::span<const uint8_t> region,
                    const std::shared_ptr<const void>& owner) override;

  static constexpr int kBatchPages = 8;

  // Fills every page with random bf16 N(0, 1) (benchmarks that start from a full context).
  absl::Status FillRandom(uint64_t seed);

 private:
  // One launch's pages and payload addresses (device-visible), per set: pinned on the host,
  // copied to the device with each launch.
  struct Batch {
    uint8_t* payloads[kBatchPages];
    int32_t pages[kBatchPages];
  };

  // A region ReadsInPlace was offered, kept mapped by `owner` while it is remembered.
  struct SharedRegion {
    const uint8_t* base = nullptr;
    size_t size = 0;
    std::shared_ptr<const void> owner;
    std::shared_future<bool> registered;  // whether cudaHostRegister took it (once it has run)
  };

  DeviceKvPool(runtime::KvLayout layout, int64_t num_pages, DeviceKvPoolOptions options)
      : KvPool(layout, num_pages), options_(options) {}
  // Waits for the region's registration and undoes it.
  static void Unregister(const SharedRegion& r);
  // The staging slots, descriptors and events (allocated on first use).
  absl::Status EnsureBatchStaging() const;
  uint8_t* StagingSlot(int set, int i, runtime::PayloadDtype dtype) const;
  // Binds slot i of `set` to `payload`: its host side (the payload in place when it is pinned,
  // bf16 or fp8, else the host staging slot), which the kernel reads over PCIe (zero copy) unless
  // PlanCopies moves it. Returns whether it goes through the host staging slot.
  bool BindPayload(int set, int i, runtime::PayloadDtype dtype, const uint8_t* payload) const;
  // With the copy engine: groups `set`'s first `count` slots into runs that lie back to back on
  // the host (copy_runs_), one copy each, and points the kernel at the device staging slots.
  // Returns how many runs (0: zero copy).
  int PlanCopies(int set, int count, runtime::PayloadDtype dtype) const;
  // Bytes of one payload as the kernels read it (fp32 is staged as bf16), and slot i of `set`'s
  // offset in the host and device staging slots (a set's slots of one call are adjacent).
  size_t KernelPayloadBytes(runtime::PayloadDtype dtype) const;
  size_t SlotOffset(int set, int i, runtime::PayloadDtype dtype) const;
  // Enqueues the move of `set`'s first `count` pages (payloads in `dtype`'s codec, fp32 staged as
  // bf16) and records batch_done_[set] after its last step.
  absl::Status LaunchBatch(int set, int count, runtime::PayloadDtype dtype, bool to_payload) const;
  // The copy engine's part of a batch on copy_stream_: `set`'s first `runs` copy runs between
  // their host side and the device staging slots, one copy each.
  absl::Status CopyPayloads(int set, int runs, runtime::PayloadDtype dtype, bool to_host) const;

  __nv_bfloat16* pool_ = nullptr;
  int64_t layer_stride_ = 0;  // elements
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  // Under mu_: [2][kBatchPages] bf16 staging slots (pinned, mapped) and their device addresses;
  // the two sets' descriptors on the host and on the device; an event per set.
  mutable uint8_t* staging_ = nullptr;
  mutable uint8_t* staging_dev_ = nullptr;
  mutable Batch* host_batch_ = nullptr;
  mutable Batch* dev_batch_ = nullptr;
  mutable cudaEvent_t batch_done_[2] = {nullptr, nullptr};
  // Copy engine moves: the copy stream, [2][kBatchPages] device staging slots (null: zero copy
  // only), each slot's host side (a pinned payload in place, or its host staging slot), each
  // set's copy runs [first, end), and an event per set between the copy and the kernel.
  cudaStream_t copy_stream_ = nullptr;
  mutable uint8_t* device_staging_ = nullptr;
  mutable const uint8_t* host_side_[2][kBatchPages] = {};
  mutable std::pair<int, int> copy_runs_[2][kBatchPages] = {};
  mutable cudaEvent_t copied_[2] = {nullptr, nullptr};
  const DeviceKvPoolOptions options_;
  int device_ = 0;  // the CUDA device the pool lives on (a background registration sets it)
  std::vector<SharedRegion> regions_;  // under mu_ (no move runs while one is unregistered)
};

}  // namespace strata::cuda
