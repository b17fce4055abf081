// What the two 64-row Hopper MLA decode kernels share (mla_decode_sm90.cu: both warpgroups on
// every tile, fed by a producer warpgroup through a 2-stage page ring; mla_decode_sm90_seesaw.cu:
// each warpgroup the scores of its own tile, box-by-box loads): the block shape, the page boxes,
// a split's tiles, the producer of the ring (sm90), the V tail zeroing, the epilogue, the P V
// instructions, the tensor maps, the SFU's 2^x and the running maximum's rule. Included by those
// two .cu files and by the transposed kernel's (mla_decode_sm90_transposed.cu), which uses the
// boxes, maps, 2^x and the maximum's rule.
#pragma once

#include <cuda.h>

#include "kernels/common/pdl.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/mla_decode/fresh_rows.cuh"
#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels::mla_sm90 {

using namespace ::strata::kernels::sm90;  // NOLINT(build/namespaces): PTX helper vocabulary

constexpr int kHeads = 64;                        // query heads (rows) per block
constexpr int kTile = kMlaPageSize;               // tokens per tile: one page
constexpr int kBoxCols = 64;                      // bf16 in one 128-byte swizzled row
constexpr int kBoxes = kMlaQkHeadDim / kBoxCols;  // 9 boxes per 576-wide matrix
constexpr int kBoxBytes = 64 * 128;               // 64 rows x 128 B
constexpr int kMatBytes = kBoxes * kBoxBytes;     // Q, or one KV tile: 73,728 B
constexpr int kStages = 2;
constexpr int kConsumerThreads = 256;             // two consumer warpgroups
constexpr int kThreads = kConsumerThreads + 128;  // + a producer warpgroup
constexpr int kQOffset = 0;                       // from a 1,024-byte aligned base
constexpr int kKvOffset = kQOffset + kMatBytes;
constexpr int kRingEnd = kKvOffset + kStages * kMatBytes;

// 2^x by the SFU alone, a subnormal result flushed to zero (exp2f adds three instructions for
// that range; P is rounded to bf16, whose smallest normal is fp32's).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A running maximum (base 2) as the base of exp2: -inf (no key seen yet) as 0, so 2^(-inf - 0) = 0.
__device__ __forceinline__ float Base(float m) { return m == -INFINITY ? 0.f : m; }

// The seesaw and transposed kernels' running maximum after a tile whose maximum is m_tile (base
// 2): it moves only when m_tile exceeds m by more than kMaxLag (-inf + kMaxLag = -inf: the first
// finite m_tile moves it). A maximum that lags the true one by up to 8 leaves P = 2^(s - m) at
// most 256, which fp32 sums and O and the bf16 P hold as well as values up to 1, and most tiles
// then rescale nothing (docs/numerics.md; kernels/mla_decode/NOTES.md v12).
constexpr float kMaxLag = 8.f;
__device__ __forceinline__ float LaggedMax(float m, float m_tile) {
  return m_tile > m + kMaxLag ? m_tile : m;
}

// The block's 1,024-byte aligned view of its dynamic shared memory (TMA swizzle atoms).
__device__ __forceinline__ uint8_t* AlignedSmem(uint8_t* raw) {
  return raw + ((1024 - (SmemAddr(raw) & 1023)) & 1023);
}

// The tiles [tile_begin, tile_begin + n) that split `split` of sequence b takes, and the
// sequence's length (clamped to its block table).
struct SplitTiles {
  int seqlen, tile_begin, n;
};

__device__ __forceinline__ SplitTiles TilesOfSplit(const MlaDecodeParams& p, int split, int b) {
  const int seqlen = max(0, min(p.seqlens[b], p.max_pages_per_seq * kMlaPageSize));
  const int num_tiles = (seqlen + kTile - 1) / kTile;
  const int per_split = (num_tiles + p.num_splits - 1) / p.num_splits;
  const int tile_begin = min(num_tiles, split * per_split);
  return {seqlen, tile_begin, min(num_tiles, tile_begin + per_split) - tile_begin};
}

// Thread 0 initialises Q's barrier and the ring's `slots` barrier pairs (full: the producer's
// transaction count, empty: `releasers` consumer threads arrive); then the whole block syncs.
__device__ __forceinline__ void InitBarriers(uint64_t* q_full, uint64_t* full, uint64_t* empty,
                                             int slots = kStages,
                                             int releasers = kConsumerThreads) {
  if (threadIdx.x == 0) {
    MbarInit(q_full, 1);
    for (int s = 0; s < slots; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], releasers);
    }
    FenceBarrierInit();
  }
  __syncthreads();
}

