// Facts about the current CUDA device that launchers choose kernels by, looked up once per device:
// whether it runs the kernels built for sm_90a (compute capability 9.x), and its SM count.
// Header-only, plain C++ (the launchers' host code includes it).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace strata::kernels {

inline bool CurrentDeviceIsSm90() {
  static std::atomic<int> major_of[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  int major = major_of[device].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      return false;
    }
    major_of[device].store(major, std::memory_order_relaxed);
  }
  return major == 9;
}

// Streaming multiprocessors of the current device; 0 when it cannot be asked.
inline int CurrentDeviceSmCount() {
  static std::atomic<int> sms_of[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int sms = sms_of[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 0;
    }
    sms_of[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace strata::kernels
