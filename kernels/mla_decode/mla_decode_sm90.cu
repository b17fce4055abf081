// MLA decode for blocks of 64 query heads on Hopper (sm_90a), bf16 pages: the contract of
// mla_decode.h, computed with TMA and wgmma (the mma.sync kernel of mla_decode.cuh serves the other
// cases).
//
// A block has a producer warpgroup and two consumer warpgroups (384 threads; setmaxnreg moves the
// producer's registers to the consumers) and takes 64 heads of one sequence over one split's
// range of 64-token tiles (one tile = one page). With fewer heads left (h_q 16, 32, 48, 96, ...)
// the block still computes 64 rows, on whatever Q rows follow (TMA zero-fills past the end), and
// stores only its heads: the tensor work is not the bound of those shapes, the KV bytes are.
//  - The producer loads Q once, then each tile's page as 9 boxes of 64 tokens x 64 dims, by TMA
//    with the 128-byte swizzle, into a 2-stage ring (full/empty mbarriers).
//  - Consumer warpgroup g computes the partial S = Q K^T over dims [288g, 288g + 288) for the
//    whole tile (wgmma m64n64k16, both operands from shared memory); the two swap the partials of
//    each other's 32 token columns through shared memory, so warpgroup g holds the S of tokens
//    [32g, 32g + 32). Each scales and masks it, and the two exchange their row maxima (the online
//    softmax keeps one running max per head).
//  - Each writes its half of P (bf16) into a swizzled 64 x 64 tile over the tile's k_pe box (which
//    only S reads); then warpgroup g accumulates O[:, 256g, 256g + 256) += P V with V = the tile's
//    latent dims (wgmma m64n256k16, V read MN-major straight from the K layout). Row sums stay
//    per warpgroup and meet in the epilogue.
// Tokens of the last tile past the sequence are masked in S (-inf) and their V rows are zeroed in
// shared memory before P V (P is 0 there, but 0 x NaN is not).
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm90_device.h"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels {
namespace mla_sm90 {

using namespace ::strata::kernels::sm90;  // NOLINT(build/namespaces): PTX helper vocabulary

constexpr int kHeads = 64;
constexpr int kTile = kMlaPageSize;               // tokens per tile: one page
constexpr int kBoxCols = 64;                      // bf16 in one 128-byte swizzled row
constexpr int kBoxes = kMlaQkHeadDim / kBoxCols;  // 9 boxes per 576-wide matrix
constexpr int kBoxBytes = 64 * 128;               // 64 rows x 128 B
constexpr int kMatBytes = kBoxes * kBoxBytes;     // Q, or one KV tile: 73,728 B
constexpr int kStages = 2;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128;  // + a producer warpgroup
// Shared memory, from a 1,024-byte aligned base.
constexpr int kQOffset = 0;
constexpr int kKvOffset = kQOffset + kMatBytes;
constexpr int kXOffset = kKvOffset + kStages * kMatBytes;  // S partials from warpgroup 0
constexpr int kMaxOffset = kXOffset + kBoxBytes;           // row maxima [2][64] f32
constexpr int kSumOffset = kMaxOffset + 2 * kHeads * 4;    // row sums [2][64] f32
constexpr int kBarOffset = kSumOffset + 2 * kHeads * 4;    // q_full, full[2], empty[2]
constexpr int kSmemBytes = kBarOffset + (1 + 2 * kStages) * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

#define STRATA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define STRATA_F16(i) STRATA_F4(i), STRATA_F4(i + 4), STRATA_F4(i + 8), STRATA_F4(i + 12)

// d (64 x 256) += A (64 x 16, K-major) B (16 x 256, MN-major: imm-trans-b), by descriptor.
__device__ __forceinline__ void WgmmaM64N256(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,"
      "%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,"
      "%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,"
      "%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,"
      "%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,"
      "%123,%124,%125,%126,%127"
      "}, %128, %129, 1, 1, 1, 0, 1;\n"
      : STRATA_F16(0), STRATA_F16(16), STRATA_F16(32), STRATA_F16(48), STRATA_F16(64),
        STRATA_F16(80), STRATA_F16(96), STRATA_F16(112)
      : "l"(a), "l"(b));
}

#undef STRATA_F16
#undef STRATA_F4

