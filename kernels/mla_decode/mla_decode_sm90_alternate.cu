// MLA decode on Hopper with the two consumer warpgroups taking turns (MlaDecodeImpl::
// kSm90Alternate): the contract of mla_decode.h, for bf16 pages, in blocks of 64 heads.
//
// The block (mla_decode_sm90.cuh: a producer warp fills a 2-stage ring of 64-token pages) takes
// the split's tiles in pairs (a, b) = (2k, 2k + 1), a in stage 0, b in stage 1. O is split by value
// columns: warpgroup 0 holds O[:, 0, 256), warpgroup 1 O[:, 256, 512). S is not split: warpgroup 0
// computes the whole S of tile a (m64n64 over all 576 dims), warpgroup 1 that of tile b, at once.
//  - Warpgroup 0: softmax of a (its running max m_a), P_a as bf16 in registers and in shared
//    memory (over a's k_pe box, which only its own S read); O_L = O_L 2^(m - m_a) + P_a V_a,L with
//    P_a from registers; then, with P_b and m_b from warpgroup 1, O_L = O_L 2^(m_a - m_b) +
//    P_b V_b,L.
//  - Warpgroup 1: with m_a and P_a from warpgroup 0, O_R = O_R 2^(m - m_a) + P_a V_a,R, and while
//    that runs on the tensor pipe, the softmax of b against m_a (m_b = max(m_a, rowmax b)), P_b
//    to registers and to b's k_pe box; then O_R = O_R 2^(m_a - m_b) + P_b V_b,R from registers.
// Compared with mla_decode_sm90.cu (both warpgroups on every tile, S split by dims and swapped
// through shared memory, three barriers of the whole block per tile), a tile's S needs no exchange
// and one warpgroup's softmax runs while the other one's wgmmas keep the tensor pipe busy.
// An odd last tile is a pair without b. The two warpgroups meet only at named barriers:
// kBarPa (warpgroup 0 arrives with m_a and P_a written, 1 syncs) and kBarPb (the reverse).
#include "common/cuda/cuda_status.h"
#include "kernels/common/pdl.cuh"
#include "kernels/mla_decode/mla_decode_sm90.cuh"

namespace strata::kernels {
namespace mla_sm90 {
namespace {

constexpr int kBarPa = 2, kBarPb = 3;  // named barriers of both warpgroups (1: StoreRows)
constexpr int kBarTail = 4;            // + warpgroup: its own 128 threads, after zeroing V rows

// Shared memory past the page ring.
constexpr int kMaOffset = kRingEnd;                      // m_a per consumer thread [128][2] f32
constexpr int kMbOffset = kMaOffset + 128 * 2 * 4;       // m_b, the same
constexpr int kSumOffset = kMbOffset + 128 * 2 * 4;      // row sums [2][64] f32
constexpr int kBarOffset = kSumOffset + 2 * kHeads * 4;  // q_full, full[2], empty[2]
constexpr int kSmemBytes = kBarOffset + (1 + 2 * kStages) * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

// Hands this thread's shared-memory writes to the threads that bar.sync on `id` (fence, then
// bar.arrive: the writer does not wait).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  __threadfence_block();
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// s (64 x 64: this warpgroup's rows, the tile's tokens) = Q K^T over all 576 dims.
__device__ __forceinline__ void TileScores(float (&s)[8][4], const uint8_t* sq,
                                           const uint8_t* kvs) {
  WgmmaFence();
#pragma unroll
  for (int ks = 0; ks < kMlaQkHeadDim / 16; ++ks) {
    const int off = (ks / 4) * kBoxBytes + (ks % 4) * 32;
    WgmmaM64N64Ss(s, DescKMajorSw128(sq + off), DescKMajorSw128(kvs + off), ks > 0 ? 1 : 0);
  }
  WgmmaCommit();
  WgmmaWait<0>();
  PinRegisters(s);
}

// Scales s to base 2, masks the tokens past the sequence (token0 = the tile's first), and returns
// this thread's two rows' maxima (rows row0 and row0 + 8, over the 4 lanes sharing them).
__device__ __forceinline__ void ScaleMaskMax(float (&s)[8][4], int token0, int seqlen, int lane,
                                             float scale_log2, float (&mx)[2]) {
  const int col0 = token0 + 2 * (lane % 4);
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = col0 + 8 * j + (e % 2);
      s[j][e] = token < seqlen ? s[j][e] * scale_log2 : -INFINITY;
      mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi, float& sum) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  sum += __low2float(v) + __high2float(v);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// P = 2^(s - base) as bf16 A fragments (pa[kk] = tokens 16 kk .. 16 kk + 15), the rows' partial
// sums of what was rounded, and the same P into the swizzled 64 x 64 tile `ptile` (row = head,
// 128 B of tokens) for the other warpgroup.
__device__ __forceinline__ void MakeP(const float (&s)[8][4], const float (&base)[2], int row0,
                                      int lane, uint8_t* ptile, uint32_t (&pa)[4][4],
                                      float (&sum)[2]) {
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t v =
          PackBf16(exp2f(s[j][2 * r] - base[r]), exp2f(s[j][2 * r + 1] - base[r]), sum[r]);
      pa[j / 2][2 * (j % 2) + r] = v;
      const int row = row0 + 8 * r, chunk = j ^ (row % 8);
      *reinterpret_cast<uint32_t*>(ptile + row * 128 + chunk * 16 + (lane % 4) * 4) = v;
    }
  }
  FenceProxyAsync();
}

__device__ __forceinline__ void ScaleRows(float (&o)[128], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= f[0];
    o[4 * j + 1] *= f[0];
    o[4 * j + 2] *= f[1];
    o[4 * j + 3] *= f[1];
  }
}

