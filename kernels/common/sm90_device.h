// Facts about the current CUDA device that launchers choose kernels by, looked up once per device:
// whether it runs the kernels built for sm_90a (compute capability 9.x), and its SM count.
// Header-only, plain C++ (the launchers' host code includes it).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace strata::kernels {

// A positive per-device fact: cache[device] once known, else ask(device) (0 or less: unknown,
// asked again next time). 0 when the current device cannot be named.
template <typename Ask>
int RememberedForCurrentDevice(std::atomic<int> (&cache)[64], Ask ask) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int value = cache[device].load(std::memory_order_relaxed);
  if (value <= 0) {
    value = ask(device);
    if (value <= 0) return 0;
    cache[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

// Device attribute kAttr of the current device (positive for the attributes asked here),
// remembered per device; 0 when it cannot be asked.
template <cudaDeviceAttr kAttr>
int CurrentDeviceAttribute() {
  static std::atomic<int> value_of[64] = {};
  return RememberedForCurrentDevice(value_of, [](int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, kAttr, device) == cudaSuccess ? value : 0;
  });
}

inline bool CurrentDeviceIsSm90() {
  return CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>() == 9;
}

// Streaming multiprocessors of the current device; 0 when it cannot be asked.
inline int CurrentDeviceSmCount() {
  return CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>();
}

}  // namespace strata::kernels
