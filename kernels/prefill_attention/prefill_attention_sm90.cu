// Prefill attention on Hopper (sm_90a), variant 7 of prefill_attention.h: the same contract,
// computed with TMA and wgmma by a warp-specialized block.
//
// A block takes 128 query rows of one (sequence, head): a producer warpgroup (one thread issues
// TMA loads; setmaxnreg gives its registers to the others) and two consumer warpgroups of 64 rows
// each. Key tiles of 64 tokens stream through a 4-stage ring (full/empty mbarriers): K as 3 boxes
// of 64 keys x 64 dims and V as 2 boxes of 64 keys x 64 dims, 128-byte swizzled. Each consumer
// warpgroup computes S = Q K^T by wgmma m64n64k16 (Q and K from shared memory), the online softmax
// in registers, and O += P V by wgmma m64n128k16 with P in registers and V read MN-major. The two
// warpgroups share the tiles but not their rows, so one's softmax runs beside the other's wgmma.
// Key rows past the sequence are masked in S; their V rows are zeroed in shared memory (P is 0
// there, but 0 x NaN is not).
#include <cmath>
#include <string>

#include "kernels/common/sm90_ptx.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/prefill_attention/prefill_attention.cuh"
#include "kernels/prefill_attention/prefill_attention.h"

namespace strata::kernels {
namespace {

using namespace ::strata::kernels::sm90;  // NOLINT(build/namespaces): PTX helper vocabulary
using prefill_detail::Epilogue;
using prefill_detail::kBlockN;
using prefill_detail::kLog2e;
using prefill_detail::LocatePrefillBlock;
using prefill_detail::PackP;
using prefill_detail::PrefillBlock;
using prefill_detail::PrefillKeyTiles;
using prefill_detail::RescaleRows;
using prefill_detail::SoftmaxP;
using prefill_detail::WgmmaPV;

constexpr int kRowsPerGroup = 64;
constexpr int kBlockM = 2 * kRowsPerGroup;
constexpr int kBoxBytes = 64 * 128;           // 64 rows of one 128-byte swizzled row
constexpr int kQkBoxes = kPrefillQkDim / 64;  // 3
constexpr int kVBoxes = kPrefillVDim / 64;    // 2
constexpr int kQGroupBytes = kQkBoxes * kBoxBytes;
constexpr int kStageBytes = (kQkBoxes + kVBoxes) * kBoxBytes;  // K then V: 40 KB
constexpr int kStages = 4;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kQOffset = 0;
constexpr int kStageOffset = kQOffset + 2 * kQGroupBytes;
constexpr int kBarOffset = kStageOffset + kStages * kStageBytes;  // full[4], empty[4]
constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;   // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

// Keeps registers that an in-flight wgmma reads (the A fragments of P V) live, so the compiler
// does not reuse them before the wait.
__device__ __forceinline__ void KeepLive(const uint32_t (&a)[kBlockN / 16][4]) {
#pragma unroll
  for (int k = 0; k < kBlockN / 16; ++k) {
    asm volatile("" ::"r"(a[k][0]), "r"(a[k][1]), "r"(a[k][2]), "r"(a[k][3]) : "memory");
  }
}

// kOverlap (variant 8): S(t + 1) and P V (t) are issued back to back and the softmax of tile
// t + 1 runs while P V (t) is on the tensor cores (O is rescaled once P V (t) is done).
template <bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillAttentionSm90Kernel(const __grid_constant__ PrefillAttentionParams p,
                               const __grid_constant__ CUtensorMap k_map,
                               const __grid_constant__ CUtensorMap v_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  uint64_t* empty = full + kStages;

  const int head = blockIdx.y;
  const PrefillBlock blk = LocatePrefillBlock(p, kBlockM);
  const int q_begin = blk.q_begin, q_len = blk.q_len, k_begin = blk.k_begin, k_len = blk.k_len;
  const int m0 = blk.m0;
  if (m0 >= q_len) return;
  const int offset = k_len - q_len;  // row i sees keys j <= i + offset when causal
  const int n_tiles = PrefillKeyTiles(blk, offset, p.causal, kBlockM);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warp >= kConsumerThreads / 32) {  // producer warpgroup: one thread issues, the rest idle
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid != kConsumerThreads) return;
    PrefetchTensorMap(&k_map);
    PrefetchTensorMap(&v_map);
    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kStages;
      if (t >= kStages) MbarWait(&empty[stage], (t / kStages - 1) & 1);
      MbarArriveExpectTx(&full[stage], kStageBytes);
      uint8_t* dst = smem + kStageOffset + stage * kStageBytes;
      const int token = k_begin + t * kBlockN;
      for (int box = 0; box < kQkBoxes; ++box) {
        TmaLoad3d(dst + box * kBoxBytes, &k_map, box * 64, head, token, &full[stage]);
      }
      for (int box = 0; box < kVBoxes; ++box) {
        TmaLoad3d(dst + (kQkBoxes + box) * kBoxBytes, &v_map, box * 64, head, token, &full[stage]);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int wg = tid / 128, wl = (tid / 32) % 4, t128 = tid % 128;
  const int g0 = m0 + wg * kRowsPerGroup;  // this warpgroup's first row in the sequence
  uint8_t* sq = smem + kQOffset + wg * kQGroupBytes;
  {  // Q rows of this warpgroup into the swizzled layout (rows past q_len: zeros).
    const __nv_bfloat16* q = p.q + static_cast<int64_t>(q_begin) * p.q_token_stride +
                             static_cast<int64_t>(head) * p.q_head_stride;
    constexpr int kChunks = kPrefillQkDim / 8;  // 16-byte chunks per row
    for (int c = t128; c < kRowsPerGroup * kChunks; c += 128) {
      const int r = c / kChunks, cc = c % kChunks, box = cc / 8, ch = cc % 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (g0 + r < q_len) {
        v = *reinterpret_cast<const uint4*>(q + static_cast<int64_t>(g0 + r) * p.q_token_stride +
                                            cc * 8);
      }
      *reinterpret_cast<uint4*>(sq + box * kBoxBytes + r * 128 + ((ch ^ (r % 8)) * 16)) = v;
    }
    FenceProxyAsync();
    NamedBarrier(2 + wg, 128);
  }

  float o[kPrefillVDim / 8][4];
#pragma unroll
  for (int j = 0; j < kPrefillVDim / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int row0 = g0 + wl * 16 + lane / 4;  // this thread's rows: row0, row0 + 8

  // Waits for tile t; zeroes its V rows past the sequence (warpgroup g zeroes V box g).
  auto arrive_tile = [&](int t) {
    const int stage = t % kStages, key0 = t * kBlockN;
    uint8_t* sv = smem + kStageOffset + stage * kStageBytes + kQkBoxes * kBoxBytes;
    MbarWait(&full[stage], (t / kStages) & 1);
    if (key0 + kBlockN > k_len) {
      const int valid = k_len - key0;
      for (int k = t128; k < (kBlockN - valid) * 8; k += 128) {
        *reinterpret_cast<uint4*>(sv + wg * kBoxBytes + (valid + k / 8) * 128 + (k % 8) * 16) =
            make_uint4(0, 0, 0, 0);
      }
      FenceProxyAsync();
      NamedBarrier(1, kConsumerThreads);
    }
  };
  float s[kBlockN / 8][4];
  auto issue_s = [&](int t) {
    const uint8_t* sk = smem + kStageOffset + (t % kStages) * kStageBytes;
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kPrefillQkDim / 16; ++ks) {
      const int off = (ks / 4) * kBoxBytes + (ks % 4) * 32;
      WgmmaM64N64Ss(s, DescKMajorSw128(sq + off), DescKMajorSw128(sk + off), ks > 0 ? 1 : 0);
    }
    WgmmaCommit();
  };
  uint32_t pa[kBlockN / 16][4];
  auto issue_pv = [&](int t) {
    const uint8_t* sv = smem + kStageOffset + (t % kStages) * kStageBytes + kQkBoxes * kBoxBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      WgmmaPV(o, pa[kk], DescMnMajorSw128(sv + kk * 16 * 128));
    WgmmaCommit();
  };
  auto softmax = [&](int t, float(&corr)[2]) {  // s becomes P(t)
    const int key0 = t * kBlockN;
    const bool need_mask = key0 + kBlockN > k_len || (p.causal && key0 + kBlockN - 1 > g0 + offset);
    SoftmaxP(s, row_max, row_sum, corr, key0, need_mask, k_len, p.causal, row0, offset, scale_log2);
  };

  if constexpr (!kOverlap) {
    for (int t = 0; t < n_tiles; ++t) {
      arrive_tile(t);
      issue_s(t);
      WgmmaWait<0>();
      PinRegisters(s);
      float corr[2];
      softmax(t, corr);
      RescaleRows(o, corr);
      PackP(s, pa);
      issue_pv(t);
      WgmmaWait<0>();
      PinRegisters(o);
      MbarArrive(&empty[t % kStages]);
    }
  } else if (n_tiles > 0) {
    arrive_tile(0);
    issue_s(0);
    WgmmaWait<0>();
    PinRegisters(s);
    float corr[2];
    softmax(0, corr);  // O is still 0: nothing to rescale
    PackP(s, pa);
    for (int t = 0; t + 1 < n_tiles; ++t) {
      arrive_tile(t + 1);
      issue_s(t + 1);
      issue_pv(t);
      WgmmaWait<1>();  // S(t + 1) done; P V (t) may still run
      PinRegisters(s);
      softmax(t + 1, corr);
      WgmmaWait<0>();  // P V (t) done
      PinRegisters(o);
      KeepLive(pa);
      MbarArrive(&empty[t % kStages]);
      RescaleRows(o, corr);
      PackP(s, pa);
    }
    issue_pv(n_tiles - 1);
    WgmmaWait<0>();
    PinRegisters(o);
    KeepLive(pa);
    MbarArrive(&empty[(n_tiles - 1) % kStages]);
  }

  Epilogue(p, o, row_max, row_sum, row0, q_len, q_begin, head);
}

}  // namespace

absl::Status LaunchPrefillAttentionSm90(const PrefillAttentionParams& p, bool overlap,
                                        cudaStream_t stream) {
  if (p.total_k <= 0) {
    return absl::InvalidArgumentError(
        "LaunchPrefillAttention: variants 7 and 8 (TMA) need total_k, the rows of k and v");
  }
  // k and v as [total_k][heads][dim] bf16 tensors read in boxes of 64 dims x 1 head x 64 keys.
  CUtensorMap k_map, v_map;
  const uint32_t box[3] = {64, 1, 64};
  const uint64_t k_dims[3] = {kPrefillQkDim, static_cast<uint64_t>(p.num_heads),
                              static_cast<uint64_t>(p.total_k)};
  const uint64_t v_dims[3] = {kPrefillVDim, static_cast<uint64_t>(p.num_heads),
                              static_cast<uint64_t>(p.total_k)};
  const uint64_t k_strides[2] = {static_cast<uint64_t>(p.k_head_stride) * 2,
                                 static_cast<uint64_t>(p.k_token_stride) * 2};
  const uint64_t v_strides[2] = {static_cast<uint64_t>(p.v_head_stride) * 2,
                                 static_cast<uint64_t>(p.v_token_stride) * 2};
  for (const absl::Status& st :
       {EncodeBf16TensorMap(&k_map, p.k, 3, k_dims, k_strides, box, "prefill k"),
        EncodeBf16TensorMap(&v_map, p.v, 3, v_dims, v_strides, box, "prefill v")}) {
    if (!st.ok()) return st;
  }
  auto* kernel = overlap ? PrefillAttentionSm90Kernel<true> : PrefillAttentionSm90Kernel<false>;
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) {
    return absl::InternalError(std::string("LaunchPrefillAttention: ") + cudaGetErrorString(attr));
  }
  const dim3 grid((p.max_seqlen_q + kBlockM - 1) / kBlockM, p.num_heads, p.batch);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, k_map, v_map);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchPrefillAttention: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
