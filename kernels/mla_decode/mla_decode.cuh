// Device code of the MLA decode split-KV kernel (see mla_decode.h for the contract).
//
// One block of 8 warps takes kMTiles * 16 query heads of one sequence and one contiguous range of
// 32-token KV tiles (a half page). Tiles stream through a 3-stage cp.async ring in shared memory;
// QK^T and PV run on the tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate); the online
// softmax is in base 2. Warp w owns output columns [64w, 64w + 64) of every head in the block.
// fp8 KV (kFp8): the ring holds the tiles' raw fp8 bytes (latent, scales, k_pe of 32 tokens);
// each tile is dequantized into one bf16 tile of the same layout as above before the math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm80_ptx.cuh"
#include "kernels/mla_decode/fresh_rows.cuh"
#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels::mla_detail {

inline constexpr int kTileTokens = 32;
inline constexpr int kThreads = 256;
inline constexpr int kRowStride = kMlaQkHeadDim + 8;     // bf16; +16 B breaks bank conflicts
inline constexpr int kChunksPerRow = kMlaQkHeadDim / 8;  // 16-byte chunks

// One 32-token tile of an fp8 page, as the ring holds it: latent, then scales, then k_pe.
inline constexpr int kFp8TileLatentBytes = kTileTokens * kMlaValueDim;  // e4m3
inline constexpr int kFp8TileScaleBytes = kTileTokens * 4 * 4;          // 4 f32 per token
inline constexpr int kFp8TileRopeBytes = kTileTokens * 64 * 2;          // bf16
inline constexpr int kFp8TileBytes = kFp8TileLatentBytes + kFp8TileScaleBytes + kFp8TileRopeBytes;

template <int kMTiles, bool kFp8 = false>
struct Layout {
  static constexpr int kHeads = 16 * kMTiles;
  // As many cp.async stages as fit next to Q in 227 KB: more tiles in flight for few heads.
  // 16 heads: two stages, so two blocks share an SM (~93 KB bf16, ~100 KB fp8) and one block's
  // softmax, barriers (and fp8 dequantization) overlap the other's loads and tensor work.
  static constexpr int kBlocksPerSm = kMTiles == 1 ? 2 : 1;
  static constexpr int kStages =
      kBlocksPerSm == 2 ? 2 : (kMTiles == 1 ? 5 : (kMTiles == 2 ? 4 : 3));
  // bf16: the ring of bf16 tiles. fp8: one bf16 tile, and the ring of raw fp8 tiles after it.
  static constexpr int kBf16Tiles = kFp8 ? 1 : kStages;
  static constexpr int kRawBytes = kFp8 ? kStages * kFp8TileBytes : 0;
  static constexpr int kSStride = kTileTokens + 4;  // fp32
  static constexpr int kPStride = kTileTokens + 8;  // bf16
  static constexpr int kQBytes = kHeads * kRowStride * 2;
  static constexpr int kKvStageBytes = kTileTokens * kRowStride * 2;
  static constexpr int kSBytes = kHeads * kSStride * 4;
  static constexpr int kPBytes = kHeads * kPStride * 2;
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kQBytes;
  static constexpr int kRawOffset = kKvOffset + kBf16Tiles * kKvStageBytes;
  static constexpr int kSOffset = kRawOffset + kRawBytes;
  static constexpr int kPOffset = kSOffset + kSBytes;
  static constexpr int kRowOffset = kPOffset + kPBytes;  // m, l, alpha: 3 x kHeads floats
  static constexpr int kTotalBytes = kRowOffset + 3 * kHeads * 4;
};

__device__ __forceinline__ uint32_t Ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment (16 x 16) of a row-major bf16 matrix at `p` (top-left) with `stride` elements.
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const __nv_bfloat16* p, int stride, int g,
                                      int t) {
  const __nv_bfloat16* r0 = p + g * stride + 2 * t;
  const __nv_bfloat16* r8 = r0 + 8 * stride;
  a[0] = Ld32(r0);
  a[1] = Ld32(r8);
  a[2] = Ld32(r0 + 8);
  a[3] = Ld32(r8 + 8);
}

