// CUDA runtime errors as absl::Status. Every CUDA call in Strata is checked:
//
//   CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata {

inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code =
      err == cudaErrorMemoryAllocation
          ? absl::StatusCode::kResourceExhausted
          : (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver
                 ? absl::StatusCode::kUnavailable
                 : absl::StatusCode::kInternal);
  return absl::Status(
      code, absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace strata

#define CUDA_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                  \
    if (const cudaError_t strata_cuda_err_ = (expr); strata_cuda_err_ != cudaSuccess) { \
      return ::strata::CudaStatus(strata_cuda_err_, #expr);                             \
    }                                                                                   \
  } while (false)