__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeSm90Kernel(const __grid_constant__ MlaDecodeParams p,
                        const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap kv_map) {
  PdlGridSync();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint8_t* sq = smem + kQOffset;
  uint8_t* skv = smem + kKvOffset;
  uint8_t* sx = smem + kXOffset;
  float* red_max = reinterpret_cast<float*>(smem + kMaxOffset);
  float* red_sum = reinterpret_cast<float*>(smem + kSumOffset);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head0 = blockIdx.x * kHeads, split = blockIdx.y, b = blockIdx.z;
  const int h_q = p.num_heads_q;
  const int seqlen = max(0, min(p.seqlens[b], p.max_pages_per_seq * kMlaPageSize));
  const int num_tiles = (seqlen + kTile - 1) / kTile;
  const int per_split = (num_tiles + p.num_splits - 1) / p.num_splits;
  const int tile_begin = min(num_tiles, split * per_split);
  const int n = min(num_tiles, tile_begin + per_split) - tile_begin;

  if (tid == 0) {
    MbarInit(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warp >= kConsumerThreads / 32) {  // producer warpgroup: one warp issues, three idle
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (n == 0 || warp != kConsumerThreads / 32) return;
    const int32_t* table = p.block_table + static_cast<size_t>(b) * p.max_pages_per_seq;
    if (lane == 0) {
      PrefetchTensorMap(&q_map);
      PrefetchTensorMap(&kv_map);
      MbarArriveExpectTx(q_full, kMatBytes);
      for (int box = 0; box < kBoxes; ++box) {
        TmaLoad2d(sq + box * kBoxBytes, &q_map, box * kBoxCols, b * h_q + head0, q_full);
      }
    }
    for (int i0 = 0; i0 < n; i0 += 32) {  // 32 block-table entries per warp load
      const int mine = i0 + lane < n ? table[tile_begin + i0 + lane] : 0;
      for (int j = 0; j < min(32, n - i0); ++j) {
        const int page = __shfl_sync(0xffffffffu, mine, j);
        const int i = i0 + j, stage = i % kStages;
        if (lane == 0) {
          if (i >= kStages) MbarWait(&empty[stage], (i / kStages - 1) & 1);
          MbarArriveExpectTx(&full[stage], kMatBytes);
          uint8_t* dst = skv + stage * kMatBytes;
          for (int box = 0; box < kBoxes; ++box) {
            TmaLoad2d(dst + box * kBoxBytes, &kv_map, box * kBoxCols, page * kTile, &full[stage]);
          }
        }
        __syncwarp();
      }
    }
    return;
  }

  // Consumers. Warpgroup wg, warp wl in it: this thread's rows (heads) are row0 and row0 + 8,
  // its columns 2 (lane % 4) + {0, 1} of every 8-wide group (the wgmma accumulator layout).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int wg = tid / 128, wl = (tid / 32) % 4;
  const int row0 = 16 * wl + lane / 4;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  if (n > 0) MbarWait(q_full, 0);

  for (int i = 0; i < n; ++i) {
    const int stage = i % kStages, tile = tile_begin + i;
    uint8_t* kvs = skv + stage * kMatBytes;
    MbarWait(&full[stage], (i / kStages) & 1);
    const int valid = seqlen - tile * kTile;
    if (valid < kTile) {  // zero this warpgroup's V rows past the sequence (whole 128-byte rows)
      const int per_box = (kTile - valid) * 8;
      for (int k = tid % 128; k < 4 * per_box; k += 128) {
        const int box = 4 * wg + k / per_box, r = valid + (k % per_box) / 8, c = k % 8;
        *reinterpret_cast<uint4*>(kvs + box * kBoxBytes + r * 128 + c * 16) =
            make_uint4(0, 0, 0, 0);
      }
      FenceProxyAsync();
    }

    // S = Q K^T: warpgroup g over dims [288g, 288g + 288) for all 64 tokens (m64n64, at the
    // wide N where wgmma is efficient); each hands the other the partial sums of the other's 32
    // token columns (warpgroup 0 through the P buffer, warpgroup 1 through the k_pe box, which
    // only its own S reads), so each ends with the full S of its columns in the n32 layout.
    float s[16];
    {
      float s64[8][4];  // columns 8j..8j+7 in s64[j]: 0..31 in s64[0..3], 32..63 in s64[4..7]
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < kMlaQkHeadDim / 32; ++k) {
        const int ks = wg * (kMlaQkHeadDim / 32) + k;
        const int off = (ks / 4) * kBoxBytes + (ks % 4) * 32;
        WgmmaM64N64Ss(s64, DescKMajorSw128(sq + off), DescKMajorSw128(kvs + off), k > 0 ? 1 : 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      PinRegisters(s64);
      uint8_t* rope_box = kvs + (kBoxes - 1) * kBoxBytes;
      float* x_mine = reinterpret_cast<float*>(wg == 0 ? sx : rope_box);
      const float* x_other = reinterpret_cast<const float*>(wg == 0 ? rope_box : sx);
      const int t = tid % 128;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        x_mine[k * 128 + t] = wg == 0 ? s64[4 + k / 4][k % 4] : s64[k / 4][k % 4];
      }
      NamedBarrier(1, kConsumerThreads);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        s[k] = (wg == 0 ? s64[k / 4][k % 4] : s64[4 + k / 4][k % 4]) + x_other[k * 128 + t];
      }
    }
    // P goes over the k_pe box: free once both warpgroups have read the exchange (barrier below).
    uint8_t* ptile = kvs + (kBoxes - 1) * kBoxBytes;

    // Scale to base 2, mask, row maxima over both warpgroups.
    const int col0 = tile * kTile + 32 * wg + 2 * (lane % 4);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int token = col0 + 8 * (e / 4) + (e % 2);
      s[e] = token < seqlen ? s[e] * scale_log2 : -INFINITY;
      mx[(e / 2) % 2] = fmaxf(mx[(e / 2) % 2], s[e]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (lane % 4 == 0) red_max[wg * kHeads + row0 + 8 * r] = mx[r];
    }
    NamedBarrier(1, kConsumerThreads);
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      const float m_new = fmaxf(m_run[r], fmaxf(red_max[row], red_max[kHeads + row]));
      base[r] = m_new == -INFINITY ? 0.f : m_new;
      alpha[r] = exp2f(m_run[r] - base[r]);
      m_run[r] = m_new;
    }

    // P = 2^(s - max) in bf16, into the swizzled P tile (row = head, 128 B of tokens).
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const __nv_bfloat162 pv = __floats2bfloat162_rn(exp2f(s[4 * j + 2 * r] - base[r]),
                                                        exp2f(s[4 * j + 2 * r + 1] - base[r]));
        sum[r] += __low2float(pv) + __high2float(pv);
        const int row = row0 + 8 * r, chunk = (4 * wg + j) ^ (row % 8);
        *reinterpret_cast<__nv_bfloat162*>(ptile + row * 128 + chunk * 16 + (lane % 4) * 4) = pv;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
    FenceProxyAsync();
    NamedBarrier(1, kConsumerThreads);

    // O[:, 256 wg ..) = alpha O + P V.
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      WgmmaM64N256(o, DescKMajorSw128(ptile + kk * 32),
                   DescMnMajorSw128(kvs + 4 * wg * kBoxBytes + kk * 16 * 128));
    }
    WgmmaCommit();
    WgmmaWait<0>();
    PinRegisters(o);
    MbarArrive(&empty[stage]);
  }

  // Epilogue: the row sums of both warpgroups, normalise, store out / lse or this split's partial.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    if (lane % 4 == 0) red_sum[wg * kHeads + row0 + 8 * r] = l_run[r];
  }
  NamedBarrier(1, kConsumerThreads);
  const bool direct = p.num_splits == 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r, head = head0 + row;
    if (head >= h_q) continue;  // a block of fewer heads computes these rows and drops them
    const float l = red_sum[row] + red_sum[kHeads + row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
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
      const float lse = l > 0.f ? (m_run[r] + log2f(l)) * 0.6931471805599453f : -INFINITY;
      (direct ? p.lse : p.lse_accum)[out_row] = lse;
    }
  }
}

}  // namespace mla_sm90

