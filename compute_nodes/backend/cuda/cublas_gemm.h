// Row-major bf16 GEMMs through cuBLAS (fp32 accumulation), the shapes the backend uses:
//
//   C[m][n] = alpha · A[m][k] · op(B) + beta · C      op(B) = B[n][k]ᵀ (trans_b, a torch Linear
//                                                     weight) or B[k][n]
// with leading dimensions in elements and, for `batch` > 1, element strides between the
// matrices of consecutive batch entries (cublasGemmStridedBatchedEx). C is bf16 or fp32.
//
// cuBLAS is column-major: a row-major C = A·op(B) is computed as the column-major Cᵀ = op(B)ᵀ·Aᵀ,
// which reads the same memory with A and B swapped. A Cublas handle is bound to one stream and is
// not thread-safe (one per engine). It owns a 32 MiB workspace (graph capture needs one).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::cuda {

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool trans_b = true;
  const __nv_bfloat16* a = nullptr;
  int64_t lda = 0;
  const __nv_bfloat16* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_fp32 = false;  // else bf16
  float alpha = 1.f, beta = 0.f;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

class Cublas {
 public:
  static absl::StatusOr<Cublas> Create(cudaStream_t stream) {
    Cublas c;
    if (cublasStatus_t st = cublasCreate(&c.handle_); st != CUBLAS_STATUS_SUCCESS) {
      return Error("cublasCreate", st);
    }
    if (cublasStatus_t st = cublasSetStream(c.handle_, stream); st != CUBLAS_STATUS_SUCCESS) {
      return Error("cublasSetStream", st);
    }
    // A workspace of our own: cuBLAS then allocates nothing while a graph is being captured.
    if (cudaError_t err = cudaMalloc(&c.workspace_, kWorkspaceBytes); err != cudaSuccess) {
      return absl::ResourceExhaustedError(std::string("cuBLAS workspace: ") +
                                          cudaGetErrorString(err));
    }
    if (cublasStatus_t st = cublasSetWorkspace(c.handle_, c.workspace_, kWorkspaceBytes);
        st != CUBLAS_STATUS_SUCCESS) {
      return Error("cublasSetWorkspace", st);
    }
    return c;
  }
  Cublas() = default;
  Cublas(Cublas&& o) noexcept : handle_(o.handle_), workspace_(o.workspace_) {
    o.handle_ = nullptr;
    o.workspace_ = nullptr;
  }
  Cublas& operator=(Cublas&& o) noexcept {
    std::swap(handle_, o.handle_);
    std::swap(workspace_, o.workspace_);
    return *this;
  }
  ~Cublas() {
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
  }

  absl::Status Gemm(const GemmArgs& g) const {
    if (g.m == 0 || g.n == 0 || g.batch == 0) return absl::OkStatus();
    // Column-major: C'[n x m] = op(B)' [n x k] · A' [k x m].
    const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cudaDataType_t c_type = g.c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t st;
    if (g.batch == 1) {
      st = cublasGemmEx(handle_, op_b, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
                        static_cast<int>(g.k), &g.alpha, g.b, CUDA_R_16BF, static_cast<int>(g.ldb),
                        g.a, CUDA_R_16BF, static_cast<int>(g.lda), &g.beta, g.c, c_type,
                        static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
      st = cublasGemmStridedBatchedEx(
          handle_, op_b, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
          static_cast<int>(g.k), &g.alpha, g.b, CUDA_R_16BF, static_cast<int>(g.ldb), g.stride_b,
          g.a, CUDA_R_16BF, static_cast<int>(g.lda), g.stride_a, &g.beta, g.c, c_type,
          static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return Error("cublasGemmEx", st);
    return absl::OkStatus();
  }

 private:
  static absl::Status Error(const char* what, cublasStatus_t st) {
    return absl::InternalError(std::string(what) + ": " + cublasGetStatusString(st));
  }
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace strata::cuda
