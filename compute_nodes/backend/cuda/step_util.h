// Helpers the CUDA backend's step code shares: device buffers that grow on demand (counting their
// reallocations, which invalidate captured decode graphs), pinned host memory, pinned host staging
// of small per-step arrays into one fixed device buffer, a side stream for parallel branches, and
// the torch-Linear GEMM and SiLU×mul of bf16 rows.
// Not thread-safe; owned by one engine.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "compute_nodes/backend/cuda/cublas_gemm.h"
#include "compute_nodes/backend/cuda/device_weights.h"
#include "kernels/activation/silu_mul.h"
#include "kernels/moe_experts/moe_experts.h"

namespace strata::cuda {

// Memory that grows on demand: device memory (cudaMalloc; cudaFree synchronizes, so no work in
// flight uses it) or pinned host memory (cudaHostAlloc: device -> host copies at full link
// speed). Every reallocation increments *grows (when set): device addresses captured in a graph
// change.
template <bool kPinnedHost>
class GrowingBuffer {
 public:
  explicit GrowingBuffer(int64_t* grows = nullptr) : grows_(grows) {}
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer() { Release(); }
  absl::Status Ensure(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    Release();
    if (grows_ != nullptr) ++*grows_;
    bytes = std::max<size_t>(bytes + bytes / 4, kPinnedHost ? 4096 : 256);
    if constexpr (kPinnedHost) {
      CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p_, bytes, 0));
    } else {
      CUDA_RETURN_IF_ERROR(cudaMalloc(&p_, bytes));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void Release() {
    if (p_ != nullptr) (void)(kPinnedHost ? cudaFreeHost(p_) : cudaFree(p_));
    p_ = nullptr;
    bytes_ = 0;
  }
  int64_t* grows_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};
using Buf = GrowingBuffer<false>;
using PinnedBuf = GrowingBuffer<true>;

// Pinned host staging for small per-call arrays, copied to one device buffer in one transfer.
// The device buffer keeps its address while the staged size fits (graphs read it in place).
class Meta {
 public:
  explicit Meta(int64_t* grows = nullptr) : dev_(grows) {}
  ~Meta() {
    if (host_ != nullptr) (void)cudaFreeHost(host_);
  }
  template <typename T>
  size_t Add(const std::vector<T>& v) {
    const size_t off = (data_.size() + 15) / 16 * 16;
    data_.resize(off + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(data_.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
  // Ensures the device buffer (before a capture), then copies the staged bytes on `stream`.
  absl::Status Upload(cudaStream_t stream) {
    if (data_.size() > host_bytes_) {
      if (host_ != nullptr) (void)cudaFreeHost(host_);
      host_ = nullptr;
      host_bytes_ = 0;
      const size_t bytes = std::max<size_t>(data_.size() * 2, 4096);
      CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes, 0));
      host_bytes_ = bytes;
    }
    RETURN_IF_ERROR(dev_.Ensure(data_.size() + 16));
    if (data_.empty()) return absl::OkStatus();
    std::memcpy(host_, data_.data(), data_.size());
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dev_.as<uint8_t>(), host_, data_.size(), cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }
  template <typename T>
  T* At(size_t off) const {
    return reinterpret_cast<T*>(dev_.as<uint8_t>() + off);
  }
  void Clear() { data_.clear(); }

 private:
  std::vector<uint8_t> data_;
  uint8_t* host_ = nullptr;
  size_t host_bytes_ = 0;
  Buf dev_;
};

// A second stream, with its own cuBLAS handle (and workspace), for work that can run beside the
// main stream's: Fork() makes it wait for everything enqueued on the main stream so far, Join()
// makes the main stream wait for everything enqueued on it. Eager and under graph capture alike
// (a capture follows the two events into parallel branches of one graph). It runs at the main
// stream's priority `main_priority`, or below it after BelowMain(true). Not thread-safe.
class SideStream {
 public:
  static absl::StatusOr<std::unique_ptr<SideStream>> Create(cudaStream_t main,
                                                            int main_priority = 0) {
    std::unique_ptr<SideStream> side(new SideStream(main));
    side->main_priority_ = main_priority;
    int highest = 0;  // numerically the smallest
    CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&side->lowest_priority_, &highest));
    CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithPriority(&side->stream_, cudaStreamNonBlocking, main_priority));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&side->fork_, cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&side->join_, cudaEventDisableTiming));
    ASSIGN_OR_RETURN(side->blas_, Cublas::Create(side->stream_));
    return side;
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    blas_ = Cublas();
    if (fork_ != nullptr) (void)cudaEventDestroy(fork_);
    if (join_ != nullptr) (void)cudaEventDestroy(join_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  absl::Status Fork() {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, main_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, fork_, 0));
    return absl::OkStatus();
  }
  absl::Status Join() {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(join_, stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main_, join_, 0));
    return absl::OkStatus();
  }
  // Work enqueued from now on runs at the device's lowest priority (`below`) or at the main
  // stream's: when both streams' blocks wait for an SM, the scheduler then starts the main
  // stream's first. A graph captured from the streams keeps what was set during its capture.
  absl::Status BelowMain(bool below) {
    if (below == below_) return absl::OkStatus();
    cudaLaunchAttributeValue v{};
    v.priority = below ? lowest_priority_ : main_priority_;
    CUDA_RETURN_IF_ERROR(cudaStreamSetAttribute(stream_, cudaLaunchAttributePriority, &v));
    below_ = below;
    return absl::OkStatus();
  }
  cudaStream_t stream() const { return stream_; }
  const Cublas& blas() const { return blas_; }

 private:
  explicit SideStream(cudaStream_t main) : main_(main) {}
  cudaStream_t main_;
  int main_priority_ = 0;
  int lowest_priority_ = 0;  // the device's
  bool below_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  Cublas blas_;
};