bool MlaDecodeSm90Applies(MlaKvDtype kv_dtype) {
  return kv_dtype == MlaKvDtype::kBf16 && CurrentDeviceIsSm90();
}

absl::Status LaunchMlaDecodeSm90(const MlaDecodeParams& params, cudaStream_t stream) {
  using namespace mla_sm90;  // NOLINT(build/namespaces)
  // Q and the pages as [rows][576] bf16 matrices read in 64 x 64 boxes.
  CUtensorMap q_map, kv_map;
  const uint64_t row_bytes = kMlaQkHeadDim * 2;
  const uint32_t box[2] = {kBoxCols, 64};
  const uint64_t q_dims[2] = {kMlaQkHeadDim,
                              static_cast<uint64_t>(params.batch) * params.num_heads_q};
  const uint64_t kv_dims[2] = {kMlaQkHeadDim,
                               static_cast<uint64_t>(params.num_pages) * kMlaPageSize};
  for (const absl::Status& st :
       {EncodeBf16TensorMap(&q_map, params.q, 2, q_dims, &row_bytes, box, "MLA decode q"),
        EncodeBf16TensorMap(&kv_map, params.kv_cache, 2, kv_dims, &row_bytes, box,
                            "MLA decode kv_cache")}) {
    if (!st.ok()) return st;
  }
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaDecodeSm90Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid((params.num_heads_q + kHeads - 1) / kHeads, params.num_splits, params.batch);
  (void)LaunchPdl(MlaDecodeSm90Kernel, grid, dim3(kThreads), kSmemBytes, stream, params, q_map,
                  kv_map);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
