// Host side of TMA: bf16 tensor maps with the 128-byte swizzle, encoded by the driver's
// cuTensorMapEncodeTiled (found once through the runtime, so nothing links libcuda). Header-only:
// the kernels' .cu files include it.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata::kernels {

// A bf16 tensor of `rank` (2 or 3) dims, dims[0] innermost (contiguous), byte strides of dims 1..,
// read in boxes of `box` elements (box[0] * 2 <= 128 bytes: one swizzled row). Elements past the
// dims read as zeros. `what` names the tensor in errors.
inline absl::Status EncodeBf16TensorMap(CUtensorMap* map, const void* base, int rank,
                                        const uint64_t* dims, const uint64_t* byte_strides,
                                        const uint32_t* box, const char* what) {
  static const auto encode = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  if (encode == nullptr) {
    return absl::FailedPreconditionError("the CUDA driver has no cuTensorMapEncodeTiled");
  }
  cuuint64_t d[3], st[2];
  cuuint32_t b[3], element_strides[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i > 0) st[i - 1] = byte_strides[i - 1];
  }
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), d, st, b,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(std::string("cuTensorMapEncodeTiled failed for ") + what +
                               " with CUresult " + std::to_string(static_cast<int>(r)));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
