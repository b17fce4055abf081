// MLA decode on Hopper, the seesaw schedule (MlaDecodeImpl::kSm90Seesaw): the contract of
// mla_decode.h, for bf16 pages, in blocks of 64 heads, two warpgroups and no producer warpgroup.
//
// Tiles go in pairs (t0, t1) = (2k, 2k + 1) of the split, t0 in buffer K0 and t1 in K1. O is split
// by value columns: warpgroup 0 holds O_L = O[:, 0, 256), warpgroup 1 O_R = O[:, 256, 512). Each
// warpgroup computes the whole S of its own tile (warpgroup 0 of t0, warpgroup 1 of t1), and does
// so one pair ahead: a pair starts with both scores in registers. Per pair (m = the running row
// maxima, in shared memory; a maximum moves only past m + 8, AdvanceRowMax):
//   wg0: softmax of t0 against m (m0 = max(m, rowmax), scale0 = 2^(m - m0)), O_L = O_L scale0 +
//        P0 V0_L; the next t0's boxes 0-3 (V0_L: now read) are loaded.
//   wg1: softmax of t1 against m0 (m1, scale1 = 2^(m0 - m1)), O_R = O_R scale0 scale1 + P1 V1_R
//        (P1 to shared memory too), then O_R += (P0 scale1) V0_R with P0 scale1 from wg0.
//   wg0: O_L = O_L scale1 + P1 V1_L, then the next t0's scores over boxes 0-3, the next t1's boxes
//        0-3 loaded once P1 V1_L is done, then the next t0's scores over boxes 4-8.
//   wg1: once its P V are done, loads boxes 4-8 of the next t1 and t0, then the next t1's scores
//        (boxes 4-8 first: they were loaded first).
// Every box of a buffer has its own barrier, so a score wgmma waits only for the box it reads, and
// a box is refilled as soon as its last reader is done: the loads run under the other
// warpgroup's tensor work instead of between pairs (the alternating kernel this one replaced
// refilled a page only once both P V halves of it were done and paid that wait at every pair;
// kernels/mla_decode/NOTES.md v4, v8). Q's rope box lives in registers (it is read by every
// score of the block), which frees shared memory for the two P tiles. The two warpgroups meet at
// four named barriers per pair.
#include <utility>

#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode_sm90.cuh"

