// Facts about the current CUDA device that launchers choose kernels by, looked up once per device:
// whether it runs the kernels built for sm_90a (compute capability 9.x), and its SM count.
// Header-only, plain C++ (the launchers' host code includes it).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace strata::kernels {

// Device attribute kAttr of the current device (positive for the attributes asked here),
// remembered per device; 0 when it cannot be asked.
template <cudaDeviceAttr kAttr>
int CurrentDeviceAttribute() {
  static std::atomic<int> value_of[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int value = value_of[device].load(std::memory_order_relaxed);
  if (value == 0) {
    if (cudaDeviceGetAttribute(&value, kAttr, device) != cudaSuccess) return 0;
    value_of[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

inline bool CurrentDeviceIsSm90() {
  return CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>() == 9;
}

// Streaming multiprocessors of the current device; 0 when it cannot be asked.
inline int CurrentDeviceSmCount() {
  return CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>();
}

}  // namespace strata::kernels
