#include "compute_nodes/backend/cuda/device_kv_pool.h"

#include <cstring>

#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/model/safetensors.h"
#include "kernels/kv_pages/kv_pages.h"

namespace strata::cuda {

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
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status DeviceKvPool::Move(int32_t page, bool to_payload) const {
  const runtime::KvLayout& l = layout();
  kernels::KvPagesParams p;
  p.codec = kernels::KvPayloadCodec::kBf16;
  p.num_blocks = 1;
  p.block_tokens = static_cast<int>(l.block_tokens);
  p.latent_dim = static_cast<int>(l.latent_dim);
  p.rope_dim = static_cast<int>(l.rope_dim);
  p.num_layers = static_cast<int>(l.num_layers);
  p.layer_begin = 0;
  p.layer_end = p.num_layers;
  p.pool = pool_;
  p.layer_stride = layer_stride_;
  p.page_stride = l.block_tokens * (l.latent_dim + l.rope_dim);
  p.pages = dev_page_;
  p.payloads = dev_payloads_;
  host_page_[0] = page;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_page_, host_page_, 4, cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(to_payload ? kernels::LaunchKvPagesToPayload(p, stream_)
                             : kernels::LaunchKvPayloadToPages(p, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ExportPage(int32_t page, runtime::PayloadDtype dtype,
                                      std::vector<uint8_t>* payload) const {
  RETURN_IF_ERROR(CheckPage(page));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Move(page, /*to_payload=*/true));
  const size_t bf16_bytes = PayloadBytes(runtime::PayloadDtype::kBf16);
  payload->resize(PayloadBytes(dtype));
  if (dtype == runtime::PayloadDtype::kBf16) {
    std::memcpy(payload->data(), staging_, bf16_bytes);
  } else {
    for (size_t i = 0; i < bf16_bytes / 2; ++i) {
      uint16_t b;
      std::memcpy(&b, staging_ + 2 * i, 2);
      const float f = model::Bf16ToFloat(b);
      std::memcpy(payload->data() + 4 * i, &f, 4);
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceKvPool::ImportPage(int32_t page, runtime::PayloadDtype dtype,
                                      std::span<const uint8_t> payload) {
  RETURN_IF_ERROR(CheckPage(page));
  RETURN_IF_ERROR(CheckPayload(dtype, payload.size()));
  std::lock_guard<std::mutex> lock(mu_);
  if (dtype == runtime::PayloadDtype::kBf16) {
    std::memcpy(staging_, payload.data(), payload.size());
  } else {
    for (size_t i = 0; i < payload.size() / 4; ++i) {
      float f;
      std::memcpy(&f, payload.data() + 4 * i, 4);
      const uint16_t b = model::FloatToBf16(f);
      std::memcpy(staging_ + 2 * i, &b, 2);
    }
  }
  return Move(page, /*to_payload=*/false);
}

absl::Status DeviceKvPool::FillRandom(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(FillRandomBf16(pool_, device_bytes() / 2, 0, 1.f, seed, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace strata::cuda