namespace strata::kernels {
namespace mla_sm90 {
namespace {

constexpr int kSeesawThreads = 256;  // two warpgroups; thread 0 and thread 128 issue the loads
constexpr int kRopeBox = kBoxes - 1;

// Shared memory (from a 1,024-byte aligned base): Q's boxes 0-7, K0, K1, P0 (first Q's rope box,
// until both warpgroups have it in registers), P1, the row statistics, the barriers.
constexpr int kSqOffset = 0;
constexpr int kK0Offset = kSqOffset + (kBoxes - 1) * kBoxBytes;
constexpr int kK1Offset = kK0Offset + kMatBytes;
constexpr int kP0Offset = kK1Offset + kMatBytes;
constexpr int kP1Offset = kP0Offset + kBoxBytes;
constexpr int kRowMaxOffset = kP1Offset + kBoxBytes;  // m [64] f32
constexpr int kScale0Offset = kRowMaxOffset + kHeads * 4;
constexpr int kScale1Offset = kScale0Offset + kHeads * 4;
constexpr int kSumOffset = kScale1Offset + kHeads * 4;                // row sums [2][64] f32
constexpr int kBarOffset = kSumOffset + 2 * kHeads * 4;               // K0 [9], K1 [9], Q
constexpr int kSmemBytes = kBarOffset + (2 * kBoxes + 1) * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
static_assert(kSqOffset + kHeads * kStagePitch <= kK1Offset, "the epilogue's stage: Q's boxes, K0");
static_assert(kK0Offset % 1024 == 0 && kK1Offset % 1024 == 0 && kP0Offset % 1024 == 0 &&
                  kP1Offset % 1024 == 0,
              "swizzle atoms");

// Named barriers (1 is the epilogue's): both warpgroups, the writer arrives and the reader syncs.
constexpr int kBarScale0 = 2;    // wg0 -> wg1: m0, scale0
constexpr int kBarScale1 = 3;    // wg1 -> wg0: m1, scale1
constexpr int kBarP0 = 4;        // wg0 -> wg1: P0 scale1 in shared memory
constexpr int kBarPvIssued = 5;  // wg1 -> wg0: P1 in shared memory, wg1's P V issued
constexpr int kBarTail = 6;      // + wg: one warpgroup, after zeroing V rows past the keys
constexpr int kBarEnd = 8;       // both: the last m written

// Hands this thread's shared-memory writes to the threads that bar.sync on `id` (fence, then
// bar.arrive: the writer does not wait).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  __threadfence_block();
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Masks the tokens past the sequence (token0 = the tile's first) and returns this thread's two
// rows' maxima in base 2 (rows row0 and row0 + 8, over the 4 lanes sharing them). s stays raw
// (ExpToP scales it inside its FMA); only a tile that reaches past the sequence is masked.
__device__ __forceinline__ void MaskedRowMax(float (&s)[8][4], int token0, int seqlen, int lane,
                                             float scale_log2, float (&mx)[2]) {
  const int col0 = token0 + 2 * (lane % 4);
  mx[0] = mx[1] = -INFINITY;
  if (token0 + kTile > seqlen) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = col0 + 8 * j + (e % 2);
        if (token >= seqlen) s[j][e] = -INFINITY;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    mx[r] *= scale_log2;  // monotone: the maximum of the scaled scores
  }
}

// Whether every lane of the warp scales its rows by f = 1 (the warp's 16 rows: a rescale of them
// would change nothing).
__device__ __forceinline__ bool WarpScalesByOne(const float (&f)[2]) {
  return __all_sync(0xffffffffu, f[0] == 1.f && f[1] == 1.f);
}

// (lo, hi) as a bf16 pair; adds the rounded values to `sum`.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi, float& sum) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  sum += __low2float(v) + __high2float(v);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One thread loads boxes [lo, hi) of `page` into the buffer at `dst`, each on its own barrier.
__device__ __forceinline__ void LoadBoxes(const CUtensorMap* kv_map, uint8_t* dst, int page,
                                          uint64_t* bars, int lo, int hi) {
  for (int box = lo; box < hi; ++box) {
    MbarArriveExpectTx(&bars[box], kBoxBytes);
    TmaLoad2d(dst + box * kBoxBytes, kv_map, box * kBoxCols, page * kTile, &bars[box]);
  }
}

// Descriptors of a K-major operand at `p` (DescKMajorSw128), made here: descriptors made from
// loop-invariant addresses would be hoisted out of the pair loop, 72 of them held in registers.
__device__ __forceinline__ uint64_t FreshDesc(const uint8_t* p) {
  uint64_t d = DescKMajorSw128(p);
  asm volatile("" : "+l"(d));
  return d;
}

// The scores of one box of a tile: 4 k-steps (Q from shared memory, or the rope box from
// registers), after the box's barrier; one commit group. qd / kd: descriptors of Q's and the
// tile's first box (a box is 8,192 B on, a k-step 32 B: (bytes >> 4) in the address field).
template <int kBox>
__device__ __forceinline__ void ScoresOfBox(float (&s)[8][4], uint64_t qd, uint64_t kd,
                                            const uint32_t (&rq)[4][4], uint64_t* bars,
                                            uint32_t parity, bool first) {
  MbarWait(&bars[kBox], parity);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t step = (kBox * kBoxBytes + kk * 32) >> 4;
    if constexpr (kBox == kRopeBox) {
      WgmmaM64N64Rs(s, rq[kk], kd + step);
    } else {
      WgmmaM64N64Ss(s, qd + step, kd + step, first && kk == 0 ? 0 : 1);
    }
  }
  WgmmaCommit();
}

// The scores of boxes kFirst, kFirst + 1, ... (kCount of them, wrapping after the rope box), in
// that order: the order in which the buffer's boxes were loaded. `first`: the first box starts
// the accumulation.
template <int kFirst, int... kI>
__device__ __forceinline__ void ScoresOfBoxes(std::integer_sequence<int, kI...>, float (&s)[8][4],
                                              uint64_t qd, uint64_t kd, const uint32_t (&rq)[4][4],
                                              uint64_t* bars, uint32_t parity, bool first) {
  (ScoresOfBox<(kFirst + kI) % kBoxes>(s, qd, kd, rq, bars, parity, first && kI == 0), ...);
}
template <int kFirst, int kCount>
__device__ __forceinline__ void ScoresOfBoxes(float (&s)[8][4], uint64_t qd, uint64_t kd,
                                              const uint32_t (&rq)[4][4], uint64_t* bars,
                                              uint32_t parity, bool first) {
  ScoresOfBoxes<kFirst>(std::make_integer_sequence<int, kCount>{}, s, qd, kd, rq, bars, parity,
                        first);
}

// This thread's A fragments of Q's rope box (64 rows x 64 dims, swizzled, at `box`).
__device__ __forceinline__ void LoadRopeQ(const uint8_t* box, int row0, int lane,
                                          uint32_t (&rq)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + 8 * (i % 2), col = 16 * kk + 8 * (i / 2) + 2 * (lane % 4);
      rq[kk][i] = *reinterpret_cast<const uint32_t*>(
          box + row * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2);
    }
  }
}

