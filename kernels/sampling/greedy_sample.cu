// Greedy sampling: a cluster of up to 8 blocks per row (as many as the rows leave SMs for), each
// over its own slice; each thread keeps its first maximum over a strided scan (16-byte loads when
// the row allows), a warp and a block reduction take the larger value, ties to the lower index,
// and rank 0 merges the blocks' answers through distributed shared memory in rank (= index)
// order. One 512-thread block per row took ~17 us for a 102400-token row at batch 1.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "kernels/sampling/greedy_sample.h"
#include "kernels/sampling/row_clusters.cuh"

namespace strata::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;

__device__ __forceinline__ void Take(float& v, int& i, float w, int j) {
  if (w > v || (w == v && j < i)) {
    v = w;
    i = j;
  }
}

// Blocks of one row: `per` elements (a multiple of 4) each.
__global__ void __launch_bounds__(kThreads) GreedySampleKernel(GreedySampleParams p, int per) {
  __shared__ float s_v[kThreads / 32];
  __shared__ int s_i[kThreads / 32];
  __shared__ float block_v;
  __shared__ int block_i;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  const int r = blockIdx.x / ranks;
  const float* row = p.logits + static_cast<int64_t>(r) * p.ld_logits;
  const int lo = min(p.vocab, static_cast<int>(rank) * per), hi = min(p.vocab, lo + per);
  float v = -INFINITY;
  int i = 0x7fffffff;
  const bool vec = reinterpret_cast<uintptr_t>(row + lo) % 16 == 0;
  const int whole = vec ? lo + (hi - lo) / 4 * 4 : lo;
  for (int j = lo + 4 * threadIdx.x; j < whole; j += 4 * kThreads) {
    const float4 q = *reinterpret_cast<const float4*>(row + j);
    Take(v, i, q.x, j);
    Take(v, i, q.y, j + 1);
    Take(v, i, q.z, j + 2);
    Take(v, i, q.w, j + 3);
  }
  for (int j = whole + threadIdx.x; j < hi; j += kThreads) Take(v, i, row[j], j);
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
    if (lane == 0) {
      block_v = v;
      block_i = i;
    }
  }
  cluster.sync();
  if (rank == 0 && threadIdx.x == 0) {
    v = -INFINITY;
    i = 0x7fffffff;
    for (unsigned q = 0; q < ranks; ++q) {
      Take(v, i, *cluster.map_shared_rank(&block_v, q), *cluster.map_shared_rank(&block_i, q));
    }
    // A row of only -inf (or NaN) keeps no candidate: answer 0, as std::max_element would.
    p.tokens[r] = i < p.vocab ? i : 0;
  }
  cluster.sync();  // no block leaves while rank 0 may still read its answer
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
  const absl::StatusOr<sampling_detail::RowClusters> c =
      sampling_detail::PlanRowClusters("LaunchGreedySample: ", params.rows, params.vocab,
                                       kThreads, GreedySampleKernel);
  if (!c.ok()) return c.status();
  return sampling_detail::LaunchRowClusters("LaunchGreedySample: ", *c, params.rows, kThreads,
                                            stream, GreedySampleKernel, params, c->per);
}

}  // namespace strata::kernels
