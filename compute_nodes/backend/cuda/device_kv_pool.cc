#include "compute_nodes/backend/cuda/device_kv_pool.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <system_error>

#include "common/cuda/cuda_status.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/model/safetensors.h"
#include "kernels/kv_pages/kv_pages.h"
#include "spdlog/spdlog.h"

namespace strata::cuda {
namespace {

// What the kernels read for a payload of `dtype`: bf16 and fp8 as they are (the kernels decode
// fp8), fp32 rounded to bf16 on the host.
bool KernelsReadAsIs(runtime::PayloadDtype dtype) { return dtype != runtime::PayloadDtype::kF32; }

kernels::KvPayloadCodec KernelCodec(runtime::PayloadDtype dtype) {
  return dtype == runtime::PayloadDtype::kFp8E4M3 ? kernels::KvPayloadCodec::kFp8E4M3
                                                  : kernels::KvPayloadCodec::kBf16;
}

// A staging slot's bytes <-> a payload of `dtype` (fp32: widened / rounded element by element).
void ToBf16Payload(runtime::PayloadDtype dtype, std::span<const uint8_t> payload, uint8_t* bf16) {
  if (KernelsReadAsIs(dtype)) {
    std::memcpy(bf16, payload.data(), payload.size());
    return;
  }
  for (size_t i = 0; i < payload.size() / 4; ++i) {
    float f;
    std::memcpy(&f, payload.data() + 4 * i, 4);
    const uint16_t b = model::FloatToBf16(f);
    std::memcpy(bf16 + 2 * i, &b, 2);
  }
}

void FromBf16Payload(runtime::PayloadDtype dtype, const uint8_t* bf16, std::span<uint8_t> out) {
  if (KernelsReadAsIs(dtype)) {
    std::memcpy(out.data(), bf16, out.size());
    return;
  }
  for (size_t i = 0; i < out.size() / 4; ++i) {
    uint16_t b;
    std::memcpy(&b, bf16 + 2 * i, 2);
    const float f = model::Bf16ToFloat(b);
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
}

// The device address of [p, p + bytes) when all of it is pinned host memory mapped for the GPU
// (cudaHostAlloc, or cudaHostRegister with mapping), else nullptr. Both ends are looked up, so a
// range running off its allocation is not taken.
uint8_t* MappedRange(const uint8_t* p, size_t bytes) {
  auto device_address = [](const uint8_t* q) -> uint8_t* {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, q) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; clear it for the next call
      return nullptr;
    }
    return a.type == cudaMemoryTypeHost ? static_cast<uint8_t*>(a.devicePointer) : nullptr;
  };
  if (bytes == 0) return nullptr;
  uint8_t* first = device_address(p);
  if (first == nullptr) return nullptr;
  uint8_t* last = device_address(p + bytes - 1);
  return last == first + (bytes - 1) ? first : nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceKvPool>> DeviceKvPool::Create(runtime::KvLayout layout,
                                                                   int64_t num_pages,
                                                                   DeviceKvPoolOptions options) {
  if (num_pages <= 0 || layout.num_layers <= 0) {
    return absl::InvalidArgumentError("device KV pool: need pages and layers");
  }
  std::unique_ptr<DeviceKvPool> p(new DeviceKvPool(layout, num_pages, options));
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&p->device_));
  p->layer_stride_ = num_pages * layout.block_tokens * (layout.latent_dim + layout.rope_dim);
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&p->pool_), p->device_bytes()));
  CUDA_RETURN_IF_ERROR(cudaMemset(p->pool_, 0, p->device_bytes()));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&p->stream_, cudaStreamNonBlocking));
  if (options.copy_engine) {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&p->copy_stream_, cudaStreamNonBlocking));
  }
  return p;
}

