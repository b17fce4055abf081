// Split-KV kernel for blocks of 16 query heads (one instantiation per file: parallel builds).
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode.cuh"

namespace strata::kernels {

template <>
absl::Status LaunchMlaDecodeSplitKv<1>(const MlaDecodeParams& params, cudaStream_t stream) {
  return params.kv_dtype == MlaKvDtype::kFp8E4M3
             ? mla_detail::LaunchSplitKvKernel<1, true>(params, stream)
             : mla_detail::LaunchSplitKvKernel<1, false>(params, stream);
}

}  // namespace strata::kernels
