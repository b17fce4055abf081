// Greedy sampling: one block per row; each thread keeps its first maximum over a strided scan,
// then a warp and a block reduction take the larger value, ties to the lower index.
#include <string>

#include "kernels/sampling/greedy_sample.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void Take(float& v, int& i, float w, int j) {
  if (w > v || (w == v && j < i)) {
    v = w;
    i = j;
  }
}

__global__ void __launch_bounds__(kThreads) GreedySampleKernel(GreedySampleParams p) {
  __shared__ float s_v[kThreads / 32];
  __shared__ int s_i[kThreads / 32];
  const float* row = p.logits + static_cast<int64_t>(blockIdx.x) * p.ld_logits;
  float v = -INFINITY;
  int i = 0x7fffffff;
  for (int j = threadIdx.x; j < p.vocab; j += kThreads) Take(v, i, row[j], j);
  for (int o = 16; o > 0; o >>= 1) {
    Take(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? s_v[lane] : -INFINITY;
    i = lane < kThreads / 32 ? s_i[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      Take(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    }
    // A row of only -inf (or NaN) keeps no candidate: answer 0, as std::max_element would.
    if (lane == 0) p.tokens[blockIdx.x] = i < p.vocab ? i : 0;
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchGreedySample: " + what);
}

}  // namespace

absl::Status ValidateGreedySampleParams(const GreedySampleParams& p) {
  if (p.rows < 0 || p.rows > 0x7fffffff) return Invalid("rows must be >= 0");
  if (p.vocab <= 0) return Invalid("vocab must be positive");
  if (p.ld_logits < p.vocab) return Invalid("ld_logits < vocab");
  if (p.logits == nullptr || p.tokens == nullptr) return Invalid("logits and tokens must be set");
  return absl::OkStatus();
}

absl::Status LaunchGreedySample(const GreedySampleParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateGreedySampleParams(params); !st.ok()) return st;
  if (params.rows == 0) return absl::OkStatus();
  GreedySampleKernel<<<params.rows, kThreads, 0, stream>>>(params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchGreedySample: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
