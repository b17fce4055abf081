// Prefill attention, FlashAttention-2 style on mma.sync (m16n8k16 bf16, fp32 accumulate).
//
// One block of 8 (or 4) warps takes 128 (64) query rows of one (sequence, head); warp w owns rows
// [16w, 16w + 16). Key/value tiles of 64 tokens stream through a 2-stage cp.async ring; S = Q K^T
// and O += P V run on the tensor cores with ldmatrix operands; the online softmax is in base 2.
// Shared memory rows are padded by 16 bytes so ldmatrix's 8 row addresses hit distinct banks.
#include <cmath>
#include <string>

#include "kernels/common/alignment.h"
#include "kernels/common/sm80_ptx.cuh"
#include "kernels/common/sm90_device.h"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/prefill_attention/prefill_attention.cuh"
#include "kernels/prefill_attention/prefill_attention.h"

namespace strata::kernels {
namespace {

using prefill_detail::Epilogue;
using prefill_detail::kBlockN;
using prefill_detail::kLn2;
using prefill_detail::kLog2e;
using prefill_detail::LocatePrefillBlock;
using prefill_detail::PrefillBlock;
using prefill_detail::PrefillKeyTiles;
using prefill_detail::SoftmaxStep;
using prefill_detail::WgmmaPV;

constexpr int kQkStride = kPrefillQkDim + 8;  // bf16 elements per shared row
constexpr int kVStride = kPrefillVDim + 8;
constexpr int kKStageBytes = kBlockN * kQkStride * 2;
constexpr int kVStageBytes = kBlockN * kVStride * 2;
// Per variant: kWarps warps of 16 query rows each.
template <int kWarps>
struct Shape {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kQBytes = kBlockM * kQkStride * 2;
  static constexpr int kSmemBytes = kQBytes + 2 * kKStageBytes + 2 * kVStageBytes;
};

// Copies `rows` rows of `dim` bf16 (row r at src + r * stride) into shared rows of
// `smem_stride`; rows at or past `valid` are zero-filled without reading.
template <int kRows, int kDim, int kSmemStride, int kThreads>
__device__ __forceinline__ void LoadTile(__nv_bfloat16* smem, const __nv_bfloat16* src,
                                         int64_t stride, int valid) {
  constexpr int kChunks = kDim / 8;
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid;
    CpAsync16(smem + r * kSmemStride + col, ok ? src + r * stride + col : src, ok);
  }
}

// K tile for wgmma: the no-swizzle K-major canonical layout of core matrices (8 rows x 16 bytes,
// 128 contiguous bytes): element (r, k) at byte (r / 8) * kCoreSbo + (k / 8) * kCoreLbo +
// (r % 8) * 16 + (k % 8) * 2.
constexpr int kCoreLbo = 128;                      // next 8 k (K direction)
constexpr int kCoreSbo = kPrefillQkDim / 8 * 128;  // next 8 rows (N direction)

template <int kRows, int kThreads>
__device__ __forceinline__ void LoadTileCore(unsigned char* smem, const __nv_bfloat16* src,
                                             int64_t stride, int valid) {
  constexpr int kChunks = kPrefillQkDim / 8;
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c / kChunks, kc = c % kChunks;
    const bool ok = r < valid;
    CpAsync16(smem + (r / 8) * kCoreSbo + kc * kCoreLbo + (r % 8) * 16,
              ok ? src + r * stride + kc * 8 : src, ok);
  }
}

// Shared-memory matrix descriptor (PTX "matrix descriptor format"), no swizzle: LBO = byte offset
// between core matrices along K, SBO = along M/N (verified on the H200: the swapped reading fails
// the test).
__device__ __forceinline__ uint64_t MakeDesc(const void* smem_ptr) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  const uint64_t lbo = kCoreLbo;
  const uint64_t sbo = kCoreSbo;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32);
}

