// Device pieces the prefill attention kernels share (prefill_attention.cu, the mma.sync and
// cp.async variants; prefill_attention_sm90.cu, the TMA + wgmma one): the online-softmax step and
// the epilogue in the mma.sync accumulator layout (which is also each warp's share of a wgmma
// accumulator), and P V on wgmma with P in registers. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/sm80_ptx.cuh"
#include "kernels/prefill_attention/prefill_attention.h"

namespace strata::kernels::prefill_detail {

inline constexpr int kBlockN = 64;  // keys per tile
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// What a block of `block_m` query rows works on: sequence blockIdx.z, rows [m0, m0 + block_m) (the
// grid's last x blocks first: the longest causal ones start first). m0 >= q_len: nothing (the
// sequence is shorter than the grid's longest).
struct PrefillBlock {
  int q_begin, q_len, k_begin, k_len;
  int m0;
};

__device__ __forceinline__ PrefillBlock LocatePrefillBlock(const PrefillAttentionParams& p,
                                                           int block_m) {
  const int b = blockIdx.z;
  PrefillBlock r;
  r.q_begin = p.cu_seqlens_q[b];
  r.q_len = p.cu_seqlens_q[b + 1] - r.q_begin;
  r.k_begin = p.cu_seqlens_k[b];
  r.k_len = p.cu_seqlens_k[b + 1] - r.k_begin;
  r.m0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * block_m;
  return r;
}

// The 64-key tiles rows [m0, m0 + block_m) see; row i sees keys j <= i + offset when causal
// (offset = k_len - q_len: bottom-right aligned).
__device__ __forceinline__ int PrefillKeyTiles(const PrefillBlock& blk, int offset, bool causal,
                                               int block_m) {
  const int k_end = causal ? min(blk.k_len, blk.m0 + block_m + offset) : blk.k_len;
  return k_end > 0 ? (k_end + kBlockN - 1) / kBlockN : 0;
}

// o (64 x 128 per warpgroup, mma.sync C layout per warp) += P (registers, mma.sync A layout) x
// V (16 keys x 128 dims, MN-major, descriptor; transposed B).
__device__ __forceinline__ void WgmmaPV(float (&o)[kPrefillVDim / 8][4], const uint32_t (&a)[4],
                                        uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, "
      "1, 1, 1;\n"
      : "+f"(o[0][0]), "+f"(o[0][1]), "+f"(o[0][2]), "+f"(o[0][3]), "+f"(o[1][0]), "+f"(o[1][1]),
        "+f"(o[1][2]), "+f"(o[1][3]), "+f"(o[2][0]), "+f"(o[2][1]), "+f"(o[2][2]), "+f"(o[2][3]),
        "+f"(o[3][0]), "+f"(o[3][1]), "+f"(o[3][2]), "+f"(o[3][3]), "+f"(o[4][0]), "+f"(o[4][1]),
        "+f"(o[4][2]), "+f"(o[4][3]), "+f"(o[5][0]), "+f"(o[5][1]), "+f"(o[5][2]), "+f"(o[5][3]),
        "+f"(o[6][0]), "+f"(o[6][1]), "+f"(o[6][2]), "+f"(o[6][3]), "+f"(o[7][0]), "+f"(o[7][1]),
        "+f"(o[7][2]), "+f"(o[7][3]), "+f"(o[8][0]), "+f"(o[8][1]), "+f"(o[8][2]), "+f"(o[8][3]),
        "+f"(o[9][0]), "+f"(o[9][1]), "+f"(o[9][2]), "+f"(o[9][3]), "+f"(o[10][0]), "+f"(o[10][1]),
        "+f"(o[10][2]), "+f"(o[10][3]), "+f"(o[11][0]), "+f"(o[11][1]), "+f"(o[11][2]),
        "+f"(o[11][3]), "+f"(o[12][0]), "+f"(o[12][1]), "+f"(o[12][2]), "+f"(o[12][3]),
        "+f"(o[13][0]), "+f"(o[13][1]), "+f"(o[13][2]), "+f"(o[13][3]), "+f"(o[14][0]),
        "+f"(o[14][1]), "+f"(o[14][2]), "+f"(o[14][3]), "+f"(o[15][0]), "+f"(o[15][1]),
        "+f"(o[15][2]), "+f"(o[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

// Online-softmax step for one key tile of this thread's two rows: masks (keys >= k_len, or past
// the causal diagonal), updates the running max/sum, turns s into P (fp32, in place), and returns
// in corr the factor by which the rows' o must be rescaled. SoftmaxStep then rescales and packs P
// at once; a caller with P V still in flight does both once that is done (registers a wgmma in
// flight reads must not be written).
__device__ __forceinline__ void SoftmaxP(float (&s)[kBlockN / 8][4], float (&row_max)[2],
                                         float (&row_sum)[2], float (&corr)[2], int key0,
                                         bool need_mask, int k_len, bool causal, int row0,
                                         int offset, float scale_log2) {
  const int lane = threadIdx.x % 32;
  float new_max[2] = {row_max[0], row_max[1]};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[j][e] * scale_log2;
      if (need_mask) {
        const int key = key0 + j * 8 + 2 * (lane % 4) + (e & 1);
        const int row = row0 + (e >> 1) * 8;
        if (key >= k_len || (causal && key > row + offset)) x = -INFINITY;
      }
      s[j][e] = x;
      new_max[e >> 1] = fmaxf(new_max[e >> 1], x);
    }
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(0xffffffffu, new_max[r], 1));
    new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(0xffffffffu, new_max[r], 2));
    base[r] = new_max[r] == -INFINITY ? 0.f : new_max[r];  // fully masked row so far
    corr[r] = exp2f(row_max[r] - base[r]);                 // 0 when row_max = -inf
    row_max[r] = new_max[r];
    row_sum[r] *= corr[r];
  }
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const float p0 = exp2f(s[j][0] - base[0]), p1 = exp2f(s[j][1] - base[0]);
    const float p2 = exp2f(s[j][2] - base[1]), p3 = exp2f(s[j][3] - base[1]);
    row_sum[0] += p0 + p1;
    row_sum[1] += p2 + p3;
    s[j][0] = p0;
    s[j][1] = p1;
    s[j][2] = p2;
    s[j][3] = p3;
  }
}