// o += P V over one tile, P from registers or from the tile's P box, V = this warpgroup's half of
// the latent dims (MN-major straight from the K layout). Issued and committed, not waited.
__device__ __forceinline__ void PvFromRegisters(float (&o)[128], const uint32_t (&pa)[4][4],
                                                const uint8_t* kvs, int half) {
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    WgmmaM64N256Rs(o, pa[kk], DescMnMajorSw128(kvs + 4 * half * kBoxBytes + kk * 16 * 128));
  }
  WgmmaCommit();
}
__device__ __forceinline__ void PvFromShared(float (&o)[128], const uint8_t* kvs, int half) {
  const uint8_t* ptile = kvs + (kBoxes - 1) * kBoxBytes;
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    WgmmaM64N256(o, DescKMajorSw128(ptile + kk * 32),
                 DescMnMajorSw128(kvs + 4 * half * kBoxBytes + kk * 16 * 128));
  }
  WgmmaCommit();
}

__device__ __forceinline__ float Base(float m) { return m == -INFINITY ? 0.f : m; }

__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeSm90AlternateKernel(const __grid_constant__ MlaDecodeParams p,
                                 const __grid_constant__ CUtensorMap q_map,
                                 const __grid_constant__ CUtensorMap kv_map) {
  PdlGridSync();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedSmem(smem_raw);
  uint8_t* sq = smem + kQOffset;
  uint8_t* skv = smem + kKvOffset;
  float* xm_a = reinterpret_cast<float*>(smem + kMaOffset);
  float* xm_b = reinterpret_cast<float*>(smem + kMbOffset);
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

  // Consumers: warpgroup wg holds O[:, 256 wg, 256 wg + 256); this thread's rows (heads) are row0
  // and row0 + 8, its columns 2 (lane % 4) + {0, 1} of every 8-wide group.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int wg = tid / 128, t = tid % 128;
  const int row0 = 16 * (t / 32) + lane / 4;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  if (n > 0) MbarWait(q_full, 0);
  uint8_t* kva = skv;              // stage 0: tile a of every pair
  uint8_t* kvb = skv + kMatBytes;  // stage 1: tile b
  uint8_t* pbox_a = kva + (kBoxes - 1) * kBoxBytes;
  uint8_t* pbox_b = kvb + (kBoxes - 1) * kBoxBytes;

  for (int k = 0; 2 * k < n; ++k) {
    const uint32_t parity = k & 1;
    const bool has_b = 2 * k + 1 < n;
    const int token_a = (tile_begin + 2 * k) * kTile, token_b = token_a + kTile;
    const int valid_a = seqlen - token_a, valid_b = seqlen - token_b;
    float s[8][4], mx[2], sum[2];
    uint32_t pa[4][4];
    if (wg == 0) {
      MbarWait(&full[0], parity);
      TileScores(s, sq, kva);
      ScaleMaskMax(s, token_a, seqlen, lane, scale_log2, mx);
      float m_a[2], base[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_a[r] = fmaxf(m_run[r], mx[r]);
        base[r] = Base(m_a[r]);
        alpha[r] = exp2f(m_run[r] - base[r]);
        xm_a[2 * t + r] = m_a[r];
      }
      MakeP(s, base, row0, lane, pbox_a, pa, sum);
      NamedBarrierArrive(kBarPa, kConsumerThreads);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l_run[r] = l_run[r] * alpha[r] + sum[r];
        m_run[r] = m_a[r];
      }
      ScaleRows(o, alpha);
      if (valid_a < kTile) {
        ZeroVTail(kva, valid_a, 0, t);
        NamedBarrier(kBarTail, 128);
      }
      PvFromRegisters(o, pa, kva, 0);
      if (has_b) {
        NamedBarrier(kBarPb, kConsumerThreads);  // P_b and m_b are in shared memory
        float beta[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_b = xm_b[2 * t + r];
          beta[r] = exp2f(m_run[r] - Base(m_b));
          l_run[r] *= beta[r];
          m_run[r] = m_b;
        }
        MbarWait(&full[1], parity);  // complete already (warpgroup 1 read it): for visibility
        if (valid_b < kTile) {
          ZeroVTail(kvb, valid_b, 0, t);
          NamedBarrier(kBarTail, 128);
        }
        WgmmaWait<0>();
        PinRegisters(o);
        MbarArrive(&empty[0]);
        ScaleRows(o, beta);
        PvFromShared(o, kvb, 0);
        WgmmaWait<0>();
        PinRegisters(o);
        MbarArrive(&empty[1]);
      } else {
        WgmmaWait<0>();
        PinRegisters(o);
        MbarArrive(&empty[0]);
      }
    } else {
      if (has_b) {
        MbarWait(&full[1], parity);
        TileScores(s, sq, kvb);
        ScaleMaskMax(s, token_b, seqlen, lane, scale_log2, mx);
      }
      MbarWait(&full[0], parity);  // complete already (warpgroup 0 read it): for visibility
      NamedBarrier(kBarPa, kConsumerThreads);  // m_a and P_a are in shared memory
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_a = xm_a[2 * t + r];
        alpha[r] = exp2f(m_run[r] - Base(m_a));
        l_run[r] *= alpha[r];
        m_run[r] = m_a;
      }
      ScaleRows(o, alpha);
      if (valid_a < kTile) {
        ZeroVTail(kva, valid_a, 1, t);
        NamedBarrier(kBarTail + 1, 128);
      }
      PvFromShared(o, kva, 1);
      if (has_b) {  // the softmax of b while P_a V_a,R runs
        float m_b[2], base[2], beta[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m_b[r] = fmaxf(m_run[r], mx[r]);
          base[r] = Base(m_b[r]);
          beta[r] = exp2f(m_run[r] - base[r]);
          xm_b[2 * t + r] = m_b[r];
        }
        MakeP(s, base, row0, lane, pbox_b, pa, sum);
        NamedBarrierArrive(kBarPb, kConsumerThreads);
        if (valid_b < kTile) {
          ZeroVTail(kvb, valid_b, 1, t);
          NamedBarrier(kBarTail + 1, 128);
        }
        WgmmaWait<0>();
        PinRegisters(o);
        MbarArrive(&empty[0]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          l_run[r] = l_run[r] * beta[r] + sum[r];
          m_run[r] = m_b[r];
        }
        ScaleRows(o, beta);
        PvFromRegisters(o, pa, kvb, 1);
        WgmmaWait<0>();
        PinRegisters(o);
        MbarArrive(&empty[1]);
      } else {
        WgmmaWait<0>();
        PinRegisters(o);
        MbarArrive(&empty[0]);
      }
    }
  }
  StoreRows(p, o, l_run, m_run, red_sum, wg, lane, row0, head0, split, b);
}

}  // namespace
}  // namespace mla_sm90

absl::Status LaunchMlaDecodeSm90Alternate(const MlaDecodeParams& params, cudaStream_t stream) {
  using namespace mla_sm90;  // NOLINT(build/namespaces)
  CUtensorMap q_map, kv_map;
  if (absl::Status st = EncodeMlaSm90Maps(params, &q_map, &kv_map); !st.ok()) return st;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      MlaDecodeSm90AlternateKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const dim3 grid((params.num_heads_q + kHeads - 1) / kHeads, params.num_splits, params.batch);
  (void)LaunchPdl(MlaDecodeSm90AlternateKernel, grid, dim3(kThreads), kSmemBytes, stream, params,
                  q_map, kv_map);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace strata::kernels