// s (64 x 64 per warpgroup, this warp's 16 rows in mma.sync C layout) = or += A (registers, the
// mma.sync A layout of this warp's 16 rows) x B (64 keys x 16 k, K-major, descriptor).
__device__ __forceinline__ void WgmmaS(float (&s)[8][4], const uint32_t (&a)[4], uint64_t desc,
                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]),
        "+f"(s[1][2]), "+f"(s[1][3]), "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]),
        "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3]), "+f"(s[4][0]), "+f"(s[4][1]),
        "+f"(s[4][2]), "+f"(s[4][3]), "+f"(s[5][0]), "+f"(s[5][1]), "+f"(s[5][2]), "+f"(s[5][3]),
        "+f"(s[6][0]), "+f"(s[6][1]), "+f"(s[6][2]), "+f"(s[6][3]), "+f"(s[7][0]), "+f"(s[7][1]),
        "+f"(s[7][2]), "+f"(s[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(0), "r"(accumulate));
}

// V tile for wgmma as the B operand of P V (K = keys, N = dims), MN-major (dims contiguous): core
// matrices of 8 keys x 8 dims (128 contiguous bytes); element (key, dim) at byte
// (dim / 8) * kVCoreDim + (key / 8) * kVCoreKey + (key % 8) * 16 + (dim % 8) * 2.
constexpr int kVCoreKey = 128;                // next 8 keys (K direction)
constexpr int kVCoreDim = kBlockN / 8 * 128;  // next 8 dims (N direction)

template <int kThreads>
__device__ __forceinline__ void LoadVCore(unsigned char* smem, const __nv_bfloat16* src,
                                          int64_t stride, int valid) {
  constexpr int kChunks = kPrefillVDim / 8;
#pragma unroll
  for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c / kChunks, dc = c % kChunks;
    const bool ok = r < valid;
    CpAsync16(smem + dc * kVCoreDim + (r / 8) * kVCoreKey + (r % 8) * 16,
              ok ? src + r * stride + dc * 8 : src, ok);
  }
}

// Descriptor of the V tile: the key-direction (K) offset in LBO, the dim-direction (N) offset in
// SBO (verified on the H200: the swapped reading fails the test).
__device__ __forceinline__ uint64_t MakeDescV(const void* smem_ptr) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  const uint64_t lbo = kVCoreKey;
  const uint64_t sbo = kVCoreDim;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32);
}

// kSMode: 0 = S by mma.sync from padded shared rows; 1 = S by wgmma (A = Q registers, B = K
// core-matrix tile by descriptor).
// kPvMode: 0 = P V by mma.sync (ldmatrix.trans); 1 = by wgmma, V tile MN-major by descriptor.
// kQInRegs: Q's A fragments are loaded into registers once (48 registers) instead of being
// re-read from shared memory for every key tile.
template <bool kQInRegs, int kWarps, int kSMode, int kPvMode>
__global__ void __launch_bounds__(Shape<kWarps>::kThreads, 8 / kWarps)
    PrefillAttentionKernel(PrefillAttentionParams p) {
  constexpr int kThreads = Shape<kWarps>::kThreads;
  constexpr int kBlockM = Shape<kWarps>::kBlockM;
  constexpr int kQBytes = Shape<kWarps>::kQBytes;
  static_assert(kSMode == 0 || (kQInRegs && kWarps % 4 == 0), "wgmma needs Q in registers");
  static_assert(kPvMode == 0 || kWarps % 4 == 0, "wgmma needs whole warpgroups");
  extern __shared__ __align__(128) unsigned char smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  auto* sK = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes);
  auto* sV = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes + 2 * kKStageBytes);

  const int head = blockIdx.y;
  const PrefillBlock blk = LocatePrefillBlock(p, kBlockM);
  const int q_begin = blk.q_begin, q_len = blk.q_len, k_begin = blk.k_begin, k_len = blk.k_len;
  const int m0 = blk.m0;
  if (m0 >= q_len) return;
  const int offset = k_len - q_len;  // row i sees keys j <= i + offset when causal
  const int n_tiles = PrefillKeyTiles(blk, offset, p.causal, kBlockM);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const __nv_bfloat16* q = p.q + static_cast<int64_t>(q_begin + m0) * p.q_token_stride +
                           static_cast<int64_t>(head) * p.q_head_stride;
  const __nv_bfloat16* k = p.k + static_cast<int64_t>(k_begin) * p.k_token_stride +
                           static_cast<int64_t>(head) * p.k_head_stride;
  const __nv_bfloat16* v = p.v + static_cast<int64_t>(k_begin) * p.v_token_stride +
                           static_cast<int64_t>(head) * p.v_head_stride;

  LoadTile<kBlockM, kPrefillQkDim, kQkStride, kThreads>(sQ, q, p.q_token_stride, q_len - m0);
  if (n_tiles > 0) {
    if (kSMode == 0) {
      LoadTile<kBlockN, kPrefillQkDim, kQkStride, kThreads>(sK, k, p.k_token_stride, k_len);
    } else {
      LoadTileCore<kBlockN, kThreads>(smem + kQBytes, k, p.k_token_stride, k_len);
    }
    if (kPvMode == 0) {
      LoadTile<kBlockN, kPrefillVDim, kVStride, kThreads>(sV, v, p.v_token_stride, k_len);
    } else {
      LoadVCore<kThreads>(smem + kQBytes + 2 * kKStageBytes, v, p.v_token_stride, k_len);
    }
  }
  CpAsyncCommit();

  float o[kPrefillVDim / 8][4];