// out[rows][w.out] (row stride ldc) = a[rows][w.in] (row stride lda) · wᵀ, bf16 or fp32 out.
inline absl::Status Linear(const Cublas& blas, const DeviceLinear& w, const __nv_bfloat16* a,
                           int64_t lda, int64_t rows, void* out, int64_t ldc, bool fp32 = false) {
  GemmArgs g;
  g.m = rows;
  g.n = w.out;
  g.k = w.in;
  g.trans_b = true;
  g.a = a;
  g.lda = lda;
  g.b = w.w;
  g.ldb = w.in;
  g.c = out;
  g.ldc = ldc;
  g.c_fp32 = fp32;
  return blas.Gemm(g);
}

// In place over fused gate|up rows [rows][2 inter]: the first half becomes SiLU(gate) * up.
inline absl::Status SiluMulRows(int64_t rows, int64_t inter, __nv_bfloat16* gate_up,
                                cudaStream_t stream) {
  kernels::SiluMulParams p;
  p.rows = static_cast<int>(rows);
  p.dim = static_cast<int>(inter);
  p.gate = gate_up;
  p.ld_gate = 2 * inter;
  p.up = gate_up + inter;
  p.ld_up = 2 * inter;
  p.out = gate_up;
  p.ld_out = 2 * inter;
  return kernels::LaunchSiluMul(p, stream);
}

// Up to this many rows, bf16 projections and MLPs run on the bandwidth-bound kernels of
// kernels/moe_experts (each weight row read once, one pass); above it, cuBLAS.
inline constexpr int64_t kSkinnyMaxRows = 16;

// bf16 out[rows][w.out] (row stride ldc) = a[rows][w.in] (row stride lda) · wᵀ. With norm_in set
// (one row), the row is formed from that norm by the projection's kernel and `a` is not read.
inline absl::Status LinearBf16(const Cublas& blas, cudaStream_t stream, const DeviceLinear& w,
                               const __nv_bfloat16* a, int64_t lda, int64_t rows,
                               __nv_bfloat16* out, int64_t ldc,
                               const kernels::MoeNormIn& norm_in = {}) {
  if (rows <= kSkinnyMaxRows && lda == w.in && ldc == w.out) {
    kernels::SkinnyGemmParams p;
    p.norm_in = norm_in;
    p.tokens = static_cast<int>(rows);
    p.n_out = static_cast<int>(w.out);
    p.k = static_cast<int>(w.in);
    p.x = a;
    p.w = w.w;
    p.out = out;
    p.weights_static = true;  // model weights
    return kernels::LaunchSkinnyGemm(p, stream);
  }
  if (norm_in.params.rows != 0)
    return absl::InternalError("LinearBf16: norm_in on the cuBLAS path");
  return Linear(blas, w, a, lda, rows, out, ldc);
}

// out[rows][H] = down · (SiLU(gate · a) * (up · a)) for a fused gate|up [2I][H] and down [H][I],
// a [rows][H] dense; act is a [rows][2I] workspace.
inline absl::Status Mlp(const Cublas& blas, cudaStream_t stream, const DeviceLinear& gate_up,
                        const DeviceLinear& down, const __nv_bfloat16* a, int64_t rows,
                        __nv_bfloat16* act, __nv_bfloat16* out) {
  const int64_t h = gate_up.in, inter = down.in;
  if (rows <= kSkinnyMaxRows) {
    kernels::MoeExpertsParams p;
    p.num_tokens = static_cast<int>(rows);
    p.num_experts = 1;
    p.max_active = 1;
    p.hidden = static_cast<int>(h);
    p.inter = static_cast<int>(inter);
    p.token_tiles = rows <= 8 ? 1 : 2;
    p.identity = true;
    p.x = a;
    p.ld_x = h;
    p.weights = gate_up.w;
    p.down = down.w;
    p.act = act;
    p.out = out;
    p.weights_static = true;  // model weights
    return kernels::LaunchMoeExperts(p, stream);
  }
  RETURN_IF_ERROR(Linear(blas, gate_up, a, h, rows, act, 2 * inter));
  RETURN_IF_ERROR(SiluMulRows(rows, inter, act, stream));
  return Linear(blas, down, act, 2 * inter, rows, out, h);
}

}  // namespace strata::cuda
