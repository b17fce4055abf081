// Token sampling without sorting: a cluster of blocks per row (up to 8, each over its own slice of
// the row) finds, by radix selection over the logits' order-preserving 32-bit keys, the
// thresholds the sorted walk of the CPU rule would stop at. Every block builds the histogram of
// its slice; after a cluster barrier each block sums the cluster's histograms through distributed
// shared memory, in rank order, so every block sees the same numbers and takes the same decision
// (a second barrier keeps a histogram in place until every block has read it). One block per row
// was instruction-bound on its one SM: ~670 us for a 102400-token row, on 1 of 132 SMs at batch 1.
// Each selection is three passes over the row (digits of 11, 11 and 10 bits) that histogram the
// candidates below the prefix found so far by count or by probability mass, in double.
//   1. max (and the first maximum: greedy rows stop here);
//   2. top-k: the k-th largest key `kth` (counts); the top-k set is every key above it plus the
//      first (k - above) indices at it (a tie group: equal logits, equal probabilities);
//   3. top-p: the key at which the sorted running mass first reaches top_p x sum (the softmax sum
//      over that set: the total of the selection's first histogram), and how many of its tie
//      group the prefix takes; that prefix's mass `kept`;
//   4. the key at which the running mass first exceeds uniform x kept (x sum without top-p), the
//      position t within its tie group, and the t-th lowest index holding that key.
#include <cooperative_groups.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <string>

#include "kernels/sampling/row_clusters.cuh"
#include "kernels/sampling/sample.h"

namespace strata::kernels {
namespace {

namespace cg = cooperative_groups;

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
  // Two histograms, passes alternating between them: a pass clears the one the pass before the
  // last used, which every block has read by the time it passed the last pass's cluster barrier,
  // so one barrier per pass (after the histograms are built) orders it.
  uint32_t count[2][kBins];
  double mass[2][kBins];
  union {
    cub::BlockScan<double, kThreads>::TempStorage scan;
    cub::BlockScan<int, kThreads>::TempStorage iscan;
  } tmp;
  // Read by the other blocks of the cluster: this block's maximum and count of a key (IndexOf);
  // rank 0's also takes the picked index.
  float block_max;
  int block_max_index;
  int block_key_count;
  int picked;
  // The row's (merged) values, and what passes between the threads of one block.
  float max_value;
  int max_index;
  uint32_t lowest_bin;   // the lowest nonempty bin (a target past the total)
  double step;           // weight of the candidates above the chosen bin (within the prefix)
  int found;             // the chosen bin, or index
  uint32_t found_count;  // candidates in the chosen bin
  int key_base;          // IndexOf: the key's holders in the lower-ranked blocks
};

// A selection's first histogram, as one thread holds it (its two bins, merged over the cluster),
// and where that selection went from it. The draw after a top-p cut reads its own first level
// from the cut's: the bins above the cut's first bin as they are, that bin's part above the cut's
// key from the cut's later passes, nothing below it; one pass over the row less.
struct FirstLevel {
  uint32_t c0, c1;
  double m0, m1;
  int bin;        // the bin the selection refined; -1 when it stopped at the floor's tie group
  double within;  // weight of the candidates in `bin` above the selection's crossing key
};

// Where a running sum over the candidates, in descending key order, meets `target`.
struct Crossing {
  uint32_t key;    // the key of the element at which it happens
  double above;    // weight of the candidates with larger keys
  uint32_t count;  // candidates holding `key`
  double total;    // weight of all the candidates (the floor's tie group included)
  double target;   // the running sum it was to meet
};

class Row {
 public:
  // This block's slice [lo, hi) of a `vocab`-element row.
  __device__ Row(const float* logits, int vocab, int lo, int hi, Shared& sh)
      : l_(logits), v_(vocab), lo_(lo), hi_(hi), sh_(sh), cluster_(cg::this_cluster()) {}

  __device__ double Weight(float x, double mx, double t) const {
    return exp((static_cast<double>(x) - mx) / t);  // as the CPU computes it
  }

  __device__ Shared& at_rank(unsigned rank) { return *cluster_.map_shared_rank(&sh_, rank); }

