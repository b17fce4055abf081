// MLA decode for 16 or 32 query heads on Hopper (MlaDecodeImpl::kSm90Transposed), bf16 pages: the
// contract of mla_decode.h with the scores computed transposed.
//
// The 64-row kernels (mla_decode_sm90.cu) compute 64 rows per block whatever h_q is; at h_q 16
// three quarters of their tensor work is dropped, and that work is what keeps their loads from the
// load-only bandwidth (kernels/mla_decode/NOTES.md). Here a block takes all kN = h_q heads of one
// sequence over one split, with the heads as the N of every wgmma:
//  - S^T (64 tokens x kN) = K Q^T by wgmma m64nNk16: A = the page's boxes (K-major, as TMA lays
//    them), B = Q (K-major, kN rows, loaded once).
//  - The online softmax runs down the columns: one running max per head, the tile's column maxima
//    over the 4 warps through shared memory; row sums stay per thread until the epilogue.
//  - O^T (512 x kN) = alpha O^T + V^T P^T, as 8 chunks of 64 latent dims (m64nNk16): A = V^T, read
//    MN-major (imm-trans-a) from the same boxes, B = P^T (bf16, kN rows of 64 tokens, swizzled).
//  - A consumer warpgroup takes every kWgs-th tile of the split (h_q 16: two warpgroups, tiles
//    0, 2, 4, ... and 1, 3, 5, ...; h_q 32: one): a warpgroup's wgmmas at N = 16 run far below the
//    tensor pipe's rate (one warpgroup alone left the loads 35 % idle), so two keep it fed. Their
//    partial (max, sum, O) meet in the epilogue.
//  - One producer warp fills a ring of 64 x 64 boxes (8 KB) rather than of whole pages: with Q at
//    18 / 36 KB the ring holds 25 / 22 boxes, and a box is refilled as soon as its tile no longer
//    needs it (the k_pe box after S^T, the latent boxes after O^T).
// Tokens past the sequence are masked in S^T (-inf) and their V rows zeroed before O^T (P is 0
// there, but 0 x NaN is not). The epilogue normalises O through shared memory (the idle ring) and
// writes whole rows of out / o_accum.
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode_sm90.cuh"

namespace strata::kernels {
namespace mla_sm90 {
namespace {

constexpr int kBarAll = 3;  // named barrier of all consumers (1 + wg: one consumer warpgroup's)

// Shared memory for kN heads and up to two consumer warpgroups (a P^T tile and a reduction
// buffer each; one warpgroup leaves the second pair unused).
template <int kN>
struct TLayout {
  static constexpr int kQBoxBytes = kN * 128;  // kN heads x 64 dims
  static constexpr int kQBytes = kBoxes * kQBoxBytes;
  static constexpr int kPBytes = 2 * kN * 128;  // P^T per warpgroup: kN heads x 64 tokens
  static constexpr int kRedBytes = 2 * 4 * kN * 4 + 2 * kN * 4;  // per warp, + m/l to merge
  static constexpr int kBarReserve = 512;
  static constexpr int kSlots =
      (227 * 1024 - 1024 - kQBytes - kPBytes - kRedBytes - kBarReserve) / kBoxBytes;
  static constexpr int kRingOffset = kQBytes;  // Q first: every offset stays 1,024-aligned
  static constexpr int kPOffset = kRingOffset + kSlots * kBoxBytes;
  static constexpr int kRedOffset = kPOffset + kPBytes;
  static constexpr int kBarOffset = kRedOffset + kRedBytes;
  static constexpr int kSmemBytes = kBarOffset + kBarReserve + 1024;  // + alignment slack
  static constexpr int kStageStride = kMlaValueDim + 4;  // fp32 rows of the epilogue's stage
  static_assert((1 + 2 * kSlots) * 8 <= kBarReserve, "q_full, full[kSlots], empty[kSlots]");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
  static_assert(kSlots >= 2 * kBoxes, "two tiles in the ring");
  static_assert(kN * kStageStride * 4 <= kSlots * kBoxBytes, "the stage fits in the ring");
};

#define STRATA_W8(i)                                                                          \
  "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]), "=f"(d[i + 5]), \
      "=f"(d[i + 6]), "=f"(d[i + 7])
#define STRATA_F8(i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x kN fp32, accumulator layout: kN / 2 per thread) = (accumulate ? d : 0) + A (64 x 16)
// B (kN x 16)^T, both from shared memory by descriptor; A K-major (kTransA 0) or MN-major (1), B
// K-major.
template <int kN, int kTransA>
__device__ __forceinline__ void WgmmaM64(float (&d)[kN / 2], uint64_t a, uint64_t b,
                                         int accumulate) {
  if constexpr (kN == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
        : STRATA_F8(0)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
  } else {
    static_assert(kN == 32, "16 or 32 heads");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
        : STRATA_F8(0), STRATA_F8(8)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
  }
}

// The same with d = A B^T (scale-d 0), d written only: starting a chain reads no old registers.
template <int kN>
__device__ __forceinline__ void WgmmaM64First(float (&d)[kN / 2], uint64_t a, uint64_t b) {
  if constexpr (kN == 16) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, 0, 1, 1, 0, 0;\n"
        : STRATA_W8(0)
        : "l"(a), "l"(b));
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 0, 1, 1, 0, 0;\n"
        : STRATA_W8(0), STRATA_W8(8)
        : "l"(a), "l"(b));
  }
}

