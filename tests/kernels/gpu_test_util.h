// Helpers shared by the kernels' gpu tests: bf16 conversion, a device buffer that is poisoned
// (all bytes 0xff: NaN in bf16 and fp32) when allocated, and relative-error summaries.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace strata::kernels::testing {

inline uint16_t ToBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float RoundBf16(float f) { return FromBf16(ToBf16(f)); }

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Owns `bytes` of device memory, filled with 0xff on allocation (poison).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes_ == 0 ? 16 : bytes_) != cudaSuccess) ptr_ = nullptr;
    if (ptr_ != nullptr) (void)cudaMemset(ptr_, 0xff, bytes_);
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    if (ptr_ != nullptr) (void)cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// ||got - want|| / ||want|| over paired values, plus the count of non-finite `got`.
struct ErrorSummary {
  double err2 = 0, ref2 = 0, max_abs = 0;
  int64_t non_finite = 0, count = 0;
  void Add(double got, double want) {
    ++count;
    if (!std::isfinite(got)) {
      ++non_finite;
      return;
    }
    err2 += (got - want) * (got - want);
    ref2 += want * want;
    max_abs = std::max(max_abs, std::abs(got - want));
  }
  double Rel() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2); }
};

#define ASSERT_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

}  // namespace strata::kernels::testing