  // fn(j, x) for every element of the slice, each thread taking 4 consecutive ones at a time
  // (one 16-byte load when the row allows it): four loads in flight per thread instead of one.
  template <typename Fn>
  __device__ void ForEach(Fn fn) const {
    const bool vec = reinterpret_cast<uintptr_t>(l_ + lo_) % 16 == 0;
    const int whole = vec ? lo_ + (hi_ - lo_) / 4 * 4 : lo_;
    for (int j = lo_ + 4 * threadIdx.x; j < whole; j += 4 * kThreads) {
      const float4 q = *reinterpret_cast<const float4*>(l_ + j);
      fn(j, q.x);
      fn(j + 1, q.y);
      fn(j + 2, q.z);
      fn(j + 3, q.w);
    }
    for (int j = whole + threadIdx.x; j < hi_; j += kThreads) fn(j, l_[j]);
  }

  // Candidates: keys above `floor` (all of them), plus `floor_count` elements at `floor` (a tie
  // group cut by top-k or top-p; each weighs `floor_weight`). `by_mass`: weights are
  // probabilities exp((x - mx) / t), else 1 each. The target is `base` + `fraction` x the
  // candidates' total weight (known after the first pass's histogram, so the softmax sum needs no
  // pass of its own). `inclusive`: the crossing is where the running sum first reaches the target
  // (>=), else where it first exceeds it (>). A target past the total (rounding) lands on the last
  // candidate, as the CPU's walk falls back to it. `keep`: this selection's first level is
  // recorded there. `reuse` (a by-mass selection whose floor is the recording selection's
  // crossing, `floor_count` of its tie group): the first level is derived from it, no pass.
  __device__ Crossing Select(double base, double fraction, bool inclusive, bool by_mass,
                             uint32_t floor, uint32_t floor_count, double floor_weight, double mx,
                             double t, FirstLevel* keep = nullptr,
                             const FirstLevel* reuse = nullptr) {
    uint32_t prefix = 0, mask = 0;
    double above = 0, target = 0, candidates = 0, within = 0;
    const unsigned ranks = cluster_.num_blocks();
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = DigitShift(pass);
      const uint32_t digit_mask = (1u << DigitBits(pass)) - 1;
      // Bins from the largest digit down: thread i holds bins hi = top - 2i and hi - 1, summed
      // over the cluster's blocks in rank order.
      const int top = static_cast<int>(digit_mask);
      const int b0 = top - 2 * static_cast<int>(threadIdx.x), b1 = b0 - 1;
      uint32_t c0 = 0, c1 = 0;
      double m0 = 0, m1 = 0;
      const bool derived = pass == 0 && reuse != nullptr;
      if (derived) {
        // Above the recorded bin as recorded, at it the part above the old crossing, below it
        // nothing (the counts there are not read: a by-mass selection goes on to pass 1).
        auto part = [&](int b, uint32_t c, double m, uint32_t& co, double& mo) {
          co = reuse->bin < 0 || b > reuse->bin ? c : 0;
          mo = reuse->bin < 0 || b > reuse->bin ? m : b == reuse->bin ? reuse->within : 0.0;
        };
        part(b0, reuse->c0, reuse->m0, c0, m0);
        part(b1, reuse->c1, reuse->m1, c1, m1);
      } else {
        const int h = buf_;
        buf_ ^= 1;
        for (int b = threadIdx.x; b < kBins; b += kThreads) {
          sh_.count[h][b] = 0;
          sh_.mass[h][b] = 0;
        }
        __syncthreads();
        ForEach([&](int, float x) {
          const uint32_t k = Key(x);
          if (k <= floor || (k & mask) != prefix) return;
          const uint32_t d = (k >> shift) & digit_mask;
          atomicAdd(&sh_.count[h][d], 1u);
          if (by_mass) atomicAdd(&sh_.mass[h][d], Weight(x, mx, t));
        });
        cluster_.sync();  // every block's histogram is complete
#pragma unroll 8          // the cluster's blocks (up to 8): their loads in flight together
        for (unsigned r = 0; r < ranks; ++r) {
          const Shared& o = at_rank(r);
          if (b0 >= 0) c0 += o.count[h][b0], m0 += o.mass[h][b0];
          if (b1 >= 0) c1 += o.count[h][b1], m1 += o.mass[h][b1];
        }
      }
      if (pass == 0 && keep != nullptr) *keep = {c0, c1, m0, m1, -1, 0.0};
      const double w0 = by_mass ? m0 : c0, w1 = by_mass ? m1 : c1;
      double excl, total;
      cub::BlockScan<double, kThreads>(sh_.tmp.scan).ExclusiveSum(w0 + w1, excl, total);
      if (pass == 0) {
        candidates = total + floor_count * (by_mass ? floor_weight : 1.0);
        target = base + fraction * candidates;
      }
      if (threadIdx.x == 0) sh_.found = -1;
      __syncthreads();
      const double rel = target - above;
      auto crosses = [&](double before, double weight) {
        return weight > 0 && (inclusive ? before < rel && rel <= before + weight
                                        : before <= rel && rel < before + weight);
      };
      if (b0 >= 0 && crosses(excl, w0)) {
        sh_.found = b0;
        sh_.found_count = c0;
        sh_.step = excl;
      } else if (b1 >= 0 && crosses(excl + w0, w1)) {
        sh_.found = b1;
        sh_.found_count = c1;
        sh_.step = excl + w0;
      }
      __syncthreads();
      if (sh_.found < 0) {
        if (pass == 0 && floor_count > 0) {  // past everything above the floor: its tie group
          return {floor, above + total, floor_count, candidates, target};
        }
        // Past the total (rounding): the last candidate of this range, the lowest nonempty bin.
        if (threadIdx.x == 0) sh_.lowest_bin = 0xffffffffu;
        __syncthreads();
        if (b0 >= 0 && w0 > 0) atomicMin(&sh_.lowest_bin, static_cast<uint32_t>(b0));
        if (b1 >= 0 && w1 > 0) atomicMin(&sh_.lowest_bin, static_cast<uint32_t>(b1));
        __syncthreads();
        // No candidate at all cannot happen (the maximum is one); stay in range regardless.
        const int lowest = sh_.lowest_bin == 0xffffffffu ? 0 : static_cast<int>(sh_.lowest_bin);
        if (b0 == lowest || b1 == lowest) {  // exactly one thread holds that bin
          sh_.found = lowest;
          sh_.found_count = b0 == lowest ? c0 : c1;
          sh_.step = total - (b0 == lowest ? w0 : w1);
        }
        __syncthreads();
      }
      const int d = sh_.found;
      above += sh_.step;
      if (pass > 0) within += sh_.step;
      const uint32_t at_count = sh_.found_count;
      prefix |= static_cast<uint32_t>(d) << shift;
      mask |= digit_mask << shift;
      if (pass == 0 && keep != nullptr) keep->bin = d;
      if (pass == 2) {
        if (keep != nullptr) keep->within = within;
        return {prefix, above, at_count, candidates, target};
      }
    }
    return {};  // not reached
  }