#undef STRATA_W8
#undef STRATA_F8

// The producer warp (lane 0 issues): Q once, then the split's pages box by box into the ring,
// box number `seq` into slot seq % kSlots once its previous occupant was released.
template <int kN>
__device__ __forceinline__ void LoadQAndBoxes(const MlaDecodeParams& p, const CUtensorMap* q_map,
                                              const CUtensorMap* kv_map, uint8_t* sq, uint8_t* ring,
                                              uint64_t* q_full, uint64_t* full, uint64_t* empty,
                                              int b, const SplitTiles& tiles, int lane) {
  using L = TLayout<kN>;
  if (lane == 0) LoadQ(q_map, kv_map, sq, L::kQBoxBytes, b * kN, q_full);
  const int32_t* table = p.block_table + static_cast<size_t>(b) * p.max_pages_per_seq;
  int seq = 0;  // boxes issued so far (lane 0)
  ForEachPage(table, tiles.tile_begin, tiles.n, lane, [&](int /*i*/, int page) {
    for (int box = 0; box < kBoxes; ++box, ++seq) {
      const int slot = seq % L::kSlots;
      if (seq >= L::kSlots) MbarWait(&empty[slot], (seq / L::kSlots - 1) & 1);
      MbarArriveExpectTx(&full[slot], kBoxBytes);
      TmaLoad2d(ring + slot * kBoxBytes, kv_map, box * kBoxCols, page * kTile, &full[slot]);
    }
  });
}

// Waits until the 9 boxes of the tile whose first box is number `seq` have landed.
template <int kN>
__device__ __forceinline__ void WaitTile(uint64_t* full, int seq) {
#pragma unroll 1
  for (int box = 0; box < kBoxes; ++box) {
    MbarWait(&full[(seq + box) % TLayout<kN>::kSlots], ((seq + box) / TLayout<kN>::kSlots) & 1);
  }
}

// Issues (and commits) S^T = K Q^T of the tile at box `seq` over the 576 dims: 36 k-steps dealt
// round robin to kChains independent accumulators (their sum is S^T).
template <int kN, int kChains>
__device__ __forceinline__ void IssueScores(float (&sc)[kChains][kN / 2], const uint8_t* ring,
                                            const uint8_t* sq, int seq) {
  WgmmaFence();
#pragma unroll
  for (int box = 0; box < kBoxes; ++box) {
    const uint8_t* kbox = ring + ((seq + box) % TLayout<kN>::kSlots) * kBoxBytes;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int step = 4 * box + kk;
      const uint64_t a = DescKMajorSw128(kbox + kk * 32);
      const uint64_t b = DescKMajorSw128(sq + box * TLayout<kN>::kQBoxBytes + kk * 32);
      if (step < kChains) {
        WgmmaM64First<kN>(sc[step], a, b);
      } else {
        WgmmaM64<kN, 0>(sc[step % kChains], a, b, 1);
      }
    }
  }
  WgmmaCommit();
}