#pragma unroll
  for (int j = 0; j < kPrefillVDim / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale * kLog2e;
  // Rows of this thread (within the sequence): g and g + 8 of the warp's 16.
  const int row0 = m0 + warp * 16 + lane / 4;

  uint32_t qf[kQInRegs ? kPrefillQkDim / 16 : 1][4];
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < n_tiles) {
      const int next = (t + 1) * kBlockN;
      if (kSMode == 0) {
        LoadTile<kBlockN, kPrefillQkDim, kQkStride, kThreads>(
            sK + (stage ^ 1) * kBlockN * kQkStride,
            k + static_cast<int64_t>(next) * p.k_token_stride, p.k_token_stride, k_len - next);
      } else {
        LoadTileCore<kBlockN, kThreads>(smem + kQBytes + (stage ^ 1) * kKStageBytes,
                                        k + static_cast<int64_t>(next) * p.k_token_stride,
                                        p.k_token_stride, k_len - next);
      }
      if (kPvMode == 0) {
        LoadTile<kBlockN, kPrefillVDim, kVStride, kThreads>(
            sV + (stage ^ 1) * kBlockN * kVStride,
            v + static_cast<int64_t>(next) * p.v_token_stride, p.v_token_stride, k_len - next);
      } else {
        LoadVCore<kThreads>(smem + kQBytes + 2 * kKStageBytes + (stage ^ 1) * kVStageBytes,
                            v + static_cast<int64_t>(next) * p.v_token_stride, p.v_token_stride,
                            k_len - next);
      }
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    // cp.async writes are generic-proxy stores; wgmma reads through the async proxy.
    if (kSMode != 0 || kPvMode != 0) {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    if (kQInRegs && t == 0) {
#pragma unroll
      for (int ks = 0; ks < (kQInRegs ? kPrefillQkDim / 16 : 0); ++ks) {
        LdMatrixX4(qf[ks], sQ + (warp * 16 + lane % 16) * kQkStride + ks * 16 + (lane / 16) * 8);
      }
    }
    const __nv_bfloat16* tK = sK + stage * kBlockN * kQkStride;
    const __nv_bfloat16* tV = sV + stage * kBlockN * kVStride;
    float s[kBlockN / 8][4];
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    if (kSMode != 0) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < kPrefillQkDim / 16; ++ks) {
        WgmmaS(s, qf[kQInRegs ? ks : 0],
               MakeDesc(smem + kQBytes + stage * kKStageBytes + ks * 2 * kCoreLbo), ks > 0 ? 1 : 0);
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    } else {
#pragma unroll
      for (int ks = 0; ks < kPrefillQkDim / 16; ++ks) {
        uint32_t a[4];
        if (kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = qf[kQInRegs ? ks : 0][i];
        } else {
          LdMatrixX4(a, sQ + (warp * 16 + lane % 16) * kQkStride + ks * 16 + (lane / 16) * 8);
        }
#pragma unroll
        for (int np = 0; np < kBlockN / 16; ++np) {
          uint32_t bk[4];
          LdMatrixX4(bk, tK + (np * 16 + (lane / 16) * 8 + lane % 8) * kQkStride + ks * 16 +
                             ((lane / 8) % 2) * 8);
          Mma(s[2 * np], a, bk[0], bk[1]);
          Mma(s[2 * np + 1], a, bk[2], bk[3]);
        }
      }
    }
    // Mask keys past k_len and, when causal, past each row's diagonal.
    const int key0 = t * kBlockN;
    const bool need_mask = key0 + kBlockN > k_len || (p.causal && key0 + kBlockN - 1 > m0 + offset);
    uint32_t pa[kBlockN / 16][4];
    SoftmaxStep(s, o, row_max, row_sum, pa, key0, need_mask, k_len, p.causal, row0, offset,
                scale_log2);
    if (kPvMode != 0) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        WgmmaPV(o, pa[kk],
                MakeDescV(smem + kQBytes + 2 * kKStageBytes + stage * kVStageBytes +
                          kk * 2 * kVCoreKey));
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    } else {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < kPrefillVDim / 16; ++dp) {
          uint32_t bv[4];
          LdMatrixX4Trans(bv, tV + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kVStride +
                                  dp * 16 + (lane / 16) * 8);
          Mma(o[2 * dp], pa[kk], bv[0], bv[1]);
          Mma(o[2 * dp + 1], pa[kk], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  CpAsyncWait<0>();

  Epilogue(p, o, row_max, row_sum, row0, q_len, q_begin, head);
}

// Variant 6: both GEMMs on wgmma, 8 warps (2 warpgroups of 64 rows), K/V tiles in a 3-stage
// cp.async ring, and S(t+1) = Q K(t+1)^T issued asynchronously before the softmax of tile t, so the
// tensor cores work during the softmax; P(t) V(t) and S(t+1) are waited for together.
constexpr int kOvStages = 3;
constexpr int kOvThreads = 256;
constexpr int kOvBlockM = 128;
constexpr int kOvQBytes = kOvBlockM * kQkStride * 2;
constexpr int kOvSmemBytes = kOvQBytes + kOvStages * (kKStageBytes + kVStageBytes);

__global__ void __launch_bounds__(kOvThreads, 1)
    PrefillAttentionOverlapKernel(PrefillAttentionParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* sK = smem + kOvQBytes;
  unsigned char* sV = sK + kOvStages * kKStageBytes;

  const int head = blockIdx.y;
  const PrefillBlock blk = LocatePrefillBlock(p, kOvBlockM);
  const int q_begin = blk.q_begin, q_len = blk.q_len, k_begin = blk.k_begin, k_len = blk.k_len;
  const int m0 = blk.m0;
  if (m0 >= q_len) return;
  const int offset = k_len - q_len;  // row i sees keys j <= i + offset when causal
  const int n_tiles = PrefillKeyTiles(blk, offset, p.causal, kOvBlockM);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const __nv_bfloat16* q = p.q + static_cast<int64_t>(q_begin + m0) * p.q_token_stride +
                           static_cast<int64_t>(head) * p.q_head_stride;
  const __nv_bfloat16* k = p.k + static_cast<int64_t>(k_begin) * p.k_token_stride +
                           static_cast<int64_t>(head) * p.k_head_stride;
  const __nv_bfloat16* v = p.v + static_cast<int64_t>(k_begin) * p.v_token_stride +
                           static_cast<int64_t>(head) * p.v_head_stride;
  // One cp.async group per tile (tile 0's also holds Q); empty groups keep the count uniform.
  auto load_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int first = tile * kBlockN;
      LoadTileCore<kBlockN, kOvThreads>(sK + (tile % kOvStages) * kKStageBytes,
                                        k + static_cast<int64_t>(first) * p.k_token_stride,
                                        p.k_token_stride, k_len - first);
      LoadVCore<kOvThreads>(sV + (tile % kOvStages) * kVStageBytes,
                            v + static_cast<int64_t>(first) * p.v_token_stride, p.v_token_stride,
                            k_len - first);
    }
    CpAsyncCommit();
  };
  auto issue_s = [&](float(&acc)[kBlockN / 8][4], const uint32_t(&qf)[kPrefillQkDim / 16][4],
                     int tile) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < kPrefillQkDim / 16; ++ks) {
      WgmmaS(acc, qf[ks], MakeDesc(sK + (tile % kOvStages) * kKStageBytes + ks * 2 * kCoreLbo),
             ks > 0 ? 1 : 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    sm90::PinRegisters(acc);
  };

  LoadTile<kOvBlockM, kPrefillQkDim, kQkStride, kOvThreads>(sQ, q, p.q_token_stride, q_len - m0);
  load_tile(0);
  load_tile(1);

  float o[kPrefillVDim / 8][4];
#pragma unroll
  for (int j = 0; j < kPrefillVDim / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int row0 = m0 + warp * 16 + lane / 4;

  if (n_tiles > 0) {
    CpAsyncWait<1>();  // Q and tile 0
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    uint32_t qf[kPrefillQkDim / 16][4];
#pragma unroll
    for (int ks = 0; ks < kPrefillQkDim / 16; ++ks) {
      LdMatrixX4(qf[ks], sQ + (warp * 16 + lane % 16) * kQkStride + ks * 16 + (lane / 16) * 8);
    }
    float s[kBlockN / 8][4], s_next[kBlockN / 8][4];
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      s_next[j][0] = s_next[j][1] = s_next[j][2] = s_next[j][3] = 0.f;
    }
    issue_s(s, qf, 0);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    sm90::PinRegisters(s);

    for (int t = 0; t < n_tiles; ++t) {
      const bool has_next = t + 1 < n_tiles;
      if (has_next) {
        CpAsyncWait<0>();  // tile t + 1 (the newest group)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      }
      // All warps are done with tile t - 1 (its PV waited for at the end of t - 1): its stage
      // takes tile t + 2.
      __syncthreads();
      load_tile(t + 2);
      if (has_next) issue_s(s_next, qf, t + 1);

      const int key0 = t * kBlockN;
      const bool need_mask =
          key0 + kBlockN > k_len || (p.causal && key0 + kBlockN - 1 > m0 + offset);
      uint32_t pa[kBlockN / 16][4];
      SoftmaxStep(s, o, row_max, row_sum, pa, key0, need_mask, k_len, p.causal, row0, offset,
                  scale_log2);

      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        WgmmaPV(o, pa[kk], MakeDescV(sV + (t % kOvStages) * kVStageBytes + kk * 2 * kVCoreKey));
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      sm90::PinRegisters(o);
      sm90::PinRegisters(s_next);
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = s_next[j][e];
      }
    }
  }
  CpAsyncWait<0>();
  Epilogue(p, o, row_max, row_sum, row0, q_len, q_begin, head);
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchPrefillAttention: " + what);
}

}  // namespace

