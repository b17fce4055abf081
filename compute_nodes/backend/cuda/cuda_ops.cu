#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "kernels/common/pdl.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 32;

unsigned Blocks(int64_t work) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (work + kThreads - 1) / kThreads)));
}

absl::Status LaunchError(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename Index>
__global__ void GatherRowsKernel(const __nv_bfloat16* src, int64_t src_ld, const Index* idx,
                                 int64_t rows, int64_t width, __nv_bfloat16* dst, int64_t dst_ld) {
  kernels::PdlGridSync();
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    dst[r * dst_ld + c] = src[static_cast<int64_t>(idx[r]) * src_ld + c];
  }
}

__global__ void ScatterRowsKernel(const __nv_bfloat16* src, int64_t src_ld, const int64_t* idx,
                                  int64_t rows, int64_t width, __nv_bfloat16* dst, int64_t dst_ld) {
  kernels::PdlGridSync();
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    dst[idx[r] * dst_ld + c] = src[r * src_ld + c];
  }
}

// One (row, head) lane group per thread group, V elements (16 bytes for V = 8) per thread; rows
// stride over grid.y so that the per-row index math stays 32-bit.
template <int V>
__global__ void CopyHeadsKernel(CopyHeadsParams p) {
  using Vec = std::conditional_t<V == 8, uint4, __nv_bfloat16>;
  kernels::PdlGridSync();
  const int lanes = static_cast<int>(p.dst_width / V), width = static_cast<int>(p.width / V);
  const int per_row = static_cast<int>(p.heads) * lanes;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= per_row) return;
  const int h = i / lanes, j = i % lanes;
  Vec zero;
  if constexpr (V == 8) {
    zero = make_uint4(0, 0, 0, 0);
  } else {
    zero = __float2bfloat16(0.f);
  }
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const Vec v =
        j < width ? reinterpret_cast<const Vec*>(p.src + r * p.src_tok + h * p.src_head)[j] : zero;
    reinterpret_cast<Vec*>(p.dst + r * p.dst_tok + h * p.dst_head)[j] = v;
  }
}

__global__ void TransposeBatchedKernel(const __nv_bfloat16* src, int64_t src_batch_stride,
                                       int64_t batch, int64_t rows, int64_t cols,
                                       __nv_bfloat16* dst) {
  const int64_t total = batch * rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i % rows, c = (i / rows) % cols, b = i / (rows * cols);
    dst[i] = src[b * src_batch_stride + r * cols + c];
  }
}

__device__ uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void FillRandomKernel(__nv_bfloat16* dst, int64_t n, int kind, float stddev,
                                 uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t a = Mix(seed * 0x9e3779b97f4a7c15ull + 2 * static_cast<uint64_t>(i) + 1);
    const uint64_t b = Mix(a + 0x632be59bd9b4e019ull);
    const float u1 = (static_cast<float>(a >> 40) + 0.5f) * (1.f / 16777216.f);
    const float u2 = (static_cast<float>(b >> 40) + 0.5f) * (1.f / 16777216.f);
    float v;
    if (kind == 1) {
      v = 1.f + 0.2f * (u1 - 0.5f);
    } else if (kind == 2) {
      v = 0.15f * u1;
    } else {
      v = stddev * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    }
    dst[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

absl::Status GatherRows(const __nv_bfloat16* src, int64_t src_ld, const int64_t* idx, int64_t rows,
                        int64_t width, __nv_bfloat16* dst, int64_t dst_ld, cudaStream_t stream) {
  if (rows * width == 0) return absl::OkStatus();
  (void)kernels::LaunchPdl(GatherRowsKernel<int64_t>, dim3(Blocks(rows * width)), dim3(kThreads), 0,
                           stream, src, src_ld, idx, rows, width, dst, dst_ld);
  return LaunchError("GatherRows");
}

absl::Status GatherRows32(const __nv_bfloat16* src, int64_t src_ld, const int32_t* idx,
                          int64_t rows, int64_t width, __nv_bfloat16* dst, int64_t dst_ld,
                          cudaStream_t stream) {
  if (rows * width == 0) return absl::OkStatus();
  (void)kernels::LaunchPdl(GatherRowsKernel<int32_t>, dim3(Blocks(rows * width)), dim3(kThreads), 0,
                           stream, src, src_ld, idx, rows, width, dst, dst_ld);
  return LaunchError("GatherRows32");
}

absl::Status ScatterRows(const __nv_bfloat16* src, int64_t src_ld, const int64_t* idx, int64_t rows,
                         int64_t width, __nv_bfloat16* dst, int64_t dst_ld, cudaStream_t stream) {
  if (rows * width == 0) return absl::OkStatus();
  (void)kernels::LaunchPdl(ScatterRowsKernel, dim3(Blocks(rows * width)), dim3(kThreads), 0, stream,
                           src, src_ld, idx, rows, width, dst, dst_ld);
  return LaunchError("ScatterRows");
}

absl::Status CopyHeads(const CopyHeadsParams& p, cudaStream_t stream) {
  if (p.rows * p.heads * p.dst_width == 0) return absl::OkStatus();
  if (p.width > p.dst_width) return absl::InvalidArgumentError("CopyHeads: width > dst_width");
  if (p.heads * p.dst_width > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("CopyHeads: heads * dst_width past 2^30");
  }
  const auto aligned = [](int64_t v) { return v % 8 == 0; };
  const bool vec = aligned(p.width) && aligned(p.dst_width) && aligned(p.src_tok) &&
                   aligned(p.src_head) && aligned(p.dst_tok) && aligned(p.dst_head) &&
                   reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.dst) % 16 == 0;
  const int64_t per_row = p.heads * p.dst_width / (vec ? 8 : 1);
  const dim3 grid(static_cast<unsigned>((per_row + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, 8192)));
  (void)kernels::LaunchPdl(vec ? CopyHeadsKernel<8> : CopyHeadsKernel<1>, grid, dim3(kThreads), 0,
                           stream, p);
  return LaunchError("CopyHeads");
}

absl::Status TransposeBatched(const __nv_bfloat16* src, int64_t src_batch_stride, int64_t batch,
                              int64_t rows, int64_t cols, __nv_bfloat16* dst, cudaStream_t stream) {
  const int64_t total = batch * rows * cols;
  if (total == 0) return absl::OkStatus();
  TransposeBatchedKernel<<<Blocks(total), kThreads, 0, stream>>>(src, src_batch_stride, batch, rows,
                                                                 cols, dst);
  return LaunchError("TransposeBatched");
}

absl::Status FillRandomBf16(__nv_bfloat16* dst, int64_t n, int kind, float stddev, uint64_t seed,
                            cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  FillRandomKernel<<<Blocks(n), kThreads, 0, stream>>>(dst, n, kind, stddev, seed);
  return LaunchError("FillRandomBf16");
}

}  // namespace strata::cuda