template <int kN, int kChains, int kWgs>
__global__ void __launch_bounds__(128 * (kWgs + 1), 1)
    MlaDecodeSm90TransposedKernel(const __grid_constant__ MlaDecodeParams p,
                                  const __grid_constant__ CUtensorMap q_map,
                                  const __grid_constant__ CUtensorMap kv_map) {
  using L = TLayout<kN>;
  constexpr int kC = kN / 4;  // heads per thread: 8 (c / 2) + 2 (lane % 4) + c % 2
  PdlGridSync();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedSmem(smem_raw);
  uint8_t* sq = smem;
  uint8_t* ring = smem + L::kRingOffset;
  const int tid = threadIdx.x % 128, wg = threadIdx.x / 128, warp = tid / 32, lane = tid % 32;
  uint8_t* sp = smem + L::kPOffset + wg * kN * 128;
  float* red = reinterpret_cast<float*>(smem + L::kRedOffset) + wg * 4 * kN;   // [4 warps][kN]
  float* merge = reinterpret_cast<float*>(smem + L::kRedOffset) + 2 * 4 * kN;  // m, l [kN]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + L::kSlots;

  const int split = blockIdx.y, b = blockIdx.z;
  const SplitTiles tiles = TilesOfSplit(p, split, b);
  InitBarriers(q_full, full, empty, L::kSlots, /*releasers=*/128);  // one warpgroup per tile
  if (wg == kWgs) {
    if (warp == 0 && tiles.n > 0) {
      LoadQAndBoxes<kN>(p, &q_map, &kv_map, sq, ring, q_full, full, empty, b, tiles, lane);
    }
    return;
  }

  // The consumer warpgroup. In S^T and O^T this thread holds rows 16 warp + lane / 4 + {0, 8}
  // (tokens, or latent dims within a chunk) and, in both, the head columns of Head(c).
  // Accumulator element k of a thread: head column c = ColumnOf(k), row tok0 + 8 ((k / 2) % 2).
  const auto head = [lane](int c) { return 8 * (c / 2) + 2 * (lane % 4) + c % 2; };
  const auto column_of = [](int k) { return 2 * (k / 4) + k % 2; };
  const int tok0 = 16 * warp + lane / 4;
  const auto dim_of = [tok0](int ch, int k) { return 64 * ch + tok0 + 8 * ((k / 2) % 2); };
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float o[8][kN / 2];
#pragma unroll
  for (int ch = 0; ch < 8; ++ch) {
#pragma unroll
    for (int k = 0; k < kN / 2; ++k) o[ch][k] = 0.f;
  }
  float m_run[kC], l_part[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    m_run[c] = -INFINITY;
    l_part[c] = 0.f;
  }
  // S^T of a warpgroup's next tile is issued right behind O^T of its current one. (Issuing it
  // before, so that O^T runs under the next softmax, measured slower: kernels/mla_decode/NOTES.md.)
  float sc[kChains][kN / 2];
  // A loop of at least one tile that ends in its final wait: ptxas reads the code in layout
  // order, and a path around the loop that lands between a wait_group 1 and the wait_group 0
  // makes it serialize every wgmma of the kernel.
  if (tiles.n > wg) {
    MbarWait(q_full, 0);
    WaitTile<kN>(full, wg * kBoxes);
    IssueScores<kN, kChains>(sc, ring, sq, wg * kBoxes);
    WgmmaWait<0>();
    int i = wg, seq = wg * kBoxes;
    do {
      const auto box_of = [&](int box) { return ring + ((seq + box) % L::kSlots) * kBoxBytes; };
      float s[kN / 2];
#pragma unroll
      for (int k = 0; k < kN / 2; ++k) {
        s[k] = sc[0][k];
#pragma unroll
        for (int c = 1; c < kChains; ++c) s[k] += sc[c][k];
      }
      MbarArrive(&empty[(seq + kBoxes - 1) % L::kSlots]);  // the k_pe box: S^T read it last

      // Scale to base 2, mask, column maxima over the tile's 64 tokens.
      const int valid = tiles.seqlen - (tiles.tile_begin + i) * kTile;  // > 64: a full tile
      float mx[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float& s0 = s[4 * (c / 2) + c % 2];
        float& s1 = s[4 * (c / 2) + 2 + c % 2];
        s0 = tok0 < valid ? s0 * scale_log2 : -INFINITY;
        s1 = tok0 + 8 < valid ? s1 * scale_log2 : -INFINITY;
        mx[c] = fmaxf(s0, s1);
#pragma unroll
        for (int x = 4; x < 32; x *= 2)
          mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], x));
        if (lane < 4) red[warp * kN + head(c)] = mx[c];
      }
      NamedBarrier(1 + wg, 128);

      // P^T = 2^(s - max) in bf16, heads as rows of 128 B (64 tokens) with the 128-byte swizzle.
      float alpha[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const int h = head(c);
        const float m_tile =
            fmaxf(fmaxf(red[h], red[kN + h]), fmaxf(red[2 * kN + h], red[3 * kN + h]));
        const float m_new = LaggedMax(m_run[c], m_tile);  // most tiles then scale O by 1
        const float base = Base(m_new);
        alpha[c] = Exp2(m_run[c] - base);
        m_run[c] = m_new;
        l_part[c] *= alpha[c];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const __nv_bfloat16 pv = __float2bfloat16_rn(Exp2(s[4 * (c / 2) + 2 * r + c % 2] - base));
          l_part[c] += __bfloat162float(pv);
          // token tok0 + 8 r: 16-byte chunk 2 warp + r of the row, element lane / 4 in it
          const int chunk = (2 * warp + r) ^ (h % 8);
          *reinterpret_cast<__nv_bfloat16*>(sp + h * 128 + chunk * 16 + (lane / 4) * 2) = pv;
        }
      }
      if (valid < kTile) {  // zero the V rows past the sequence in the 8 latent boxes
        const int per_box = (kTile - valid) * 8;  // 16-byte chunks
        for (int k = tid; k < 8 * per_box; k += 128) {
          uint8_t* row = box_of(k / per_box) + (valid + (k % per_box) / 8) * 128;
          *reinterpret_cast<uint4*>(row + (k % 8) * 16) = make_uint4(0, 0, 0, 0);
        }
      }
      FenceProxyAsync();
      NamedBarrier(1 + wg, 128);

      // O^T = alpha O^T + V^T P^T, chunk ch = latent dims [64 ch, 64 ch + 64) = latent box ch.
      // A warp whose alphas are all exactly 1 skips the rescale (64 values per thread).
      bool ones = true;