absl::Status ValidatePrefillAttentionParams(const PrefillAttentionParams& p) {
  if (p.batch <= 0 || p.batch > 65535) return Invalid("batch must be in [1, 65535]");
  if (p.num_heads <= 0 || p.num_heads > 65535) return Invalid("num_heads must be in [1, 65535]");
  if (p.max_seqlen_q < 0) return Invalid("max_seqlen_q must be >= 0");
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.f) {
    return Invalid("softmax_scale must be finite and positive");
  }
  if (p.cu_seqlens_q == nullptr || p.cu_seqlens_k == nullptr || p.q == nullptr || p.k == nullptr ||
      p.v == nullptr || p.out == nullptr || p.lse == nullptr) {
    return Invalid("cu_seqlens_q/k, q, k, v, out and lse must be set");
  }
  if (Misaligned(p.q) || Misaligned(p.k) || Misaligned(p.v) || Misaligned(p.out)) {
    return Invalid("q, k, v and out must be 16-byte aligned");
  }
  if (p.total_k < 0) return Invalid("total_k must be >= 0 (0: unknown)");
  for (int64_t s : {p.q_token_stride, p.q_head_stride, p.k_token_stride, p.k_head_stride,
                    p.v_token_stride, p.v_head_stride, p.out_token_stride, p.out_head_stride}) {
    if (s < 0 || s % 8 != 0) return Invalid("strides must be non-negative multiples of 8");
  }
  return absl::OkStatus();
}