DeviceKvPool::~DeviceKvPool() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) (void)cudaStreamSynchronize(copy_stream_);
  for (const SharedRegion& r : regions_) Unregister(r);  // waits for one still registering
  if (pool_ != nullptr) (void)cudaFree(pool_);
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  if (host_batch_ != nullptr) (void)cudaFreeHost(host_batch_);
  if (dev_batch_ != nullptr) (void)cudaFree(dev_batch_);
  if (device_staging_ != nullptr) (void)cudaFree(device_staging_);
  for (cudaEvent_t e : {batch_done_[0], batch_done_[1], copied_[0], copied_[1]}) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::StatusOr<std::shared_ptr<HostBuffer>> DeviceKvPool::AllocateHostBuffer(size_t bytes) const {
  void* p = nullptr;
  if (const cudaError_t err =
          cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable);
      err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        StrCat("pinning a ", bytes, "-byte host buffer for KV moves: ", cudaGetErrorString(err)));
  }
  return std::make_shared<HostBuffer>(static_cast<uint8_t*>(p), bytes,
                                      [](uint8_t* q) { (void)cudaFreeHost(q); });
}

namespace {

// Registers [base, base + size) with CUDA, mapped, from the current device; false (logged) when
// it cannot.
bool RegisterRegion(const uint8_t* base, size_t size) {
  const auto start = std::chrono::steady_clock::now();
  void* p = const_cast<uint8_t*>(base);
  if (const cudaError_t err =
          cudaHostRegister(p, size, cudaHostRegisterMapped | cudaHostRegisterPortable);
      err != cudaSuccess) {
    (void)cudaGetLastError();
    spdlog::warn(
        "device KV pool: cannot register {} bytes of shared host memory for reads in place "
        "({}); copying blocks instead",
        size, cudaGetErrorString(err));
    return false;
  }
  if (MappedRange(base, size) == nullptr) {
    (void)cudaHostUnregister(p);
    spdlog::warn(
        "device KV pool: registered shared host memory is not device-mapped; copying blocks "
        "instead");
    return false;
  }
  spdlog::info(
      "device KV pool: registered {} MiB of shared host memory in {:.0f} ms; cached blocks are "
      "read in place",
      size >> 20,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return true;
}

bool Ready(const std::shared_future<bool>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace

void DeviceKvPool::Unregister(const SharedRegion& r) {
  if (r.registered.valid() && r.registered.get()) {
    (void)cudaHostUnregister(const_cast<uint8_t*>(r.base));
  }
}

bool DeviceKvPool::ReadsInPlace(std::span<const uint8_t> region,
                                const std::shared_ptr<const void>& owner) {
  if (!options_.register_shared_regions || region.empty() || owner == nullptr) return false;
  std::lock_guard<std::mutex> lock(mu_);
  // A region that only the pool still holds was let go by its transport (the server restarted
  // and the data path was re-opened): no fetch can hand over blocks in it any more, so it is
  // unregistered and unmapped now instead of staying pinned until it falls out of the window.
  // (One still registering is left for a later call: waiting for it would hold up this one.)
  std::erase_if(regions_, [this](const SharedRegion& r) {
    if (r.owner.use_count() != 1 || !Ready(r.registered)) return false;
    (void)cudaStreamSynchronize(stream_);  // moves are synchronous; this is belt and braces
    Unregister(r);
    return true;
  });
  // A remembered region is still mapped (its owner is held), so its address cannot be another's.
  for (const SharedRegion& r : regions_) {
    if (r.base == region.data() && r.size == region.size()) {
      return Ready(r.registered) && r.registered.get();
    }
  }
  SharedRegion r{.base = region.data(), .size = region.size(), .owner = owner};
  if (options_.register_in_background) {
    try {
      r.registered =
          std::async(std::launch::async, [device = device_, base = r.base, size = r.size] {
            // A new thread starts on device 0.
            if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
              (void)cudaGetLastError();
              spdlog::warn("device KV pool: cannot select device {} to register shared memory ({})",
                           device, cudaGetErrorString(err));
              return false;
            }
            return RegisterRegion(base, size);
          }).share();
    } catch (const std::system_error& e) {  // no thread to be had: register it here
      spdlog::debug("device KV pool: registering shared host memory inline: {}", e.what());
    }
  }
  if (!r.registered.valid()) {
    std::promise<bool> now;
    now.set_value(RegisterRegion(r.base, r.size));
    r.registered = now.get_future().share();
  }
  regions_.push_back(std::move(r));
  while (static_cast<int>(regions_.size()) > std::max(1, options_.max_registered_regions)) {
    (void)cudaStreamSynchronize(stream_);  // moves are synchronous; this is belt and braces
    Unregister(regions_.front());
    regions_.erase(regions_.begin());
  }
  const SharedRegion& added = regions_.back();
  return Ready(added.registered) && added.registered.get();
}

namespace {

// Every layer of `count` pages <-> payloads in `codec` (pages and payload pointers: device
// arrays).
absl::Status LaunchMove(const runtime::KvLayout& l, kernels::KvPayloadCodec codec,
                        __nv_bfloat16* pool, int64_t layer_stride, int count, const int32_t* pages,
                        uint8_t* const* payloads, bool to_payload, cudaStream_t stream) {
  kernels::KvPagesParams p;
  p.codec = codec;
  p.num_blocks = count;
  p.block_tokens = static_cast<int>(l.block_tokens);
  p.latent_dim = static_cast<int>(l.latent_dim);
  p.rope_dim = static_cast<int>(l.rope_dim);
  p.num_layers = static_cast<int>(l.num_layers);
  p.layer_begin = 0;
  p.layer_end = p.num_layers;
  p.pool = pool;
  p.layer_stride = layer_stride;
  p.page_stride = l.block_tokens * (l.latent_dim + l.rope_dim);
  p.pages = pages;
  p.payloads = payloads;
  return to_payload ? kernels::LaunchKvPagesToPayload(p, stream)
                    : kernels::LaunchKvPayloadToPages(p, stream);
}

}  // namespace

absl::Status DeviceKvPool::EnsureBatchStaging() const {
  if (staging_ != nullptr) return absl::OkStatus();
  const size_t set_bytes = kBatchPages * PayloadBytes(runtime::PayloadDtype::kBf16);
  uint8_t* staging = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(reinterpret_cast<void**>(&staging), 2 * set_bytes, cudaHostAllocMapped));
  staging_ = staging;
  CUDA_RETURN_IF_ERROR(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&staging_dev_), staging_, 0));
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_batch_), 2 * sizeof(Batch),
                                     cudaHostAllocDefault));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&dev_batch_), 2 * sizeof(Batch)));
  for (cudaEvent_t* e : {&batch_done_[0], &batch_done_[1], &copied_[0], &copied_[1]}) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  if (copy_stream_ != nullptr) {
    if (const cudaError_t err =
            cudaMalloc(reinterpret_cast<void**>(&device_staging_), 2 * set_bytes);
        err != cudaSuccess) {
      (void)cudaGetLastError();
      device_staging_ = nullptr;
      spdlog::warn(
          "device KV pool: no device memory for {} MiB of copy-engine staging slots ({}); the "
          "kernels read and write pinned payloads over PCIe instead",
          (2 * set_bytes) >> 20, cudaGetErrorString(err));
    }
  }
  return absl::OkStatus();
}