  // The row's `t`-th lowest index holding `key` (t < the number of them): each thread counts
  // the key in its own contiguous stretch of the slice, a scan of the counts (blocks in rank
  // order, then threads) finds the stretch holding the t-th, and its thread walks it. Rank 0's
  // block gets the index (`picked`).
  __device__ void IndexOf(uint32_t key, uint32_t t) {
    const int per = (hi_ - lo_ + kThreads - 1) / kThreads;
    const int lo = min(hi_, lo_ + static_cast<int>(threadIdx.x) * per), hi = min(hi_, lo + per);
    int mine = 0;
    for (int j = lo; j < hi; ++j) mine += Key(l_[j]) == key;
    int before, total;
    cub::BlockScan<int, kThreads>(sh_.tmp.iscan).ExclusiveSum(mine, before, total);
    if (threadIdx.x == 0) {
      sh_.block_key_count = total;
      sh_.picked = v_ - 1;  // not reached for a key held more than t times
    }
    cluster_.sync();
    if (threadIdx.x == 0) {
      int base = 0;
      for (unsigned r = 0; r < cluster_.block_rank(); ++r) base += at_rank(r).block_key_count;
      sh_.key_base = base;
    }
    __syncthreads();
    before += sh_.key_base;
    if (static_cast<uint32_t>(before) <= t && t < static_cast<uint32_t>(before + mine)) {
      int seen = before;
      for (int j = lo; j < hi; ++j) {
        if (Key(l_[j]) != key) continue;
        if (static_cast<uint32_t>(seen++) == t) {
          at_rank(0).picked = j;
          break;
        }
      }
    }
    cluster_.sync();
  }

 private:
  const float* l_;
  int v_, lo_, hi_;
  Shared& sh_;
  cg::cluster_group cluster_;
  int buf_ = 0;  // the histogram the next pass fills
};