namespace {

template <bool kQInRegs, int kWarps, int kSMode = 0, int kPvMode = 0>
absl::Status LaunchVariant(const PrefillAttentionParams& p, cudaStream_t stream) {
  using S = Shape<kWarps>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(PrefillAttentionKernel<kQInRegs, kWarps, kSMode, kPvMode>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  if (attr != cudaSuccess) {
    return absl::InternalError(std::string("LaunchPrefillAttention: ") + cudaGetErrorString(attr));
  }
  const dim3 grid((p.max_seqlen_q + S::kBlockM - 1) / S::kBlockM, p.num_heads, p.batch);
  PrefillAttentionKernel<kQInRegs, kWarps, kSMode, kPvMode>
      <<<grid, S::kThreads, S::kSmemBytes, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchPrefillAttention: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchPrefillAttentionVariant(const PrefillAttentionParams& p, int variant,
                                           cudaStream_t stream) {
  if (absl::Status st = ValidatePrefillAttentionParams(p); !st.ok()) return st;
  if (p.max_seqlen_q == 0) return absl::OkStatus();
  switch (variant) {
    case 0:
      return LaunchVariant<false, 8>(p, stream);
    case 1:
      return LaunchVariant<true, 8>(p, stream);
    case 2:
      return LaunchVariant<false, 4>(p, stream);
    case 3:
      return LaunchVariant<true, 4>(p, stream);
    case 4:
      return LaunchVariant<true, 8, 1>(p, stream);
    case 5:
      return LaunchVariant<true, 8, 1, 1>(p, stream);
    case 6: {
      static const cudaError_t attr = cudaFuncSetAttribute(
          PrefillAttentionOverlapKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOvSmemBytes);
      if (attr != cudaSuccess) {
        return absl::InternalError(std::string("LaunchPrefillAttention: ") +
                                   cudaGetErrorString(attr));
      }
      const dim3 grid((p.max_seqlen_q + kOvBlockM - 1) / kOvBlockM, p.num_heads, p.batch);
      PrefillAttentionOverlapKernel<<<grid, kOvThreads, kOvSmemBytes, stream>>>(p);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) {
        return absl::InternalError(std::string("LaunchPrefillAttention: ") +
                                   cudaGetErrorString(err));
      }
      return absl::OkStatus();
    }
    case 7:
    case 8:
      return LaunchPrefillAttentionSm90(p, variant == 8, stream);
    default:
      return Invalid("unknown variant " + std::to_string(variant));
  }
}

int PrefillAttentionVariantFor(const PrefillAttentionParams& p) {
  return p.total_k > 0 && CurrentDeviceIsSm90() ? 8 : 1;
}

absl::Status LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  return LaunchPrefillAttentionVariant(p, PrefillAttentionVariantFor(p), stream);
}

}  // namespace strata::kernels