// P = 2^(s scale_log2 - base) as bf16 A fragments (pa[kk] = tokens 16 kk .. 16 kk + 15), by one
// FMA and the SFU per value; returns the rows' sums of the rounded values.
__device__ __forceinline__ void ExpToP(const float (&s)[8][4], const float (&base)[2],
                                       float scale_log2, uint32_t (&pa)[4][4], float (&sum)[2]) {
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lo = Exp2(fmaf(s[j][2 * r], scale_log2, -base[r]));
      const float hi = Exp2(fmaf(s[j][2 * r + 1], scale_log2, -base[r]));
      pa[j / 2][2 * (j % 2) + r] = PackBf16(lo, hi, sum[r]);
    }
  }
}

// pa (bf16 pairs, two rows per thread) scaled by f[row].
__device__ __forceinline__ void ScaleP(uint32_t (&pa)[4][4], const float (&f)[2]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pa[kk][i]));
      const __nv_bfloat162 w = __floats2bfloat162_rn(v.x * f[i % 2], v.y * f[i % 2]);
      pa[kk][i] = *reinterpret_cast<const uint32_t*>(&w);
    }
  }
}

// Stores A fragments as the swizzled 64 x 64 tile `ptile` (row = head, 128 B of tokens) that the
// other warpgroup's wgmma reads.
__device__ __forceinline__ void StoreP(const uint32_t (&pa)[4][4], int row0, int lane,
                                       uint8_t* ptile) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r, chunk = j ^ (row % 8);
      *reinterpret_cast<uint32_t*>(ptile + row * 128 + chunk * 16 + (lane % 4) * 4) =
          pa[j / 2][2 * (j % 2) + r];
    }
  }
  FenceProxyAsync();
}

// o += P V_half over one tile, P from registers (PvFromSharedP: from a shared tile). Issued and
// committed.
__device__ __forceinline__ void PvFromRegisterP(float (&o)[128], const uint32_t (&pa)[4][4],
                                                const uint8_t* kv, int half) {
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    WgmmaM64N256Rs(o, pa[kk], DescMnMajorSw128(kv + 4 * half * kBoxBytes + kk * 16 * 128));
  }
  WgmmaCommit();
}

// What both warpgroups' pair steps read: the block's shared memory and split, by accessors (few
// registers: the pair steps hold O, S, P and Q's rope fragments).
struct Block {
  uint8_t* smem;
  const CUtensorMap* kv_map;
  const int32_t* table;  // this sequence's block table from the split's first tile
  int n;                 // the split's tiles; pairs past them are padded with masked tiles
  int token0;            // the split's first token
  int limit;             // keys from this token on are masked (the split's or the sequence's end)
  float scale_log2;

  __device__ __forceinline__ uint8_t* sq() const { return smem + kSqOffset; }
  __device__ __forceinline__ uint8_t* k0() const { return smem + kK0Offset; }
  __device__ __forceinline__ uint8_t* k1() const { return smem + kK1Offset; }
  __device__ __forceinline__ uint8_t* p0() const { return smem + kP0Offset; }
  __device__ __forceinline__ uint8_t* p1() const { return smem + kP1Offset; }
  __device__ __forceinline__ float* row_max() const {
    return reinterpret_cast<float*>(smem + kRowMaxOffset);
  }
  __device__ __forceinline__ float* scale0() const {
    return reinterpret_cast<float*>(smem + kScale0Offset);
  }
  __device__ __forceinline__ float* scale1() const {
    return reinterpret_cast<float*>(smem + kScale1Offset);
  }
  __device__ __forceinline__ uint64_t* bars0() const {
    return reinterpret_cast<uint64_t*>(smem + kBarOffset);
  }
  __device__ __forceinline__ uint64_t* bars1() const { return bars0() + kBoxes; }
  // The page of the split's tile i (a tile past the split reads the first page, masked).
  __device__ __forceinline__ int Page(int i) const { return table[i < n ? i : 0]; }
  __device__ __forceinline__ int Valid(int i) const { return limit - (token0 + i * kTile); }
  // This thread: its warpgroup, index in it, lane, and first row (heads row0, row0 + 8).
  __device__ __forceinline__ int wg() const { return threadIdx.x / 128; }
  __device__ __forceinline__ int t() const { return threadIdx.x % 128; }
  __device__ __forceinline__ int lane() const { return threadIdx.x % 32; }
  __device__ __forceinline__ int row0() const { return 16 * (t() / 32) + lane() / 4; }
};