// Blocks of one row: the row's slice of `per` elements (a multiple of 4) each.
__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p, int per) {
  extern __shared__ __align__(16) unsigned char smem[];  // 48 KB of histograms: dynamic
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
  const int r = blockIdx.x / ranks;
  const float* logits = p.logits + static_cast<int64_t>(r) * p.ld_logits;
  const SampleRowDraw d = p.draws[r];
  const int lo = min(p.vocab, static_cast<int>(rank) * per), hi = min(p.vocab, lo + per);
  Row row(logits, p.vocab, lo, hi, sh);

  // 1. The maximum and its first index: per block, then over the blocks in rank order (their
  // slices are in index order, so a tie keeps the lower index).
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
      sh.block_max = best;
      sh.block_max_index = best_i;
    }
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    best = -INFINITY;
    best_i = 0x7fffffff;
    for (unsigned q = 0; q < ranks; ++q) {
      const Shared& o = row.at_rank(q);
      if (o.block_max > best || (o.block_max == best && o.block_max_index < best_i)) {
        best = o.block_max;
        best_i = o.block_max_index;
      }
    }
    sh.max_value = best;
    sh.max_index = best_i < p.vocab ? best_i : 0;  // a row of -inf or NaN: index 0
  }
  __syncthreads();
  if (d.temperature <= 0.0f || d.top_k == 1) {  // greedy
    if (rank == 0 && threadIdx.x == 0) p.tokens[r] = sh.max_index;
    cluster.sync();  // no block leaves while another may still read its maximum
    return;
  }
  const double mx = sh.max_value;
  const double t = d.temperature;

  // 2. top-k: the candidates are keys above `floor`, plus `floor_count` at it.
  const int k = d.top_k > 0 ? min(d.top_k, p.vocab) : p.vocab;
  uint32_t floor_key = 0, floor_count = 0;
  if (k < p.vocab) {
    const Crossing c = row.Select(k, 0, /*inclusive=*/true, /*by_mass=*/false, 0, 0, 0, mx, t);
    floor_key = c.key;
    floor_count = static_cast<uint32_t>(k - static_cast<int>(c.above));
  }
  double floor_weight = floor_count > 0 ? row.Weight(Value(floor_key), mx, t) : 0.0;

  // 3. top-p: the prefix reaching top_p x the softmax sum over the top-k set (the selection's
  // first pass yields the sum); it becomes the candidate set, of mass `kept`.
  const bool cut = d.top_p < 1.0f;
  double kept = 0;
  FirstLevel first;  // the cut's first histogram, for the draw's
  if (cut) {
    const Crossing c = row.Select(0, d.top_p, /*inclusive=*/true, /*by_mass=*/true, floor_key,
                                  floor_count, floor_weight, mx, t, &first);
    const double w = row.Weight(Value(c.key), mx, t);
    const double need = c.target - c.above;
    uint32_t take = static_cast<uint32_t>(fmax(1.0, ceil(need / w)));
    if (take > c.count) take = c.count;
    floor_key = c.key;
    floor_count = take;
    floor_weight = w;
    kept = c.above + take * w;
  }

  // 4. The element where the running mass exceeds uniform x kept (without top-p: x the sum),
  // then its index.
  const Crossing c = row.Select(cut ? d.uniform * kept : 0, cut ? 0 : d.uniform,
                                /*inclusive=*/false, /*by_mass=*/true, floor_key, floor_count,
                                floor_weight, mx, t, nullptr, cut ? &first : nullptr);
  const double w = row.Weight(Value(c.key), mx, t);
  const double pos = ::floor((c.target - c.above) / w);
  const uint32_t at = pos <= 0 ? 0u : static_cast<uint32_t>(fmin(pos, c.count - 1.0));
  row.IndexOf(c.key, at);
  if (rank == 0 && threadIdx.x == 0) p.tokens[r] = sh.picked;
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
  const absl::StatusOr<sampling_detail::RowClusters> c = sampling_detail::PlanRowClusters(
      "LaunchSample: ", p.rows, p.vocab, kThreads, SampleKernel, sizeof(Shared));
  if (!c.ok()) return c.status();
  return sampling_detail::LaunchRowClusters("LaunchSample: ", *c, p.rows, kThreads, stream,
                                            SampleKernel, p, c->per);
}

}  // namespace strata::kernels