size_t DeviceKvPool::KernelPayloadBytes(runtime::PayloadDtype dtype) const {
  return PayloadBytes(KernelsReadAsIs(dtype) ? dtype : runtime::PayloadDtype::kBf16);
}

size_t DeviceKvPool::SlotOffset(int set, int i, runtime::PayloadDtype dtype) const {
  return set * kBatchPages * PayloadBytes(runtime::PayloadDtype::kBf16) +
         i * KernelPayloadBytes(dtype);
}

uint8_t* DeviceKvPool::StagingSlot(int set, int i, runtime::PayloadDtype dtype) const {
  return staging_ + SlotOffset(set, i, dtype);
}

bool DeviceKvPool::BindPayload(int set, int i, runtime::PayloadDtype dtype,
                               const uint8_t* payload) const {
  // The kernels move 16-byte vectors; block payloads start 16-aligned in a fetch buffer.
  const bool aligned = reinterpret_cast<uintptr_t>(payload) % 16 == 0;
  uint8_t* in_place =
      KernelsReadAsIs(dtype) && aligned ? MappedRange(payload, PayloadBytes(dtype)) : nullptr;
  const size_t offset = SlotOffset(set, i, dtype);
  host_side_[set][i] = in_place != nullptr ? payload : staging_ + offset;
  host_batch_[set].payloads[i] = in_place != nullptr ? in_place : staging_dev_ + offset;
  return in_place == nullptr;
}