#pragma unroll
      for (int c = 0; c < kC; ++c) ones = ones && alpha[c] == 1.f;
      if (!__all_sync(0xffffffffu, ones)) {
#pragma unroll
        for (int ch = 0; ch < 8; ++ch) {
#pragma unroll
          for (int k = 0; k < kN / 2; ++k) o[ch][k] *= alpha[column_of(k)];
        }
      }
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) PinRegisters(o[ch]);
      WgmmaFence();
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) {
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          WgmmaM64<kN, 1>(o[ch], DescMnMajorSw128(box_of(ch) + kk * 16 * 128),
                          DescKMajorSw128(sp + kk * 32), 1);
        }
      }
      WgmmaCommit();
      // The next tile's S^T; after the last tile a discarded one over this tile's boxes (nothing
      // refills them any more), so that no wgmma sits in a branch (ptxas would serialize them).
      // With two warpgroups this one's next tile is 2 ahead: its boxes may need the slots of this
      // tile's, so they are released first.
      const bool next = i + kWgs < tiles.n;
      const int next_seq = next ? seq + kWgs * kBoxes : seq;
      const auto release_latent = [&] {  // once O^T has completed
#pragma unroll
        for (int ch = 0; ch < 8; ++ch) PinRegisters(o[ch]);
#pragma unroll
        for (int ch = 0; ch < 8; ++ch) MbarArrive(&empty[(seq + ch) % L::kSlots]);
      };
      if constexpr (kWgs == 2) {
        WgmmaWait<0>();
        release_latent();
      }
      if (next) WaitTile<kN>(full, next_seq);
      IssueScores<kN, kChains>(sc, ring, sq, next_seq);
      if constexpr (kWgs == 1) {
        WgmmaWait<1>();
        release_latent();
      }
      WgmmaWait<0>();
      i += kWgs;
      seq += kWgs * kBoxes;
    } while (i < tiles.n);
  }

  // Epilogue: the heads' sums over the 4 warps (red is free: its last reads were before the last
  // tile's second barrier), O normalised into the idle ring as fp32 rows, then whole rows out.
  float inv[kC], l_tot[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) l_part[c] += __shfl_xor_sync(0xffffffffu, l_part[c], x);
    if (lane < 4) red[warp * kN + head(c)] = l_part[c];
  }
  NamedBarrier(1 + wg, 128);
  float* stage = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int h = head(c);
    l_tot[c] = red[h] + red[kN + h] + red[2 * kN + h] + red[3 * kN + h];
  }
  // Two warpgroups: warpgroup 1 leaves its max, sum and unnormalised O in the idle ring (once both
  // are done with it), warpgroup 0 merges them into its own.
  float f_own[kC], f_other[kC];  // the weights of this warpgroup's O and of the other's
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    f_own[c] = 1.f;
    f_other[c] = 0.f;
  }
  if constexpr (kWgs == 2) {
    NamedBarrier(kBarAll, 256);
    if (wg == 1) {
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          merge[head(c)] = m_run[c];
          merge[kN + head(c)] = l_tot[c];
        }
      }
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) {
#pragma unroll
        for (int k = 0; k < kN / 2; ++k) {
          stage[head(column_of(k)) * L::kStageStride + dim_of(ch, k)] = o[ch][k];
        }
      }
    }
    NamedBarrier(kBarAll, 256);
    if (wg == 0) {
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const float m1 = merge[head(c)], l1 = merge[kN + head(c)];
        const float m = fmaxf(m_run[c], m1), base = Base(m);
        f_own[c] = exp2f(m_run[c] - base);
        f_other[c] = exp2f(m1 - base);
        l_tot[c] = l_tot[c] * f_own[c] + l1 * f_other[c];
        m_run[c] = m;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kC; ++c) inv[c] = l_tot[c] > 0.f ? 1.f / l_tot[c] : 0.f;
  if (wg == 0) {
#pragma unroll
    for (int ch = 0; ch < 8; ++ch) {
#pragma unroll
      for (int k = 0; k < kN / 2; ++k) {
        const int c = column_of(k);
        float& x = stage[head(c) * L::kStageStride + dim_of(ch, k)];
        x = (o[ch][k] * f_own[c] + (kWgs == 2 ? x * f_other[c] : 0.f)) * inv[c];
      }
    }
  }
  NamedBarrier(kBarAll, 128 * kWgs);
  const bool direct = p.num_splits == 1;
  const size_t row0 =
      direct ? static_cast<size_t>(b) * kN : (static_cast<size_t>(b) * p.num_splits + split) * kN;
  for (int k = threadIdx.x; k < kN * kMlaValueDim / 4; k += 128 * kWgs) {
    const int h = k / (kMlaValueDim / 4), d = 4 * (k % (kMlaValueDim / 4));
    const float4 v = *reinterpret_cast<const float4*>(stage + h * L::kStageStride + d);
    const size_t at = (row0 + h) * kMlaValueDim + d;
    if (direct) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y),
                           hi = __floats2bfloat162_rn(v.z, v.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(p.out + at) = packed;
    } else {
      *reinterpret_cast<float4*>(p.o_accum + at) = v;
    }
  }
  if (wg == 0 && warp == 0 && lane < 4) {
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const float lse =
          l_tot[c] > 0.f ? (m_run[c] + log2f(l_tot[c])) * 0.6931471805599453f : -INFINITY;
      (direct ? p.lse : p.lse_accum)[row0 + head(c)] = lse;
    }
  }
}

