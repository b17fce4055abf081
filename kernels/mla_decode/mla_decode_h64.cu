// Split-KV kernel for blocks of 64 query heads (one instantiation per file: parallel builds).
#include "common/cuda/cuda_status.h"
#include "kernels/mla_decode/mla_decode.cuh"
#include "kernels/common/pdl.cuh"

namespace strata::kernels {

template <>
absl::Status LaunchMlaDecodeSplitKv<4>(const MlaDecodeParams& params, cudaStream_t stream) {
  using mla_detail::Layout;
  constexpr int kSmem = Layout<4>::kTotalBytes;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(mla_detail::MlaDecodeSplitKvKernel<4>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(params.num_splits, params.batch, params.num_heads_q / Layout<4>::kHeads);
  (void)LaunchPdl(mla_detail::MlaDecodeSplitKvKernel<4>, grid, dim3(mla_detail::kThreads), kSmem,
                  stream, params);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