// Lane 0 of a producer: prefetches both tensor maps and loads Q's 9 boxes (`q_box_bytes` each,
// rows from `q_row`) on `q_full`.
__device__ __forceinline__ void LoadQ(const CUtensorMap* q_map, const CUtensorMap* kv_map,
                                      uint8_t* sq, uint32_t q_box_bytes, int q_row,
                                      uint64_t* q_full) {
  PrefetchTensorMap(q_map);
  PrefetchTensorMap(kv_map);
  MbarArriveExpectTx(q_full, kBoxes * q_box_bytes);
  for (int box = 0; box < kBoxes; ++box) {
    TmaLoad2d(sq + box * q_box_bytes, q_map, box * kBoxCols, q_row, q_full);
  }
}

// The whole producer warp walks block-table entries table[first .. first + n), 32 per warp load;
// lane 0 calls fn(i, page) for each in order (i from 0).
template <typename Fn>
__device__ __forceinline__ void ForEachPage(const int32_t* table, int first, int n, int lane,
                                            Fn&& fn) {
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int mine = i0 + lane < n ? table[first + i0 + lane] : 0;
    for (int j = 0; j < min(32, n - i0); ++j) {
      const int page = __shfl_sync(0xffffffffu, mine, j);
      if (lane == 0) fn(i0 + j, page);
      __syncwarp();
    }
  }
}

// The producer warp: Q once, then the split's tiles (one page each, 9 boxes of 64 tokens x 64
// dims) into stage i % 2, each after the consumers released that stage. With fresh_rows (the
// kernel's wait left to this warp, see MlaDecodeSm90Kernel), the first tiles whose rows were all
// complete before the kernel ahead started load before the programmatic-launch wait, up to the
// ring's size; Q (that kernel's output) and the rest after it.
__device__ __forceinline__ void LoadQAndTiles(const MlaDecodeParams& p, const CUtensorMap* q_map,
                                              const CUtensorMap* kv_map, uint8_t* sq, uint8_t* skv,
                                              uint64_t* q_full, uint64_t* full, uint64_t* empty,
                                              int b, int head0, const SplitTiles& tiles, int lane) {
  const int32_t* table = p.block_table + static_cast<size_t>(b) * p.max_pages_per_seq;
  const auto load_tile = [&](int i, int page) {
    const int stage = i % kStages;
    if (i >= kStages) MbarWait(&empty[stage], (i / kStages - 1) & 1);
    MbarArriveExpectTx(&full[stage], kMatBytes);
    uint8_t* dst = skv + stage * kMatBytes;
    for (int box = 0; box < kBoxes; ++box) {
      TmaLoad2d(dst + box * kBoxBytes, kv_map, box * kBoxCols, page * kTile, &full[stage]);
    }
  };
  int early = 0;
  if (p.fresh_rows > 0) {
    const int settled = MlaSettledTiles(p, tiles.seqlen, kTile) - tiles.tile_begin;
    early = max(0, min(min(settled, tiles.n), kStages));
    if (lane == 0) {
      for (int i = 0; i < early; ++i) load_tile(i, table[tiles.tile_begin + i]);
    }
    PdlGridSync();
  }
  if (lane == 0) LoadQ(q_map, kv_map, sq, kBoxBytes, b * p.num_heads_q + head0, q_full);
  ForEachPage(table, tiles.tile_begin + early, tiles.n - early, lane,
              [&](int i, int page) { load_tile(early + i, page); });
}

// The producer warpgroup of either kernel (threads kConsumerThreads..): hands its registers to
// the consumers (setmaxnreg); its first warp fills the ring, the other three return.
__device__ __forceinline__ void ProducerWarpgroup(const MlaDecodeParams& p,
                                                  const CUtensorMap* q_map,
                                                  const CUtensorMap* kv_map, uint8_t* sq,
                                                  uint8_t* skv, uint64_t* q_full, uint64_t* full,
                                                  uint64_t* empty, int b, int head0,
                                                  const SplitTiles& tiles) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
  if (tiles.n == 0 || threadIdx.x / 32 != kConsumerThreads / 32) return;
  LoadQAndTiles(p, q_map, kv_map, sq, skv, q_full, full, empty, b, head0, tiles, threadIdx.x % 32);
}