int DeviceKvPool::PlanCopies(int set, int count, runtime::PayloadDtype dtype) const {
  if (device_staging_ == nullptr) return 0;
  const size_t bytes = KernelPayloadBytes(dtype);
  int runs = 0;
  for (int i = 0; i < count;) {
    int end = i + 1;  // payloads [i, end) lie back to back on the host: one copy
    while (end < count && host_side_[set][end] == host_side_[set][end - 1] + bytes) ++end;
    copy_runs_[set][runs++] = {i, end};
    i = end;
  }
  for (int k = 0; k < count; ++k) {
    host_batch_[set].payloads[k] = device_staging_ + SlotOffset(set, k, dtype);
  }
  return runs;
}

absl::Status DeviceKvPool::CopyPayloads(int set, int runs, runtime::PayloadDtype dtype,
                                        bool to_host) const {
  const size_t bytes = KernelPayloadBytes(dtype);
  for (int r = 0; r < runs; ++r) {
    const auto [first, end] = copy_runs_[set][r];
    uint8_t* device = device_staging_ + SlotOffset(set, first, dtype);
    auto* host = const_cast<uint8_t*>(host_side_[set][first]);  // written only when to_host
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(to_host ? host : device, to_host ? device : host, (end - first) * bytes,
                        to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copy_stream_));
  }
  return absl::OkStatus();
}

