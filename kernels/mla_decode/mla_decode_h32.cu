// Split-KV kernel for blocks of 32 query heads (one instantiation per file: parallel builds).
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode.cuh"

namespace strata::kernels {

template <>
absl::Status LaunchMlaDecodeSplitKv<2>(const MlaDecodeParams& params, cudaStream_t stream) {
  return params.kv_dtype == MlaKvDtype::kFp8E4M3
             ? mla_detail::LaunchSplitKvKernel<2, true>(params, stream)
             : mla_detail::LaunchSplitKvKernel<2, false>(params, stream);
}

}  // namespace strata::kernels
