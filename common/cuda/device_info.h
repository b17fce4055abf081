// The CUDA devices this process can see, and a self-test that proves each one runs kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int num_sms = 0;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  std::string pci_bus_id;
};

// Unavailable when no driver or no device is present (the normal case on CPU machines).
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

// Runs a kernel on `device` that writes a pattern into `num_words` words of device memory,
// copies it back and checks it. Internal error on a mismatch; the CUDA error otherwise.
absl::Status SelfTestCudaDevice(int device, int64_t num_words = 1 << 20);

}  // namespace strata
