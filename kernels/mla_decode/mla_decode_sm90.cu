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
//    with the 128-byte swizzle, into a 2-stage ring (full/empty mbarriers); with fresh_rows, the
//    ring's first pages of settled rows before its programmatic-launch wait.
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
#include "kernels/mla_decode/mla_decode_sm90.cuh"

namespace strata::kernels {
namespace mla_sm90 {

// Shared memory past the page ring.
constexpr int kXOffset = kRingEnd;                       // S partials from warpgroup 0
constexpr int kMaxOffset = kXOffset + kBoxBytes;         // row maxima [2][64] f32
constexpr int kSumOffset = kMaxOffset + 2 * kHeads * 4;  // row sums [2][64] f32
constexpr int kBarOffset = kSumOffset + 2 * kHeads * 4;  // q_full, full[2], empty[2]
constexpr int kSmemBytes = kBarOffset + (1 + 2 * kStages) * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeSm90Kernel(const __grid_constant__ MlaDecodeParams p,
                        const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap kv_map) {
  // With fresh_rows the producer warp waits itself, after issuing the pages of settled rows
  // (LoadQAndTiles), and the consumers after setting up; until then only the lengths and the
  // block table are read, which that promises complete.
  const bool early = p.fresh_rows > 0;
  if (!early) PdlGridSync();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedSmem(smem_raw);
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
  const SplitTiles tiles = TilesOfSplit(p, split, b);
  const int seqlen = tiles.seqlen, tile_begin = tiles.tile_begin, n = tiles.n;
  InitBarriers(q_full, full, empty);
  if (warp >= kConsumerThreads / 32) {
    ProducerWarpgroup(p, &q_map, &kv_map, sq, skv, q_full, full, empty, b, head0, tiles);
    return;
  }

  if (early) PdlGridSync();

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
    if (valid < kTile) ZeroVTail(kvs, valid, wg, tid % 128);  // fenced; barriers follow

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
      base[r] = Base(m_new);
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
    ScaleRows(o, alpha);
    PvFromSharedP(o, ptile, kvs, wg);
    WgmmaWait<0>();
    PinRegisters(o);
    MbarArrive(&empty[stage]);
  }

  StoreRows(p, o, l_run, m_run, red_sum, wg, lane, row0, head0, split, b);
}

}  // namespace mla_sm90

bool MlaDecodeSm90Applies(MlaKvDtype kv_dtype) {
  return kv_dtype == MlaKvDtype::kBf16 && CurrentDeviceIsSm90();
}

absl::Status LaunchMlaDecodeSm90(const MlaDecodeParams& params, cudaStream_t stream) {
  using namespace mla_sm90;  // NOLINT(build/namespaces)
  CUtensorMap q_map, kv_map;
  if (absl::Status st = EncodeMlaSm90Maps(params, &q_map, &kv_map); !st.ok()) return st;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaDecodeSm90Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid((params.num_heads_q + kHeads - 1) / kHeads, params.num_splits, params.batch);
  (void)LaunchPdl(MlaDecodeSm90Kernel, grid, dim3(kThreads), kSmemBytes, stream, params, q_map,
                  kv_map);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
