// Token sampling without sorting: one block per row finds, by radix selection over the logits'
// order-preserving 32-bit keys, the thresholds the sorted walk of the CPU rule would stop at.
// Each selection is three passes over the row (digits of 11, 11 and 10 bits) that histogram the
// candidates below the prefix found so far by count or by probability mass, in double.
//   1. max (and the first maximum: greedy rows stop here);
//   2. top-k: the k-th largest key `kth` (counts); the top-k set is every key above it plus the
//      first (k - above) indices at it (a tie group: equal logits, equal probabilities);
//   3. the softmax sum over that set;
//   4. top-p: the key at which the sorted running mass first reaches top_p x sum, and how many
//      of its tie group the prefix takes; that prefix's mass `kept`;
//   5. the key at which the running mass first exceeds uniform x kept, the position t within its
//      tie group, and the t-th lowest index holding that key.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "kernels/sampling/sample.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;  // 11-bit digits
// Digit `pass` of a key: bits [21, 32), [10, 21), [0, 10).
__device__ __forceinline__ int DigitShift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ int DigitBits(int pass) { return pass == 2 ? 10 : 11; }

// Larger float, larger key; -0.0 and +0.0 share one key (the CPU's comparison holds them equal).
__device__ __forceinline__ uint32_t Key(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float Value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

struct Shared {
  uint32_t count[kBins];
  double mass[kBins];
  union {
    cub::BlockScan<double, kThreads>::TempStorage scan;
    cub::BlockReduce<double, kThreads>::TempStorage reduce;
    cub::BlockScan<int, kThreads>::TempStorage iscan;
  } tmp;
  float max_value;
  int max_index;
  // Passed between the threads of a selection pass.
  uint32_t lowest_bin;  // the lowest nonempty bin (a target past the total)
  double above;         // weight of the candidates above the chosen bin (also: the softmax sum)
  int found;            // the chosen bin, or index
};

// Where a running sum over the candidates, in descending key order, meets `target`.
struct Crossing {
  uint32_t key;    // the key of the element at which it happens
  double above;    // weight of the candidates with larger keys
  uint32_t count;  // candidates holding `key`
};

class Row {
 public:
  __device__ Row(const float* logits, int vocab, Shared& sh) : l_(logits), v_(vocab), sh_(sh) {}

  __device__ double Weight(float x, double mx, double t) const {
    return exp((static_cast<double>(x) - mx) / t);  // as the CPU computes it
  }

  // fn(j, x) for every element, each thread taking 4 consecutive ones at a time (one 16-byte
  // load when the row allows it): four loads in flight per thread instead of one.
  template <typename Fn>
  __device__ void ForEach(Fn fn) const {
    const bool vec = reinterpret_cast<uintptr_t>(l_) % 16 == 0;
    const int whole = vec ? v_ / 4 * 4 : 0;
    for (int j = 4 * threadIdx.x; j < whole; j += 4 * kThreads) {
      const float4 q = *reinterpret_cast<const float4*>(l_ + j);
      fn(j, q.x);
      fn(j + 1, q.y);
      fn(j + 2, q.z);
      fn(j + 3, q.w);
    }
    for (int j = whole + threadIdx.x; j < v_; j += kThreads) fn(j, l_[j]);
  }

  // Candidates: keys above `floor` (all of them), plus `floor_count` elements at `floor` (a tie
  // group cut by top-k or top-p; each weighs `floor_weight`). `by_mass`: weights are
  // probabilities exp((x - mx) / t), else 1 each. `inclusive`: the crossing is where the running
  // sum first reaches `target` (>=), else where it first exceeds it (>). A target past the total
  // (rounding) lands on the last candidate, as the CPU's walk falls back to it.
  __device__ Crossing Select(double target, bool inclusive, bool by_mass, uint32_t floor,
                             uint32_t floor_count, double floor_weight, double mx, double t) {
    uint32_t prefix = 0, mask = 0;
    double above = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = DigitShift(pass);
      const uint32_t digit_mask = (1u << DigitBits(pass)) - 1;
      for (int b = threadIdx.x; b < kBins; b += kThreads) {
        sh_.count[b] = 0;
        sh_.mass[b] = 0;
      }
      __syncthreads();
      ForEach([&](int, float x) {
        const uint32_t k = Key(x);
        if (k <= floor || (k & mask) != prefix) return;
        const uint32_t d = (k >> shift) & digit_mask;
        atomicAdd(&sh_.count[d], 1u);
        if (by_mass) atomicAdd(&sh_.mass[d], Weight(x, mx, t));
      });
      __syncthreads();
      // Bins from the largest digit down: thread i holds bins hi = top - 2i and hi - 1.
      const int top = static_cast<int>(digit_mask);
      const int b0 = top - 2 * static_cast<int>(threadIdx.x), b1 = b0 - 1;
      auto w = [&](int b) {
        return b < 0 ? 0.0 : by_mass ? sh_.mass[b] : static_cast<double>(sh_.count[b]);
      };
      const double w0 = w(b0), w1 = w(b1);
      double excl, total;
      cub::BlockScan<double, kThreads>(sh_.tmp.scan).ExclusiveSum(w0 + w1, excl, total);
      if (threadIdx.x == 0) sh_.found = -1;
      __syncthreads();
      const double rel = target - above;
      auto crosses = [&](double before, double weight) {
        return weight > 0 && (inclusive ? before < rel && rel <= before + weight
                                        : before <= rel && rel < before + weight);
      };
      if (b0 >= 0 && crosses(excl, w0)) {
        sh_.found = b0;
        sh_.above = above + excl;
      } else if (b1 >= 0 && crosses(excl + w0, w1)) {
        sh_.found = b1;
        sh_.above = above + excl + w0;
      }
      __syncthreads();
      if (sh_.found < 0) {
        if (pass == 0 && floor_count > 0) {  // past everything above the floor: its tie group
          return {floor, above + total, floor_count};
        }
        // Past the total (rounding): the last candidate of this range, the lowest nonempty bin.
        if (threadIdx.x == 0) sh_.lowest_bin = 0xffffffffu;
        __syncthreads();
        if (b0 >= 0 && w0 > 0) atomicMin(&sh_.lowest_bin, static_cast<uint32_t>(b0));
        if (b1 >= 0 && w1 > 0) atomicMin(&sh_.lowest_bin, static_cast<uint32_t>(b1));
        __syncthreads();
        if (threadIdx.x == 0) {
          // No candidate at all cannot happen (the maximum is one); stay in range regardless.
          sh_.found = sh_.lowest_bin == 0xffffffffu ? 0 : static_cast<int>(sh_.lowest_bin);
          sh_.above = above + total - w(sh_.found);
        }
        __syncthreads();
      }
      const int d = sh_.found;
      above = sh_.above;
      const uint32_t at_count = sh_.count[d];
      prefix |= static_cast<uint32_t>(d) << shift;
      mask |= digit_mask << shift;
      __syncthreads();  // everyone has read the bins before the next pass clears them
      if (pass == 2) return {prefix, above, at_count};
    }
    return {};  // not reached
  }

  // The `t`-th lowest index holding `key` (t < the number of them): each thread counts the
  // key in its own contiguous stretch of the row, one scan of the counts finds the stretch
  // holding the t-th, and its thread walks it.
  __device__ int IndexOf(uint32_t key, uint32_t t) {
    const int per = (v_ + kThreads - 1) / kThreads;
    const int lo = min(v_, static_cast<int>(threadIdx.x) * per), hi = min(v_, lo + per);
    int mine = 0;
    for (int j = lo; j < hi; ++j) mine += Key(l_[j]) == key;
    int before, total;
    __syncthreads();
    if (threadIdx.x == 0) sh_.found = v_ - 1;  // not reached for a key held more than t times
    cub::BlockScan<int, kThreads>(sh_.tmp.iscan).ExclusiveSum(mine, before, total);
    __syncthreads();
    if (static_cast<uint32_t>(before) <= t && t < static_cast<uint32_t>(before + mine)) {
      int seen = before;
      for (int j = lo; j < hi; ++j) {
        if (Key(l_[j]) != key) continue;
        if (static_cast<uint32_t>(seen++) == t) {
          sh_.found = j;
          break;
        }
      }
    }
    __syncthreads();
    return sh_.found;
  }

 private:
  const float* l_;
  int v_;
  Shared& sh_;
};

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const float* logits = p.logits + static_cast<int64_t>(r) * p.ld_logits;
  const SampleRowDraw d = p.draws[r];
  Row row(logits, p.vocab, sh);

  // 1. The maximum and its first index.
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  row.ForEach([&](int j, float x) {
    if (x > best || (x == best && j < best_i)) best = x, best_i = j;
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
  }
  __shared__ float warp_best[kThreads / 32];
  __shared__ int warp_index[kThreads / 32];
  if (threadIdx.x % 32 == 0) {
    warp_best[threadIdx.x / 32] = best;
    warp_index[threadIdx.x / 32] = best_i;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    best = warp_best[threadIdx.x];
    best_i = warp_index[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
    }
    if (threadIdx.x == 0) {
      sh.max_value = best;
      sh.max_index = best_i < p.vocab ? best_i : 0;  // a row of -inf or NaN: index 0
    }
  }
  __syncthreads();
  if (d.temperature <= 0.0f || d.top_k == 1) {  // greedy
    if (threadIdx.x == 0) p.tokens[r] = sh.max_index;
    return;
  }
  const double mx = sh.max_value;
  const double t = d.temperature;

  // 2. top-k: the candidates are keys above `floor`, plus `floor_count` at it.
  const int k = d.top_k > 0 ? min(d.top_k, p.vocab) : p.vocab;
  uint32_t floor_key = 0, floor_count = 0;
  if (k < p.vocab) {
    const Crossing c = row.Select(k, /*inclusive=*/true, /*by_mass=*/false, 0, 0, 0, mx, t);
    floor_key = c.key;
    floor_count = static_cast<uint32_t>(k - static_cast<int>(c.above));
  }
  double floor_weight = floor_count > 0 ? row.Weight(Value(floor_key), mx, t) : 0.0;

  // 3. The softmax sum over the top-k set.
  double part = 0;
  row.ForEach([&](int, float x) {
    if (Key(x) > floor_key) part += row.Weight(x, mx, t);
  });
  __syncthreads();
  const double above_sum = cub::BlockReduce<double, kThreads>(sh.tmp.reduce).Sum(part);
  if (threadIdx.x == 0) sh.above = above_sum + floor_count * floor_weight;
  __syncthreads();
  const double sum = sh.above;
  __syncthreads();

  // 4. top-p: the prefix reaching top_p x sum; it becomes the candidate set.
  double kept = sum;
  if (d.top_p < 1.0f) {
    const Crossing c = row.Select(static_cast<double>(d.top_p) * sum, /*inclusive=*/true,
                                  /*by_mass=*/true, floor_key, floor_count, floor_weight, mx, t);
    const double w = row.Weight(Value(c.key), mx, t);
    const double need = static_cast<double>(d.top_p) * sum - c.above;
    uint32_t take = static_cast<uint32_t>(fmax(1.0, ceil(need / w)));
    if (take > c.count) take = c.count;
    floor_key = c.key;
    floor_count = take;
    floor_weight = w;
    kept = c.above + take * w;
  }

  // 5. The element where the running mass exceeds uniform x kept, then its index.
  const double x = d.uniform * kept;
  const Crossing c = row.Select(x, /*inclusive=*/false, /*by_mass=*/true, floor_key, floor_count,
                                floor_weight, mx, t);
  const double w = row.Weight(Value(c.key), mx, t);
  const double pos = ::floor((x - c.above) / w);
  const uint32_t at = pos <= 0 ? 0u : static_cast<uint32_t>(fmin(pos, c.count - 1.0));
  const int index = row.IndexOf(c.key, at);
  if (threadIdx.x == 0) p.tokens[r] = index;
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchSample: " + what);
}

}  // namespace

absl::Status ValidateSampleParams(const SampleParams& p) {
  if (p.rows < 0) return Invalid("rows must be >= 0");
  if (p.vocab <= 0) return Invalid("vocab must be positive");
  if (p.ld_logits < p.vocab) return Invalid("ld_logits < vocab");
  if (p.logits == nullptr || p.draws == nullptr || p.tokens == nullptr) {
    return Invalid("logits, draws and tokens must be set");
  }
  return absl::OkStatus();
}

absl::Status LaunchSample(const SampleParams& p, cudaStream_t stream) {
  if (absl::Status st = ValidateSampleParams(p); !st.ok()) return st;
  if (p.rows == 0) return absl::OkStatus();
  SampleKernel<<<p.rows, kThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchSample: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