// Dequantizes one raw fp8 tile into the bf16 tile: latent bf16(e4m3 x scale), k_pe copied.
__device__ __forceinline__ void DequantizeTile(const uint8_t* raw, __nv_bfloat16* dst, int tid) {
  const float* scales = reinterpret_cast<const float*>(raw + kFp8TileLatentBytes);
  const uint8_t* rope = raw + kFp8TileLatentBytes + kFp8TileScaleBytes;
  for (int i = tid; i < kTileTokens * (kMlaValueDim / 8); i += kThreads) {
    const int r = i / (kMlaValueDim / 8), c = (i % (kMlaValueDim / 8)) * 8;
    const uint2 codes = *reinterpret_cast<const uint2*>(raw + r * kMlaValueDim + c);
    const float sc = scales[r * 4 + c / 128];
    const uint32_t words[2] = {codes.x, codes.y};
    uint32_t packed[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const __nv_fp8x2_storage_t pair =
          static_cast<__nv_fp8x2_storage_t>(words[h / 2] >> (16 * (h % 2)));
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * sc, f.y * sc);
      packed[h] = *reinterpret_cast<const uint32_t*>(&b);
    }
    *reinterpret_cast<uint4*>(dst + r * kRowStride + c) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  for (int i = tid; i < kTileTokens * 8; i += kThreads) {  // 8 chunks of 16 B per token
    const int r = i / 8, k = i % 8;
    *reinterpret_cast<uint4*>(dst + r * kRowStride + kMlaValueDim + k * 8) =
        *reinterpret_cast<const uint4*>(rope + r * 128 + k * 16);
  }
}