// Zeroes the V rows of one half of a tile past its keys (0 x NaN is not 0), then the warpgroup
// syncs.
__device__ __forceinline__ void ZeroTail(const Block& blk, uint8_t* kv, int valid, int half) {
  if (valid >= kTile) return;
  ZeroVTail(kv, max(valid, 0), half, blk.t());
  NamedBarrier(kBarTail + blk.wg(), 128);
}

// The running maxima of this thread's two rows after a tile whose row maxima are mx (base 2):
// m_new = LaggedMax(m, mx) against the shared m, base = Base(m_new) and scale = 2^(m - base)
// (what the sums against m are worth against m_new). Most tiles then rescale nothing (a warp
// skips a rescale by exactly 1): on random data 2-3 % of an h_q 128 call at 4K-16K
// (kernels/mla_decode/NOTES.md v12). Once every lane of the warp has read m (the four lanes of a
// row read the word that lane 4i then writes), lane 4i stores m_new and the scale into `scales`.
__device__ __forceinline__ void AdvanceRowMax(const Block& blk, const float (&mx)[2], float* scales,
                                              float (&base)[2], float (&scale)[2]) {
  float m_new[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m = blk.row_max()[blk.row0() + 8 * r];
    m_new[r] = LaggedMax(m, mx[r]);
    base[r] = Base(m_new[r]);
    scale[r] = Exp2(m - base[r]);
  }
  __syncwarp();
  if (blk.lane() % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      blk.row_max()[blk.row0() + 8 * r] = m_new[r];
      scales[blk.row0() + 8 * r] = scale[r];
    }
  }
}

// Warpgroup 0's part of pair k (tiles 2k in K0, 2k + 1 in K1); s holds S of tile 2k on entry and
// S of tile 2k + 2 on return. The last pair (!more) loads nothing and skips the next scores (a
// branch inside the one copy of the pair's code; computing them over the buffers as they were
// and throwing them away cost ~1-2 % at 4K tokens, NOTES.md v10; a second copy of the pair for
// the last one made the kernel 40 % larger and 1-3 % slower).
__device__ __forceinline__ void PairWg0(const Block& blk, int k, float (&s)[8][4], float (&o)[128],
                                        float (&l)[2], const uint32_t (&rq)[4][4], bool more) {
  const int i0 = 2 * k;
  // The next pair's pages, read now: the loads below are issued without waiting for them.
  const int next0 = blk.Page(i0 + 2), next1 = blk.Page(i0 + 3);
  float mx[2], base[2], scale0[2], sum[2];
  uint32_t pa[4][4];
  MaskedRowMax(s, blk.token0 + i0 * kTile, blk.limit, blk.lane(), blk.scale_log2, mx);
  AdvanceRowMax(blk, mx, blk.scale0(), base, scale0);
  NamedBarrierArrive(kBarScale0, kSeesawThreads);
  if (!WarpScalesByOne(scale0)) ScaleRows(o, scale0);
  ExpToP(s, base, blk.scale_log2, pa, sum);
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * scale0[r] + sum[r];
  ZeroTail(blk, blk.k0(), blk.Valid(i0), 0);
  PvFromRegisterP(o, pa, blk.k0(), 0);
  WgmmaWait<0>();
  PinRegisters(o);
  if (more && blk.t() == 0) LoadBoxes(blk.kv_map, blk.k0(), next0, blk.bars0(), 0, 4);

  NamedBarrier(kBarScale1, kSeesawThreads);  // m1 and scale1 are in shared memory
  float scale1[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    scale1[r] = blk.scale1()[blk.row0() + 8 * r];
    l[r] *= scale1[r];
  }
  const bool rescale1 = !WarpScalesByOne(scale1);
  if (rescale1) ScaleP(pa, scale1);
  StoreP(pa, blk.row0(), blk.lane(), blk.p0());
  NamedBarrierArrive(kBarP0, kSeesawThreads);
  for (int box = 0; box < 4; ++box) MbarWait(&blk.bars1()[box], k & 1);  // for visibility
  ZeroTail(blk, blk.k1(), blk.Valid(i0 + 1), 0);
  NamedBarrier(kBarPvIssued, kSeesawThreads);  // P1 is in shared memory
  if (rescale1) ScaleRows(o, scale1);
  PvFromSharedP(o, blk.p1(), blk.k1(), 0);
  if (more) {
    const uint32_t parity = (k + 1) & 1;
    const uint64_t qd = FreshDesc(blk.sq()), kd = FreshDesc(blk.k0());
    WgmmaFence();
    ScoresOfBoxes<0, 4>(s, qd, kd, rq, blk.bars0(), parity, true);
    WgmmaWait<4>();  // P1 V1_L is done: K1's boxes 0-3 are free
    if (blk.t() == 0) LoadBoxes(blk.kv_map, blk.k1(), next1, blk.bars1(), 0, 4);
    ScoresOfBoxes<4, 5>(s, qd, kd, rq, blk.bars0(), parity, false);
  }
  WgmmaWait<0>();
  PinRegisters(o);
  PinRegisters(s);
}