// Zeroes the V rows past the sequence of one half of a tile's latent dims (boxes 4 half ..
// 4 half + 3), by the 128 threads of one warpgroup, made visible to their next wgmma (P is 0
// there, but 0 x NaN is not). `valid` tokens of the tile are real (1..63).
__device__ __forceinline__ void ZeroVTail(uint8_t* kvs, int valid, int half, int t) {
  const int per_box = (kTile - valid) * 8;  // 16-byte chunks past the sequence in one box
  for (int k = t; k < 4 * per_box; k += 128) {
    const int box = 4 * half + k / per_box, r = valid + (k % per_box) / 8, c = k % 8;
    *reinterpret_cast<uint4*>(kvs + box * kBoxBytes + r * 128 + c * 16) = make_uint4(0, 0, 0, 0);
  }
  FenceProxyAsync();
}

// The totals of this thread's two rows (row0, row0 + 8) over both warpgroups' parts of their sums
// (warpgroup wg holds O[:, 256 wg, 256 wg + 256) and the sum of its own P V), and their inverses
// (0 for a row with no keys). The parts meet in red_sum[2][kHeads] behind named barrier 1.
struct RowTotals {
  float l[2];
  float inv[2];
};
__device__ __forceinline__ RowTotals ShareRowTotals(float (&l_run)[2], float* red_sum, int wg,
                                                    int lane, int row0) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    if (lane % 4 == 0) red_sum[wg * kHeads + row0 + 8 * r] = l_run[r];
  }
  NamedBarrier(1, kConsumerThreads);
  RowTotals t;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    t.l[r] = red_sum[row] + red_sum[kHeads + row];
    t.inv[r] = t.l[r] > 0.f ? 1.f / t.l[r] : 0.f;
  }
  return t;
}

// The log-sum-exp (natural base) of a row with base-2 running maximum m and sum l.
__device__ __forceinline__ float RowLse(float m, float l) {
  return l > 0.f ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
}

// The epilogue of the kSm90 kernel, and the seesaw kernel's for a split's partial: the warpgroups'
// O halves of this thread's rows, unnormalised, with their parts of the row sums; normalises and
// stores out / lse, or this split's partial.
__device__ __forceinline__ void StoreRows(const MlaDecodeParams& p, const float (&o)[128],
                                          float (&l_run)[2], const float (&m_run)[2],
                                          float* red_sum, int wg, int lane, int row0, int head0,
                                          int split, int b) {
  const int h_q = p.num_heads_q;
  const RowTotals tot = ShareRowTotals(l_run, red_sum, wg, lane, row0);
  const bool direct = p.num_splits == 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r, head = head0 + row;
    if (head >= h_q) continue;  // a block of fewer heads computes these rows and drops them
    const float inv = tot.inv[r];
    const size_t out_row = direct ? static_cast<size_t>(b) * h_q + head
                                  : (static_cast<size_t>(b) * p.num_splits + split) * h_q + head;
    if (direct) {
      __nv_bfloat16* out = p.out + out_row * kMlaValueDim + 256 * wg + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) =
            __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
    } else {
      float* out = p.o_accum + out_row * kMlaValueDim + 256 * wg + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(out + 8 * j) =
            make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
    }
    if (wg == 0 && lane % 4 == 0) {
      (direct ? p.lse : p.lse_accum)[out_row] = RowLse(m_run[r], tot.l[r]);
    }
  }
}

// Bytes from one staged row to the next in StoreOutStaged: 512 bf16 plus 16, so that the 8 rows
// of one fragment store fall on distinct banks.
inline constexpr int kStagePitch = (kMlaValueDim + 16) * 2;

// StoreRows for a call of one split (out and lse) by staging: the normalised bf16 rows are
// written to shared memory at `stage` (64 rows kStagePitch bytes apart, free to overwrite) and
// leave by one 1 KB bulk copy per row, instead of 64 scattered 4-byte stores per thread that
// fill half a sector each (those took ~5 us per block on an H100 against ~2.7 this way,
// kernels/mla_decode/NOTES.md v10). A split's fp32 partial is not staged: its 8-byte stores
// fill whole sectors, and staging them measured slower. Threads 0..63 issue the copies and wait
// until they have read the stage.
__device__ __forceinline__ void StoreOutStaged(const MlaDecodeParams& p, const float (&o)[128],
                                               float (&l_run)[2], const float (&m_run)[2],
                                               float* red_sum, uint8_t* stage, int wg, int lane,
                                               int row0, int head0, int b) {
  const int h_q = p.num_heads_q;
  const RowTotals tot = ShareRowTotals(l_run, red_sum, wg, lane, row0);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r, head = head0 + row;
    const float inv = tot.inv[r];
    __nv_bfloat16* dst =
        reinterpret_cast<__nv_bfloat16*>(stage + row * kStagePitch) + 256 * wg + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
          __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (wg == 0 && lane % 4 == 0 && head < h_q) {
      p.lse[static_cast<size_t>(b) * h_q + head] = RowLse(m_run[r], tot.l[r]);
    }
  }
  FenceProxyAsync();
  NamedBarrier(1, kConsumerThreads);
  const int row = threadIdx.x;
  if (row < kHeads && head0 + row < h_q) {
    BulkStore(p.out + (static_cast<size_t>(b) * h_q + head0 + row) * kMlaValueDim,
              stage + row * kStagePitch, kMlaValueDim * 2);
    BulkCommit();
    BulkWaitRead();
  }
}

