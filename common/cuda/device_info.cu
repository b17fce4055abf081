#include <cuda_runtime.h>

#include <vector>

#include "common/cuda/cuda_status.h"
#include "common/cuda/device_info.h"

namespace strata {
namespace {

__device__ __forceinline__ uint32_t Pattern(uint64_t i) {
  return static_cast<uint32_t>(i * 0x9E3779B1u) ^ 0xA5A5A5A5u;
}

__global__ void FillPatternKernel(uint32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = Pattern(i);
  }
}

uint32_t HostPattern(uint64_t i) { return static_cast<uint32_t>(i * 0x9E3779B1u) ^ 0xA5A5A5A5u; }

}  // namespace

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  std::vector<CudaDeviceInfo> devices;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    CudaDeviceInfo info;
    info.index = d;
    info.name = prop.name;
    info.sm_major = prop.major;
    info.sm_minor = prop.minor;
    info.num_sms = prop.multiProcessorCount;
    info.total_memory_bytes = prop.totalGlobalMem;
    char bus[32] = {};
    CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus), d));
    info.pci_bus_id = bus;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(d));
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    info.free_memory_bytes = free_bytes;
    devices.push_back(std::move(info));
  }
  return devices;
}

absl::Status SelfTestCudaDevice(int device, int64_t num_words) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  uint32_t* buf = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&buf, num_words * sizeof(uint32_t)));
  FillPatternKernel<<<256, 256>>>(buf, num_words);
  absl::Status st = CudaStatus(cudaGetLastError(), "FillPatternKernel launch");
  std::vector<uint32_t> host(num_words);
  if (st.ok()) {
    st.Update(CudaStatus(
        cudaMemcpy(host.data(), buf, num_words * sizeof(uint32_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy D2H"));
  }
  (void)cudaFree(buf);
  if (!st.ok()) return st;
  for (int64_t i = 0; i < num_words; ++i) {
    if (host[i] != HostPattern(i)) {
      return absl::InternalError(absl::StrCat("device ", device, " self-test: word ", i, " is ",
                                              host[i], ", expected ", HostPattern(i)));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