// Warpgroup 1's part of pair k; s holds S of tile 2k + 1 on entry and of tile 2k + 3 on return.
__device__ __forceinline__ void PairWg1(const Block& blk, int k, float (&s)[8][4], float (&o)[128],
                                        float (&l)[2], const uint32_t (&rq)[4][4], bool more) {
  const int i1 = 2 * k + 1;
  const int next0 = blk.Page(i1 + 1), next1 = blk.Page(i1 + 2);
  float mx[2], base[2], scale1[2], f[2], sum[2];
  uint32_t pa[4][4];
  MaskedRowMax(s, blk.token0 + i1 * kTile, blk.limit, blk.lane(), blk.scale_log2, mx);
  NamedBarrier(kBarScale0, kSeesawThreads);  // m0 and scale0 are in shared memory
  AdvanceRowMax(blk, mx, blk.scale1(), base, scale1);
#pragma unroll
  for (int r = 0; r < 2; ++r) f[r] = blk.scale0()[blk.row0() + 8 * r] * scale1[r];
  ExpToP(s, base, blk.scale_log2, pa, sum);
  NamedBarrierArrive(kBarScale1, kSeesawThreads);
  StoreP(pa, blk.row0(), blk.lane(), blk.p1());  // wg0 reads it after kBarPvIssued
  if (!WarpScalesByOne(f)) ScaleRows(o, f);
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * f[r] + sum[r];
  ZeroTail(blk, blk.k1(), blk.Valid(i1), 1);
  PvFromRegisterP(o, pa, blk.k1(), 1);
  NamedBarrier(kBarP0, kSeesawThreads);  // P0 scale1 is in shared memory
  for (int box = 4; box < 8; ++box) MbarWait(&blk.bars0()[box], k & 1);  // for visibility
  ZeroTail(blk, blk.k0(), blk.Valid(i1 - 1), 1);
  PvFromSharedP(o, blk.p0(), blk.k0(), 1);
  NamedBarrierArrive(kBarPvIssued, kSeesawThreads);
  WgmmaWait<1>();  // P1 V1_R is done: K1's boxes 4-8 are free
  if (more && blk.t() == 0) LoadBoxes(blk.kv_map, blk.k1(), next1, blk.bars1(), 4, kBoxes);
  WgmmaWait<0>();  // P0 V0_R is done: K0's boxes 4-8 are free
  if (more && blk.t() == 0) LoadBoxes(blk.kv_map, blk.k0(), next0, blk.bars0(), 4, kBoxes);
  if (more) {
    const uint32_t parity = (k + 1) & 1;
    const uint64_t qd = FreshDesc(blk.sq()), kd = FreshDesc(blk.k1());
    WgmmaFence();
    ScoresOfBoxes<4, 9>(s, qd, kd, rq, blk.bars1(), parity, true);
    WgmmaWait<0>();
  }
  PinRegisters(o);
  PinRegisters(s);
}