template <int kMTiles, bool kFp8>
__global__ void __launch_bounds__(kThreads, (Layout<kMTiles, kFp8>::kBlocksPerSm))
    MlaDecodeSplitKvKernel(MlaDecodeParams p) {
  // With fresh_rows, the pages of rows that were complete before the kernel ahead started load
  // before the wait (they join the first cp.async group, with Q).
  const bool early = p.fresh_rows > 0;
  if (!early) PdlGridSync();
  using L = Layout<kMTiles, kFp8>;
  constexpr int kHeads = L::kHeads;
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem + L::kQOffset);
  __nv_bfloat16* skv = reinterpret_cast<__nv_bfloat16*>(smem + L::kKvOffset);
  uint8_t* sraw = smem + L::kRawOffset;
  float* ss = reinterpret_cast<float*>(smem + L::kSOffset);
  __nv_bfloat16* sp = reinterpret_cast<__nv_bfloat16*>(smem + L::kPOffset);
  float* row_m = reinterpret_cast<float*>(smem + L::kRowOffset);
  float* row_l = row_m + kHeads;
  float* row_alpha = row_l + kHeads;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kHeads;
  const int h_q = p.num_heads_q;

  int seqlen = p.seqlens[b];
  seqlen = max(0, min(seqlen, p.max_pages_per_seq * kMlaPageSize));
  const int num_tiles = (seqlen + kTileTokens - 1) / kTileTokens;
  const int per_split = (num_tiles + p.num_splits - 1) / p.num_splits;
  const int tile_begin = min(num_tiles, split * per_split);
  const int tile_end = min(num_tiles, tile_begin + per_split);
  const int n = tile_end - tile_begin;

  const int32_t* table = p.block_table + static_cast<size_t>(b) * p.max_pages_per_seq;
  auto load_tile = [&](int tile, int stage) {
    const int token0 = tile * kTileTokens;
    const int page = table[token0 / kMlaPageSize];
    if constexpr (kFp8) {
      // Three contiguous runs of the page: latent rows, scale rows, k_pe rows of these tokens.
      const uint8_t* base = p.kv_cache_fp8 + static_cast<size_t>(page) * kMlaFp8PageBytes;
      const int tok0 = token0 % kMlaPageSize;
      uint8_t* dst = sraw + stage * kFp8TileBytes;
      constexpr int kLatentChunks = kFp8TileLatentBytes / 16, kScaleChunks = kTileTokens;
      constexpr int kChunks = kLatentChunks + kScaleChunks + kFp8TileRopeBytes / 16;
      for (int i = tid; i < kChunks; i += kThreads) {
        int r;
        const uint8_t* src;
        uint8_t* d;
        if (i < kLatentChunks) {
          r = i / (kMlaValueDim / 16);
          src = base + tok0 * kMlaValueDim + i * 16;
          d = dst + i * 16;
        } else if (i < kLatentChunks + kScaleChunks) {
          r = i - kLatentChunks;
          src = base + kMlaPageSize * kMlaValueDim + (tok0 + r) * 16;
          d = dst + kFp8TileLatentBytes + r * 16;
        } else {
          const int k = i - kLatentChunks - kScaleChunks;
          r = k / 8;
          src = base + kMlaPageSize * (kMlaValueDim + 16) + tok0 * 128 + k * 16;
          d = dst + kFp8TileLatentBytes + kFp8TileScaleBytes + k * 16;
        }
        const bool valid = token0 + r < seqlen;
        CpAsync16(d, valid ? src : base, valid);  // past the length: zeros
      }
      return;
    }
    const __nv_bfloat16* src =
        p.kv_cache +
        (static_cast<size_t>(page) * kMlaPageSize + token0 % kMlaPageSize) * kMlaQkHeadDim;
    __nv_bfloat16* dst = skv + stage * (kTileTokens * kRowStride);
    for (int i = tid; i < kTileTokens * kChunksPerRow; i += kThreads) {
      const int r = i / kChunksPerRow, c = i % kChunksPerRow;
      const bool valid = token0 + r < seqlen;
      CpAsync16(dst + r * kRowStride + c * 8, valid ? src + r * kMlaQkHeadDim + c * 8 : src, valid);
    }
  };
  // Whether tile `s` of the prologue loads before the wait: every row of it is settled.
  const int settled_tiles = early ? MlaSettledTiles(p, seqlen, kTileTokens) : 0;
  const auto settled = [&](int s) { return s < n && tile_begin + s < settled_tiles; };
  if (early) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (settled(s)) load_tile(tile_begin + s, s);
    }
    PdlGridSync();
  }
  // Q for this block's heads; joins the first KV group.
  const __nv_bfloat16* q = p.q + (static_cast<size_t>(b) * h_q + head0) * kMlaQkHeadDim;
  for (int i = tid; i < kHeads * kChunksPerRow; i += kThreads) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    CpAsync16(sq + r * kRowStride + c * 8, q + r * kMlaQkHeadDim + c * 8, true);
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n && !settled(s)) load_tile(tile_begin + s, s);
    CpAsyncCommit();
  }
  for (int i = tid; i < kHeads; i += kThreads) {
    row_m[i] = -INFINITY;
    row_l[i] = 0.f;
  }
  __syncthreads();

  float o[kMTiles][8][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) o[mt][j][k] = 0.f;

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  // QK^T work split: warp w takes token n-tile (w % 4) and every other m-tile from (w / 4).
  constexpr int kQkMTilesPerWarp = kMTiles >= 2 ? kMTiles / 2 : 1;
  const int qk_ntile = warp % 4;
  const bool qk_active = kMTiles >= 2 || warp < 4;
  const int qk_mtile0 = kMTiles >= 2 ? warp / 4 : 0;
  constexpr int kThreadsPerRow = kThreads / kHeads;
  constexpr int kColsPerThread = kTileTokens / kThreadsPerRow;

  for (int it = 0; it < n; ++it) {
    const int tile = tile_begin + it;
    if (it + kStages - 1 < n) load_tile(tile + kStages - 1, (it + kStages - 1) % kStages);
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncthreads();
    if constexpr (kFp8) {
      DequantizeTile(sraw + (it % kStages) * kFp8TileBytes, skv, tid);
      __syncthreads();
    }
    const __nv_bfloat16* kvs = skv + (kFp8 ? 0 : (it % kStages) * (kTileTokens * kRowStride));

    if (qk_active) {
      float s[kQkMTilesPerWarp][4];
#pragma unroll
      for (int j = 0; j < kQkMTilesPerWarp; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) s[j][k] = 0.f;
      // ldmatrix addressing. K (B operand, [token][dim]): lane -> token n0 + (lane & 7), dims
      // k0 + 8 * (lane >> 3): b0, b1 of k-step k0 and b0, b1 of k-step k0 + 16. Q (A operand):
      // lane -> head row (lane & 15), dims k0 + 8 * (lane >> 4): a0..a3 of one m-tile.
      const __nv_bfloat16* kaddr = kvs + (qk_ntile * 8 + (lane & 7)) * kRowStride + (lane >> 3) * 8;
      const __nv_bfloat16* qaddr =
          sq + (qk_mtile0 * 16 + (lane & 15)) * kRowStride + (lane >> 4) * 8;
#pragma unroll 3
      for (int k0 = 0; k0 < kMlaQkHeadDim; k0 += 32) {
        uint32_t bk[4];
        LdMatrixX4(bk, kaddr + k0);
#pragma unroll
        for (int j = 0; j < kQkMTilesPerWarp; ++j) {
          uint32_t a0[4], a1[4];
          LdMatrixX4(a0, qaddr + 2 * j * 16 * kRowStride + k0);
          LdMatrixX4(a1, qaddr + 2 * j * 16 * kRowStride + k0 + 16);
          Mma(s[j], a0, bk[0], bk[1]);
          Mma(s[j], a1, bk[2], bk[3]);
        }
      }
      const int col = qk_ntile * 8 + 2 * t;
      const int token = tile * kTileTokens + col;
#pragma unroll
      for (int j = 0; j < kQkMTilesPerWarp; ++j) {
        const int row = (qk_mtile0 + 2 * j) * 16 + g;
        float* s0 = ss + row * L::kSStride + col;
        float* s8 = s0 + 8 * L::kSStride;
        s0[0] = token < seqlen ? s[j][0] * scale_log2 : -INFINITY;
        s0[1] = token + 1 < seqlen ? s[j][1] * scale_log2 : -INFINITY;
        s8[0] = token < seqlen ? s[j][2] * scale_log2 : -INFINITY;
        s8[1] = token + 1 < seqlen ? s[j][3] * scale_log2 : -INFINITY;
      }
    }
    __syncthreads();

    {  // Online softmax: kThreadsPerRow consecutive lanes per head row.
      const int row = tid / kThreadsPerRow, sub = tid % kThreadsPerRow;
      const float* srow = ss + row * L::kSStride + sub * kColsPerThread;
      float v[kColsPerThread];
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        v[c] = srow[c];
        mx = fmaxf(mx, v[c]);
      }
#pragma unroll
      for (int off = kThreadsPerRow / 2; off > 0; off /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = row_m[row];
      const float m_new = fmaxf(m_old, mx);
      const float base = m_new == -INFINITY ? 0.f : m_new;
      float sum = 0.f;
      __nv_bfloat16* prow = sp + row * L::kPStride + sub * kColsPerThread;
#pragma unroll
      for (int c = 0; c < kColsPerThread; c += 2) {
        const __nv_bfloat162 pv = __floats2bfloat162_rn(exp2f(v[c] - base), exp2f(v[c + 1] - base));
        *reinterpret_cast<__nv_bfloat162*>(prow + c) = pv;
        sum += __low2float(pv) + __high2float(pv);
      }
#pragma unroll
      for (int off = kThreadsPerRow / 2; off > 0; off /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (sub == 0) {
        const float alpha = exp2f(m_old - base);
        row_alpha[row] = alpha;
        row_l[row] = row_l[row] * alpha + sum;
        row_m[row] = m_new;
      }
    }
    __syncthreads();

    // PV: out[heads][64w .. 64w+64) += P[heads][32] * V[32][64w ..].
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const float a_lo = row_alpha[mt * 16 + g], a_hi = row_alpha[mt * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[mt][j][0] *= a_lo;
        o[mt][j][1] *= a_lo;
        o[mt][j][2] *= a_hi;
        o[mt][j][3] *= a_hi;
      }
    }
#pragma unroll
    for (int k0 = 0; k0 < kTileTokens; k0 += 16) {
      uint32_t bv[4][4];
      const int vrow = k0 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        const int vcol = warp * 64 + np * 16 + (lane >> 4) * 8;
        LdMatrixX4Trans(bv[np], kvs + vrow * kRowStride + vcol);
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        uint32_t a[4];
        LoadA(a, sp + mt * 16 * L::kPStride + k0, L::kPStride, g, t);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          Mma(o[mt][2 * np], a, bv[np][0], bv[np][1]);
          Mma(o[mt][2 * np + 1], a, bv[np][2], bv[np][3]);
        }
      }
    }
    __syncthreads();  // the next iteration refills this stage and rewrites S, P, alpha
  }
  CpAsyncWait<0>();

  // Epilogue: normalise; write the final output (one split) or this split's partial.
  const bool direct = p.num_splits == 1;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * 16 + g + half * 8;
      const float l = row_l[row];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int head = head0 + row;
      if (direct) {
        __nv_bfloat16* out = p.out + (static_cast<size_t>(b) * h_q + head) * kMlaValueDim;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = warp * 64 + j * 8 + 2 * t;
          *reinterpret_cast<__nv_bfloat162*>(out + col) =
              __floats2bfloat162_rn(o[mt][j][2 * half] * inv, o[mt][j][2 * half + 1] * inv);
        }
      } else {
        float* out = p.o_accum +
                     ((static_cast<size_t>(b) * p.num_splits + split) * h_q + head) * kMlaValueDim;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = warp * 64 + j * 8 + 2 * t;
          *reinterpret_cast<float2*>(out + col) =
              make_float2(o[mt][j][2 * half] * inv, o[mt][j][2 * half + 1] * inv);
        }
      }
    }
  }
  if (tid < kHeads) {
    const float l = row_l[tid];
    const float lse = l > 0.f ? (row_m[tid] + log2f(l)) * 0.6931471805599453f : -INFINITY;
    const int head = head0 + tid;
    if (direct) {
      p.lse[static_cast<size_t>(b) * h_q + head] = lse;
    } else {
      p.lse_accum[(static_cast<size_t>(b) * p.num_splits + split) * h_q + head] = lse;
    }
  }
}

// Merges the splits of one (sequence, head) row per block of kCombineThreads (warps over splits).
inline constexpr int kCombineWarps = 8;
inline constexpr int kCombineThreads = kCombineWarps * 32;
__global__ void __launch_bounds__(kCombineThreads) MlaDecodeCombineKernel(MlaDecodeParams p);

// Sets the kernel's shared memory and launches it (programmatic dependent launch).
template <int kMTiles, bool kFp8>
absl::Status LaunchSplitKvKernel(const MlaDecodeParams& params, cudaStream_t stream) {
  using L = Layout<kMTiles, kFp8>;
  constexpr int kSmem = L::kTotalBytes;
  static_assert(kSmem * L::kBlocksPerSm <= 227 * 1024, "shared memory of the blocks of an SM");
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(MlaDecodeSplitKvKernel<kMTiles, kFp8>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(params.num_splits, params.batch, params.num_heads_q / L::kHeads);
  (void)LaunchPdl(MlaDecodeSplitKvKernel<kMTiles, kFp8>, grid, dim3(kThreads), kSmem, stream,
                  params);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels::mla_detail