template <int kN, int kChains, int kWgs>
absl::Status LaunchTransposed(const MlaDecodeParams& params, cudaStream_t stream) {
  CUtensorMap q_map, kv_map;
  if (absl::Status st = EncodeMlaSm90Maps(params, &q_map, &kv_map, kN); !st.ok()) return st;
  const auto kernel = MlaDecodeSm90TransposedKernel<kN, kChains, kWgs>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            TLayout<kN>::kSmemBytes));
  const dim3 grid(1, params.num_splits, params.batch);
  (void)LaunchPdl(kernel, grid, dim3(128 * (kWgs + 1)), TLayout<kN>::kSmemBytes, stream, params,
                  q_map, kv_map);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace
}  // namespace mla_sm90

bool MlaDecodeSm90TransposedApplies(int num_heads_q, MlaKvDtype kv_dtype) {
  return (num_heads_q == 16 || num_heads_q == 32) && MlaDecodeSm90Applies(kv_dtype);
}

absl::Status LaunchMlaDecodeSm90Transposed(const MlaDecodeParams& params, cudaStream_t stream) {
  // 16 heads: two consumer warpgroups (measured 1.03-1.17x one); 32: one (two need more than the
  // 168 registers a thread of 384 may have, and spill). S^T in two accumulator chains.
  if (params.num_heads_q == 16) return mla_sm90::LaunchTransposed<16, 2, 2>(params, stream);
  if (params.num_heads_q == 32) return mla_sm90::LaunchTransposed<32, 2, 1>(params, stream);
  return absl::InvalidArgumentError(
      "LaunchMlaDecode: the transposed sm90 kernel takes num_heads_q 16 or 32");
}

}  // namespace strata::kernels