__global__ void __launch_bounds__(kSeesawThreads, 1)
    MlaDecodeSm90SeesawKernel(const __grid_constant__ MlaDecodeParams p,
                              const __grid_constant__ CUtensorMap q_map,
                              const __grid_constant__ CUtensorMap kv_map) {
  PdlGridSync();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedSmem(smem_raw);
  const int tid = threadIdx.x, lane = tid % 32;
  const int head0 = blockIdx.x * kHeads, split = blockIdx.y, b = blockIdx.z;
  const SplitTiles tiles = TilesOfSplit(p, split, b);

  Block blk;
  blk.smem = smem;
  blk.kv_map = &kv_map;
  blk.table = p.block_table + static_cast<size_t>(b) * p.max_pages_per_seq + tiles.tile_begin;
  blk.n = tiles.n;
  blk.token0 = tiles.tile_begin * kTile;
  blk.limit = min(tiles.seqlen, (tiles.tile_begin + tiles.n) * kTile);
  blk.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  uint64_t* q_bar = blk.bars1() + kBoxes;

  if (tid == 0) {
    for (int i = 0; i < 2 * kBoxes + 1; ++i) MbarInit(&blk.bars0()[i], 1);
    FenceBarrierInit();
  }
  if (tid < kHeads) blk.row_max()[tid] = -INFINITY;
  __syncthreads();

  float o[128], l[2] = {0.f, 0.f}, s[8][4];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const int pairs = (tiles.n + 1) / 2;
  if (pairs > 0) {
    if (tid == 0) {
      PrefetchTensorMap(&q_map);
      PrefetchTensorMap(&kv_map);
      const int q_row = b * p.num_heads_q + head0;
      MbarArriveExpectTx(q_bar, kBoxes * kBoxBytes);
      for (int box = 0; box < kBoxes; ++box) {
        uint8_t* dst = box == kRopeBox ? blk.p0() : blk.sq() + box * kBoxBytes;
        TmaLoad2d(dst, &q_map, box * kBoxCols, q_row, q_bar);
      }
      const int page1 = blk.Page(1);
      LoadBoxes(&kv_map, blk.k0(), blk.Page(0), blk.bars0(), 0, kBoxes);
      LoadBoxes(&kv_map, blk.k1(), page1, blk.bars1(), 4, kBoxes);
      LoadBoxes(&kv_map, blk.k1(), page1, blk.bars1(), 0, 4);
    }
    MbarWait(q_bar, 0);
    uint32_t rq[4][4];
    LoadRopeQ(blk.p0(), blk.row0(), lane, rq);
    WgmmaFence();
    if (blk.wg() == 0) {
      const uint64_t qd = FreshDesc(blk.sq()), kd = FreshDesc(blk.k0());
      ScoresOfBoxes<0, 9>(s, qd, kd, rq, blk.bars0(), 0, true);
      WgmmaWait<0>();
      PinRegisters(s);
      for (int k = 0; k < pairs; ++k) PairWg0(blk, k, s, o, l, rq, k + 1 < pairs);
    } else {
      const uint64_t qd = FreshDesc(blk.sq()), kd = FreshDesc(blk.k1());
      ScoresOfBoxes<4, 9>(s, qd, kd, rq, blk.bars1(), 0, true);
      WgmmaWait<0>();
      PinRegisters(s);
      for (int k = 0; k < pairs; ++k) PairWg1(blk, k, s, o, l, rq, k + 1 < pairs);
    }
  }
  NamedBarrier(kBarEnd, kSeesawThreads);  // the last pair's m is in shared memory
  const float m_run[2] = {blk.row_max()[blk.row0()], blk.row_max()[blk.row0() + 8]};
  // One split's rows are staged over Q's boxes and K0: every wgmma has read them and the last
  // pair loaded nothing.
  float* red_sum = reinterpret_cast<float*>(smem + kSumOffset);
  if (p.num_splits == 1) {
    StoreOutStaged(p, o, l, m_run, red_sum, blk.sq(), blk.wg(), lane, blk.row0(), head0, b);
  } else {
    StoreRows(p, o, l, m_run, red_sum, blk.wg(), lane, blk.row0(), head0, split, b);
  }
}

}  // namespace
}  // namespace mla_sm90

absl::Status LaunchMlaDecodeSm90Seesaw(const MlaDecodeParams& params, cudaStream_t stream) {
  using namespace mla_sm90;  // NOLINT(build/namespaces)
  CUtensorMap q_map, kv_map;
  if (absl::Status st = EncodeMlaSm90Maps(params, &q_map, &kv_map); !st.ok()) return st;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaDecodeSm90SeesawKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid((params.num_heads_q + kHeads - 1) / kHeads, params.num_splits, params.batch);
  (void)LaunchPdl(MlaDecodeSm90SeesawKernel, grid, dim3(kSeesawThreads), kSmemBytes, stream, params,
                  q_map, kv_map);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