absl::Status DeviceKvPool::LaunchBatch(int set, int count, runtime::PayloadDtype dtype,
                                       bool to_payload) const {
  const int runs = PlanCopies(set, count, dtype);
  // On a load the descriptors cross on the copy stream ahead of the payloads (on the kernel's
  // stream they could queue behind the next batch's payloads for the same copy engine).
  cudaStream_t descriptors = runs > 0 && !to_payload ? copy_stream_ : stream_;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_batch_ + set, host_batch_ + set, sizeof(Batch),
                                       cudaMemcpyHostToDevice, descriptors));
  if (runs > 0 && !to_payload) {
    RETURN_IF_ERROR(CopyPayloads(set, runs, dtype, /*to_host=*/false));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_[set], copy_stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, copied_[set], 0));
  }
  RETURN_IF_ERROR(LaunchMove(layout(), KernelCodec(dtype), pool_, layer_stride_, count,
                             dev_batch_[set].pages, dev_batch_[set].payloads, to_payload, stream_));
  if (runs > 0 && to_payload) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_[set], stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, copied_[set], 0));
    RETURN_IF_ERROR(CopyPayloads(set, runs, dtype, /*to_host=*/true));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(batch_done_[set], copy_stream_));
  } else {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(batch_done_[set], stream_));
  }
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ImportPages(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                                       std::span<const std::span<const uint8_t>> payloads,
                                       int64_t* done) {
  *done = 0;
  RETURN_IF_ERROR(CheckMoves("ImportPages", pages, dtype, payloads));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(EnsureBatchStaging());
  const int64_t n = static_cast<int64_t>(pages.size());
  int64_t end[2] = {0, 0};  // pages [0, end[set]) are moved once set's event completes
  std::vector<int64_t> staged;
  for (int64_t start = 0, b = 0; start < n; start += kBatchPages, ++b) {
    const int set = static_cast<int>(b % 2);
    if (b >= 2) {  // the batch that used this set two rounds ago has been read
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(batch_done_[set]));
      *done = end[set];
    }
    const int count = static_cast<int>(std::min<int64_t>(kBatchPages, n - start));
    staged.clear();
    for (int i = 0; i < count; ++i) {
      host_batch_[set].pages[i] = pages[start + i];
      if (BindPayload(set, i, dtype, payloads[start + i].data())) staged.push_back(i);
    }
    ForEachCopy(static_cast<int64_t>(staged.size()),
                static_cast<int64_t>(staged.size() * payloads[start].size()), [&](int64_t k) {
                  const int i = static_cast<int>(staged[k]);
                  ToBf16Payload(dtype, payloads[start + i], StagingSlot(set, i, dtype));
                });
    RETURN_IF_ERROR(LaunchBatch(set, count, dtype, /*to_payload=*/false));
    end[set] = start + count;
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  *done = n;
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ExportPagesInto(std::span<const int32_t> pages,
                                           runtime::PayloadDtype dtype,
                                           std::span<const std::span<uint8_t>> outs,
                                           int64_t* done) const {
  *done = 0;
  RETURN_IF_ERROR(CheckMoves("ExportPagesInto", pages, dtype, outs));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(EnsureBatchStaging());
  const int64_t n = static_cast<int64_t>(pages.size());
  const int64_t batches = (n + kBatchPages - 1) / kBatchPages;
  std::vector<int64_t> staged[2];  // per set: the slots the host copies out after the launch
  // Batch b + 1 is moved into the other set while the host copies batch b out.
  auto launch = [&](int64_t b) -> absl::Status {
    const int set = static_cast<int>(b % 2);
    const int64_t start = b * kBatchPages;
    const int count = static_cast<int>(std::min<int64_t>(kBatchPages, n - start));
    staged[set].clear();
    for (int i = 0; i < count; ++i) {
      host_batch_[set].pages[i] = pages[start + i];
      if (BindPayload(set, i, dtype, outs[start + i].data())) staged[set].push_back(i);
    }
    return LaunchBatch(set, count, dtype, /*to_payload=*/true);
  };
  if (batches > 0) RETURN_IF_ERROR(launch(0));
  for (int64_t b = 0; b < batches; ++b) {
    const int set = static_cast<int>(b % 2);
    if (b + 1 < batches) RETURN_IF_ERROR(launch(b + 1));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(batch_done_[set]));
    const int64_t start = b * kBatchPages;
    const std::vector<int64_t>& mine = staged[set];
    ForEachCopy(static_cast<int64_t>(mine.size()),
                static_cast<int64_t>(mine.size() * outs[start].size()), [&](int64_t k) {
                  const int i = static_cast<int>(mine[k]);
                  FromBf16Payload(dtype, StagingSlot(set, i, dtype), outs[start + i]);
                });
    *done = std::min<int64_t>(n, start + kBatchPages);
  }
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ExportPageInto(int32_t page, runtime::PayloadDtype dtype,
                                          std::span<uint8_t> out) const {
  int64_t done = 0;
  const std::span<uint8_t> outs[1] = {out};
  return ExportPagesInto(std::span<const int32_t>(&page, 1), dtype, outs, &done);
}

absl::Status DeviceKvPool::ImportPage(int32_t page, runtime::PayloadDtype dtype,
                                      std::span<const uint8_t> payload) {
  int64_t done = 0;
  const std::span<const uint8_t> payloads[1] = {payload};
  return ImportPages(std::span<const int32_t>(&page, 1), dtype, payloads, &done);
}

absl::Status DeviceKvPool::FillRandom(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(FillRandomBf16(pool_, device_bytes() / 2, 0, 1.f, seed, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace strata::cuda