#define STRATA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define STRATA_F16(i) STRATA_F4(i), STRATA_F4(i + 4), STRATA_F4(i + 8), STRATA_F4(i + 12)
#define STRATA_D128                                                                             \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"  \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"    \
  "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,"    \
  "%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,"    \
  "%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110," \
  "%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"

// d (64 x 256) += A (64 x 16, K-major in shared memory) B (16 x 256, MN-major: imm-trans-b).
__device__ __forceinline__ void WgmmaM64N256(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" STRATA_D128
               "}, %128, %129, 1, 1, 1, 0, 1;\n"
               : STRATA_F16(0), STRATA_F16(16), STRATA_F16(32), STRATA_F16(48), STRATA_F16(64),
                 STRATA_F16(80), STRATA_F16(96), STRATA_F16(112)
               : "l"(a), "l"(b));
}

// The same with A in registers: the fragment of one k-step, in the layout of a wgmma
// accumulator's 16 columns converted to bf16 pairs (what PackP writes).
__device__ __forceinline__ void WgmmaM64N256Rs(float (&d)[128], const uint32_t (&a)[4],
                                               uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" STRATA_D128
               "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"
               : STRATA_F16(0), STRATA_F16(16), STRATA_F16(32), STRATA_F16(48), STRATA_F16(64),
                 STRATA_F16(80), STRATA_F16(96), STRATA_F16(112)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#undef STRATA_D128
#undef STRATA_F16
#undef STRATA_F4

// Scales this thread's two rows of an O half (128 accumulators) by f[0] and f[1].
__device__ __forceinline__ void ScaleRows(float (&o)[128], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= f[0];
    o[4 * j + 1] *= f[0];
    o[4 * j + 2] *= f[1];
    o[4 * j + 3] *= f[1];
  }
}

// o += P V_half over one tile (half = which 256 value columns: boxes 4 half .. 4 half + 3 of the
// tile's K layout, read MN-major), P (64 x 64) from the swizzled shared tile `ptile`. Issued and
// committed, not waited.
__device__ __forceinline__ void PvFromSharedP(float (&o)[128], const uint8_t* ptile,
                                              const uint8_t* kv, int half) {
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    WgmmaM64N256(o, DescKMajorSw128(ptile + kk * 32),
                 DescMnMajorSw128(kv + 4 * half * kBoxBytes + kk * 16 * 128));
  }
  WgmmaCommit();
}

// Q and the pages as [rows][576] bf16 matrices read in boxes of 64 dims: 64 page rows (tokens),
// `q_box_rows` Q rows (heads).
inline absl::Status EncodeMlaSm90Maps(const MlaDecodeParams& params, CUtensorMap* q_map,
                                      CUtensorMap* kv_map, uint32_t q_box_rows = 64) {
  const uint64_t row_bytes = kMlaQkHeadDim * 2;
  const uint32_t box[2] = {kBoxCols, 64}, q_box[2] = {kBoxCols, q_box_rows};
  const uint64_t q_dims[2] = {kMlaQkHeadDim,
                              static_cast<uint64_t>(params.batch) * params.num_heads_q};
  const uint64_t kv_dims[2] = {kMlaQkHeadDim,
                               static_cast<uint64_t>(params.num_pages) * kMlaPageSize};
  if (absl::Status st =
          EncodeBf16TensorMap(q_map, params.q, 2, q_dims, &row_bytes, q_box, "MLA decode q");
      !st.ok()) {
    return st;
  }
  return EncodeBf16TensorMap(kv_map, params.kv_cache, 2, kv_dims, &row_bytes, box,
                             "MLA decode kv_cache");
}

}  // namespace strata::kernels::mla_sm90
