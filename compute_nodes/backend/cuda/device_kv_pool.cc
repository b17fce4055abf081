#include "compute_nodes/backend/cuda/device_kv_pool.h"

#include <algorithm>
#include <cstring>

#include "common/cuda/cuda_status.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/model/safetensors.h"
#include "kernels/kv_pages/kv_pages.h"

namespace strata::cuda {
namespace {

// bf16 payload bytes <-> a payload of `dtype` (fp32: widened / rounded element by element).
void ToBf16Payload(runtime::PayloadDtype dtype, std::span<const uint8_t> payload, uint8_t* bf16) {
  if (dtype == runtime::PayloadDtype::kBf16) {
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

void FromBf16Payload(runtime::PayloadDtype dtype, const uint8_t* bf16, size_t bf16_bytes,
                     std::vector<uint8_t>* payload) {
  if (dtype == runtime::PayloadDtype::kBf16) {
    payload->assign(bf16, bf16 + bf16_bytes);
    return;
  }
  payload->resize(bf16_bytes * 2);
  for (size_t i = 0; i < bf16_bytes / 2; ++i) {
    uint16_t b;
    std::memcpy(&b, bf16 + 2 * i, 2);
    const float f = model::Bf16ToFloat(b);
    std::memcpy(payload->data() + 4 * i, &f, 4);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceKvPool>> DeviceKvPool::Create(runtime::KvLayout layout,
                                                                   int64_t num_pages) {
  if (num_pages <= 0 || layout.num_layers <= 0) {
    return absl::InvalidArgumentError("device KV pool: need pages and layers");
  }
  std::unique_ptr<DeviceKvPool> p(new DeviceKvPool(layout, num_pages));
  p->layer_stride_ = num_pages * layout.block_tokens * (layout.latent_dim + layout.rope_dim);
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&p->pool_), p->device_bytes()));
  CUDA_RETURN_IF_ERROR(cudaMemset(p->pool_, 0, p->device_bytes()));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&p->stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&p->staging_),
                                     p->PayloadBytes(runtime::PayloadDtype::kBf16),
                                     cudaHostAllocMapped));
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(reinterpret_cast<void**>(&p->host_page_), 64, cudaHostAllocDefault));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&p->dev_page_), 16));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&p->dev_payloads_), sizeof(uint8_t*)));
  uint8_t* mapped = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped), p->staging_, 0));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(p->dev_payloads_, &mapped, sizeof(uint8_t*), cudaMemcpyHostToDevice));
  return p;
}

DeviceKvPool::~DeviceKvPool() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  if (pool_ != nullptr) (void)cudaFree(pool_);
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  if (host_page_ != nullptr) (void)cudaFreeHost(host_page_);
  if (dev_page_ != nullptr) (void)cudaFree(dev_page_);
  if (dev_payloads_ != nullptr) (void)cudaFree(dev_payloads_);
  if (batch_staging_ != nullptr) (void)cudaFreeHost(batch_staging_);
  if (batch_host_pages_ != nullptr) (void)cudaFreeHost(batch_host_pages_);
  if (batch_dev_pages_ != nullptr) (void)cudaFree(batch_dev_pages_);
  if (batch_dev_payloads_ != nullptr) (void)cudaFree(batch_dev_payloads_);
  for (cudaEvent_t e : batch_done_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

namespace {

// Every layer of `count` pages <-> bf16 payloads (pages and payload pointers: device arrays).
absl::Status LaunchMove(const runtime::KvLayout& l, __nv_bfloat16* pool, int64_t layer_stride,
                        int count, const int32_t* pages, uint8_t* const* payloads, bool to_payload,
                        cudaStream_t stream) {
  kernels::KvPagesParams p;
  p.codec = kernels::KvPayloadCodec::kBf16;
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

absl::Status DeviceKvPool::Move(int32_t page, bool to_payload) const {
  host_page_[0] = page;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_page_, host_page_, 4, cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(
      LaunchMove(layout(), pool_, layer_stride_, 1, dev_page_, dev_payloads_, to_payload, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status DeviceKvPool::EnsureBatchStaging() const {
  if (batch_staging_ != nullptr) return absl::OkStatus();
  const size_t slot = PayloadBytes(runtime::PayloadDtype::kBf16);
  constexpr int kSlots = 2 * kBatchPages;
  uint8_t* staging = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(reinterpret_cast<void**>(&staging), kSlots * slot, cudaHostAllocMapped));
  batch_staging_ = staging;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&batch_host_pages_), kSlots * 4,
                                     cudaHostAllocDefault));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&batch_dev_pages_), kSlots * 4));
  CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&batch_dev_payloads_), kSlots * sizeof(uint8_t*)));
  uint8_t* mapped = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped), staging, 0));
  std::vector<uint8_t*> slots(kSlots);
  for (int i = 0; i < kSlots; ++i) slots[i] = mapped + i * slot;
  CUDA_RETURN_IF_ERROR(cudaMemcpy(batch_dev_payloads_, slots.data(), kSlots * sizeof(uint8_t*),
                                  cudaMemcpyHostToDevice));
  for (cudaEvent_t& e : batch_done_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return absl::OkStatus();
}