// P (fp32, the mma.sync C layout of 16 rows x 64 keys) as bf16 A fragments of 16-key k-steps.
__device__ __forceinline__ void PackP(const float (&s)[kBlockN / 8][4],
                                      uint32_t (&pa)[kBlockN / 16][4]) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    pa[j / 2][(j % 2) * 2 + 0] = PackBf16(s[j][0], s[j][1]);
    pa[j / 2][(j % 2) * 2 + 1] = PackBf16(s[j][2], s[j][3]);
  }
}

__device__ __forceinline__ void RescaleRows(float (&o)[kPrefillVDim / 8][4],
                                            const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < kPrefillVDim / 8; ++j) {
    o[j][0] *= corr[0];
    o[j][1] *= corr[0];
    o[j][2] *= corr[1];
    o[j][3] *= corr[1];
  }
}

__device__ __forceinline__ void SoftmaxStep(float (&s)[kBlockN / 8][4],
                                            float (&o)[kPrefillVDim / 8][4], float (&row_max)[2],
                                            float (&row_sum)[2], uint32_t (&pa)[kBlockN / 16][4],
                                            int key0, bool need_mask, int k_len, bool causal,
                                            int row0, int offset, float scale_log2) {
  float corr[2];
  SoftmaxP(s, row_max, row_sum, corr, key0, need_mask, k_len, causal, row0, offset, scale_log2);
  RescaleRows(o, corr);
  PackP(s, pa);
}

// Epilogue for this thread's two rows: finishes the row sums over the 4 lanes of a row,
// normalizes, merges with the stored out/lse when accumulating, stores out (bf16) and lse.
__device__ __forceinline__ void Epilogue(const PrefillAttentionParams& p,
                                         float (&o)[kPrefillVDim / 8][4], float (&row_max)[2],
                                         float (&row_sum)[2], int row0, int q_len, int q_begin,
                                         int head) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    if (row >= q_len) continue;
    const float lse_new = row_sum[r] > 0.f ? row_max[r] * kLn2 + logf(row_sum[r]) : -INFINITY;
    float w_new = row_sum[r] > 0.f ? 1.f / row_sum[r] : 0.f;
    float w_old = 0.f, lse = lse_new;
    const int64_t qrow = q_begin + row;
    float* lse_ptr = p.lse + qrow * p.num_heads + head;
    __nv_bfloat16* out =
        p.out + qrow * p.out_token_stride + static_cast<int64_t>(head) * p.out_head_stride;
    if (p.accumulate) {
      const float lse_old = *lse_ptr;
      if (lse_old != -INFINITY) {
        const float mx = fmaxf(lse_old, lse_new);
        const float e_old = expf(lse_old - mx),
                    e_new = lse_new == -INFINITY ? 0.f : expf(lse_new - mx);
        lse = mx + logf(e_old + e_new);
        w_old = e_old / (e_old + e_new);
        w_new *= e_new / (e_old + e_new);
      }
    }
#pragma unroll
    for (int j = 0; j < kPrefillVDim / 8; ++j) {
      const int col = j * 8 + 2 * (lane % 4);
      float v0 = o[j][2 * r] * w_new, v1 = o[j][2 * r + 1] * w_new;
      if (w_old != 0.f) {
        const __nv_bfloat162 old = *reinterpret_cast<const __nv_bfloat162*>(out + col);
        v0 += w_old * __bfloat162float(old.x);
        v1 += w_old * __bfloat162float(old.y);
      }
      *reinterpret_cast<__nv_bfloat162*>(out + col) = __floats2bfloat162_rn(v0, v1);
    }
    if (lane % 4 == 0) *lse_ptr = lse;
  }
}

}  // namespace strata::kernels::prefill_detail