uint8_t* DeviceKvPool::BatchSlot(int set, int i) const {
  return batch_staging_ + (set * kBatchPages + i) * PayloadBytes(runtime::PayloadDtype::kBf16);
}

absl::Status DeviceKvPool::LaunchBatch(int set, int count, bool to_payload) const {
  int32_t* host_pages = batch_host_pages_ + set * kBatchPages;
  int32_t* dev_pages = batch_dev_pages_ + set * kBatchPages;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dev_pages, host_pages, count * 4, cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(LaunchMove(layout(), pool_, layer_stride_, count, dev_pages,
                             batch_dev_payloads_ + set * kBatchPages, to_payload, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(batch_done_[set], stream_));
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ImportPages(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                                       std::span<const std::span<const uint8_t>> payloads,
                                       int64_t* done) {
  *done = 0;
  if (pages.size() != payloads.size()) {
    return absl::InvalidArgumentError("ImportPages: pages and payloads differ in count");
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    RETURN_IF_ERROR(CheckPage(pages[i]));
    RETURN_IF_ERROR(CheckPayload(dtype, payloads[i].size()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(EnsureBatchStaging());
  const int64_t n = static_cast<int64_t>(pages.size());
  int64_t end[2] = {0, 0};  // pages [0, end[set]) are moved once set's event completes
  for (int64_t start = 0, b = 0; start < n; start += kBatchPages, ++b) {
    const int set = static_cast<int>(b % 2);
    if (b >= 2) {  // the batch that used these slots two rounds ago has been read
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(batch_done_[set]));
      *done = end[set];
    }
    const int count = static_cast<int>(std::min<int64_t>(kBatchPages, n - start));
    ForEachCopy(count, count * static_cast<int64_t>(payloads[start].size()), [&](int64_t i) {
      ToBf16Payload(dtype, payloads[start + i], BatchSlot(set, static_cast<int>(i)));
    });
    for (int i = 0; i < count; ++i) batch_host_pages_[set * kBatchPages + i] = pages[start + i];
    RETURN_IF_ERROR(LaunchBatch(set, count, /*to_payload=*/false));
    end[set] = start + count;
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  *done = n;
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ExportPages(std::span<const int32_t> pages, runtime::PayloadDtype dtype,
                                       std::vector<std::vector<uint8_t>>* payloads,
                                       int64_t* done) const {
  *done = 0;
  for (const int32_t page : pages) RETURN_IF_ERROR(CheckPage(page));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(EnsureBatchStaging());
  const int64_t n = static_cast<int64_t>(pages.size());
  const size_t bf16_bytes = PayloadBytes(runtime::PayloadDtype::kBf16);
  payloads->resize(n);
  // Batch b + 1 is moved into the other set's slots while the host copies batch b out.
  auto launch = [&](int64_t b) -> absl::Status {
    const int set = static_cast<int>(b % 2);
    const int64_t start = b * kBatchPages;
    const int count = static_cast<int>(std::min<int64_t>(kBatchPages, n - start));
    for (int i = 0; i < count; ++i) batch_host_pages_[set * kBatchPages + i] = pages[start + i];
    return LaunchBatch(set, count, /*to_payload=*/true);
  };
  const int64_t batches = (n + kBatchPages - 1) / kBatchPages;
  if (batches > 0) RETURN_IF_ERROR(launch(0));
  for (int64_t b = 0; b < batches; ++b) {
    if (b + 1 < batches) RETURN_IF_ERROR(launch(b + 1));
    const int set = static_cast<int>(b % 2);
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(batch_done_[set]));
    const int64_t start = b * kBatchPages;
    const int count = static_cast<int>(std::min<int64_t>(kBatchPages, n - start));
    ForEachCopy(count, count * static_cast<int64_t>(bf16_bytes), [&](int64_t i) {
      FromBf16Payload(dtype, BatchSlot(set, static_cast<int>(i)), bf16_bytes,
                      &(*payloads)[start + i]);
    });
    *done = start + count;
  }
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ExportPage(int32_t page, runtime::PayloadDtype dtype,
                                      std::vector<uint8_t>* payload) const {
  RETURN_IF_ERROR(CheckPage(page));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Move(page, /*to_payload=*/true));
  FromBf16Payload(dtype, staging_, PayloadBytes(runtime::PayloadDtype::kBf16), payload);
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ImportPage(int32_t page, runtime::PayloadDtype dtype,
                                      std::span<const uint8_t> payload) {
  RETURN_IF_ERROR(CheckPage(page));
  RETURN_IF_ERROR(CheckPayload(dtype, payload.size()));
  std::lock_guard<std::mutex> lock(mu_);
  ToBf16Payload(dtype, payload, staging_);
  return Move(page, /*to_payload=*/false);
}

absl::Status DeviceKvPool::FillRandom(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(FillRandomBf16(pool_, device_bytes() / 2, 0, 1.f, seed, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace strata::cuda
