// The grouped MoE expert GEMMs of moe_grouped.h on Hopper: schedule, gather, gate|up with SiLU×mul
// as its epilogue, down. See the header for the contract and the grid order.
#include <algorithm>
#include <string>

#include "kernels/common/sm90_device.h"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_experts/moe_grouped.h"

namespace strata::kernels {
namespace {

using namespace ::strata::kernels::sm90;  // NOLINT(build/namespaces): PTX helper vocabulary

constexpr int kTileM = kMoeGroupedTileRows;  // 128 slots: two consumer warpgroups of 64
constexpr int kTileN = 256;                  // B rows per block (gate|up: 128 gate + 128 up)
constexpr int kTileK = 64;                   // one 128-byte swizzled row
constexpr int kBoxBytes = 128 * 128;         // a TMA box of 128 rows x 64 elements
constexpr int kABytes = kBoxBytes;
constexpr int kStageBytes = kABytes + 2 * kBoxBytes;  // A, then B as two boxes: 48 KB
constexpr int kStages = 4;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kBarOffset = kStages * kStageBytes;                // full[4], empty[4]
constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

// The schedule: int4 {num_tiles, 0, 0, 0}, then per row tile {expert, first tile of the expert,
// tiles of the expert, 0}.
__global__ void __launch_bounds__(1024)
    ScheduleKernel(const int32_t* offset, int num_experts, int4* schedule) {
  __shared__ int first[kMoeAlignMaxExperts + 1];
  const int tid = threadIdx.x;
  if (tid < 32) {  // each lane scans a contiguous run of experts, then the lanes scan
    const int per_lane = (num_experts + 31) / 32;
    const int lo = min(num_experts, tid * per_lane), hi = min(num_experts, lo + per_lane);
    int sum = 0;
    for (int e = lo; e < hi; ++e) sum += (offset[e + 1] - offset[e] + kTileM - 1) / kTileM;
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (tid >= d) incl += v;
    }
    int run = incl - sum;
    for (int e = lo; e < hi; ++e) {
      first[e] = run;
      run += (offset[e + 1] - offset[e] + kTileM - 1) / kTileM;
    }
    if (tid == 31) {
      first[num_experts] = incl;
      schedule[0] = make_int4(incl, 0, 0, 0);
    }
  }
  __syncthreads();
  for (int e = tid; e < num_experts; e += blockDim.x) {
    const int tiles = first[e + 1] - first[e];
    for (int i = 0; i < tiles; ++i) schedule[1 + first[e] + i] = make_int4(e, first[e], tiles, 0);
  }
}

// xs[s] = x[slot_token[s]] for the valid slots (s < offset[E]); one block per slot.
__global__ void __launch_bounds__(128) GatherKernel(MoeGroupedParams p) {
  const int s = blockIdx.x;
  if (s >= p.expert_offset[p.num_experts]) return;
  const uint4* src = reinterpret_cast<const uint4*>(p.x + p.slot_token[s] * p.ld_x);
  uint4* dst = reinterpret_cast<uint4*>(p.xs + static_cast<int64_t>(s) * p.hidden);
  for (int i = threadIdx.x; i < p.hidden / 8; i += blockDim.x) dst[i] = src[i];
}

__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// kGateUp: A = xs [slots][H], B = gate|up rows of the expert (a 3-D map: H x 2I x E), out = act.
// Else: A = act [slots][I], B = down rows (I x H x E), out = out.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedGemmKernel(const __grid_constant__ MoeGroupedParams p,
                      const __grid_constant__ CUtensorMap a_map,
                      const __grid_constant__ CUtensorMap b_map) {
  const int n_out = kGateUp ? p.inter : p.hidden;      // columns of the output
  const int k_dim = kGateUp ? p.hidden : p.inter;      // reduction
  const int col_tile = kGateUp ? kTileN / 2 : kTileN;  // output columns per block
  const int n_blocks = (n_out + col_tile - 1) / col_tile;
  const int4* schedule = static_cast<const int4*>(p.schedule);
  const int g = blockIdx.x / n_blocks;
  if (g >= schedule[0].x) return;
  const int4 info = schedule[1 + g];
  const int expert = info.x, local = blockIdx.x - n_blocks * info.y;
  const int n_idx = local / info.z, m_idx = local % info.z;
  const int row0 = p.expert_offset[expert] + m_idx * kTileM;
  const int rows = min(kTileM, p.expert_offset[expert + 1] - row0);
  const int n0 = n_idx * col_tile;
  const int k_steps = (k_dim + kTileK - 1) / kTileK;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (tid >= kConsumerThreads) {  // producer warpgroup: one thread issues the loads
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid != kConsumerThreads) return;
    PrefetchTensorMap(&a_map);
    PrefetchTensorMap(&b_map);
    // gate|up: gate rows n0.. and up rows I + n0..; down: rows n0.. and n0 + 128.. of down.
    const int b_row1 = kGateUp ? p.inter + n0 : n0 + kTileN / 2;
    for (int kt = 0; kt < k_steps; ++kt) {
      const int stage = kt % kStages;
      if (kt >= kStages) MbarWait(&empty[stage], (kt / kStages - 1) & 1);
      MbarArriveExpectTx(&full[stage], kStageBytes);
      uint8_t* dst = smem + stage * kStageBytes;
      TmaLoad2d(dst, &a_map, kt * kTileK, row0, &full[stage]);
      TmaLoad3d(dst + kABytes, &b_map, kt * kTileK, n0, expert, &full[stage]);
      TmaLoad3d(dst + kABytes + kBoxBytes, &b_map, kt * kTileK, b_row1, expert, &full[stage]);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int wg = tid / 128, wl = (tid / 32) % 4, lane = tid % 32;
  // A tile of at most 64 slots (an expert's last or only one) leaves warpgroup 1 without rows: it
  // only releases the stages, and the tensor pipe serves warpgroup 0 alone.
  if (wg * 64 >= rows) {
    for (int kt = 0; kt < k_steps; ++kt) {
      MbarWait(&full[kt % kStages], (kt / kStages) & 1);
      MbarArrive(&empty[kt % kStages]);
    }
    return;
  }
  float acc[kTileN / 8][4];
  for (int kt = 0; kt < k_steps; ++kt) {
    const int stage = kt % kStages;
    const uint8_t* sa = smem + stage * kStageBytes + wg * (kABytes / 2);
    const uint8_t* sb = smem + stage * kStageBytes + kABytes;
    MbarWait(&full[stage], (kt / kStages) & 1);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      WgmmaM64N256Ss(acc, DescKMajorSw128(sa + kk * 32), DescKMajorSw128(sb + kk * 32),
                     kt > 0 || kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    if (kt > 0) {
      WgmmaWait<1>();  // step kt - 1 has read its stage
      MbarArrive(&empty[(kt - 1) % kStages]);
    }
  }
  WgmmaWait<0>();
  PinRegisters(acc);

  // This thread's rows r and r + 8 of the tile; columns 8j + 2 (lane % 4) + {0, 1}.
  const int r = wg * 64 + wl * 16 + lane / 4;
  const int c = 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = r + half * 8;
    if (row >= rows) continue;
    const int64_t slot = row0 + row;
    if constexpr (kGateUp) {
#pragma unroll
      for (int j = 0; j < kTileN / 16; ++j) {
        const int col = n0 + j * 8 + c;
        if (col >= p.inter) continue;
        float a[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gate = RoundBf16(acc[j][2 * half + e]);
          const float up = RoundBf16(acc[j + kTileN / 16][2 * half + e]);
          a[e] = gate / (1.f + expf(-gate)) * up;
        }
        *reinterpret_cast<__nv_bfloat162*>(p.act + slot * p.inter + col) =
            __floats2bfloat162_rn(a[0], a[1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kTileN / 8; ++j) {
        const int col = n0 + j * 8 + c;
        if (col >= p.hidden) continue;
        *reinterpret_cast<__nv_bfloat162*>(p.out + slot * p.hidden + col) =
            __floats2bfloat162_rn(acc[j][2 * half], acc[j][2 * half + 1]);
      }
    }
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchMoeGrouped: " + what);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status LaunchError(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string("LaunchMoeGrouped (") + what +
                             "): " + cudaGetErrorString(err));
}

}  // namespace

bool MoeGroupedApplies() { return CurrentDeviceIsSm90(); }

absl::Status ValidateMoeGroupedParams(const MoeGroupedParams& p) {
  if (p.num_tokens < 0 || p.top_k <= 0) return Invalid("num_tokens >= 0 and top_k > 0 needed");
  if (p.num_experts <= 0 || p.num_experts > kMoeAlignMaxExperts) {
    return Invalid("num_experts must be in 1.." + std::to_string(kMoeAlignMaxExperts));
  }
  if (static_cast<int64_t>(p.num_tokens) * p.top_k > (int64_t{1} << 30)) {
    return Invalid("too many choices");
  }
  if (p.hidden <= 0 || p.inter <= 0 || p.hidden % 8 != 0 || p.inter % 8 != 0) {
    return Invalid("hidden and inter must be positive multiples of 8");
  }
  if (p.ld_x < p.hidden || p.ld_x % 8 != 0)
    return Invalid("ld_x must be >= hidden, a multiple of 8");
  if (p.expert_stride % 8 != 0 || p.expert_stride < 3 * static_cast<int64_t>(p.inter) * p.hidden) {
    return Invalid("expert_stride must be a multiple of 8 and >= 3 * inter * hidden");
  }
  if (p.x == nullptr || p.weights == nullptr || p.expert_offset == nullptr ||
      p.slot_token == nullptr || p.schedule == nullptr || p.xs == nullptr || p.act == nullptr ||
      p.out == nullptr) {
    return Invalid("every pointer must be set");
  }
  for (const void* ptr : {static_cast<const void*>(p.x), static_cast<const void*>(p.weights),
                          static_cast<const void*>(p.schedule), static_cast<const void*>(p.xs),
                          static_cast<const void*>(p.act), static_cast<const void*>(p.out)}) {
    if (!Aligned16(ptr)) return Invalid("x, weights and the workspaces must be 16-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeGrouped(const MoeGroupedParams& p, cudaStream_t stream) {
  if (absl::Status st = ValidateMoeGroupedParams(p); !st.ok()) return st;
  if (!MoeGroupedApplies()) return Invalid("needs a compute capability 9.x device (sm_90a)");
  const int64_t slots = static_cast<int64_t>(p.num_tokens) * p.top_k;
  if (slots == 0) return absl::OkStatus();
  const int64_t h = p.hidden, inter = p.inter;
  // A: [slots][K] row-major; B: [E][rows][K] through the expert stride. Boxes of 128 x 64.
  CUtensorMap xs_map, act_map, gate_up_map, down_map;
  const uint32_t box2[2] = {kTileK, 128}, box3[3] = {kTileK, 128, 1};
  const uint64_t xs_dims[2] = {static_cast<uint64_t>(h), static_cast<uint64_t>(slots)};
  const uint64_t xs_strides[1] = {static_cast<uint64_t>(h) * 2};
  const uint64_t act_dims[2] = {static_cast<uint64_t>(inter), static_cast<uint64_t>(slots)};
  const uint64_t act_strides[1] = {static_cast<uint64_t>(inter) * 2};
  const uint64_t gu_dims[3] = {static_cast<uint64_t>(h), static_cast<uint64_t>(2 * inter),
                               static_cast<uint64_t>(p.num_experts)};
  const uint64_t gu_strides[2] = {static_cast<uint64_t>(h) * 2,
                                  static_cast<uint64_t>(p.expert_stride) * 2};
  const uint64_t down_dims[3] = {static_cast<uint64_t>(inter), static_cast<uint64_t>(h),
                                 static_cast<uint64_t>(p.num_experts)};
  const uint64_t down_strides[2] = {static_cast<uint64_t>(inter) * 2,
                                    static_cast<uint64_t>(p.expert_stride) * 2};
  for (const absl::Status& st :
       {EncodeBf16TensorMap(&xs_map, p.xs, 2, xs_dims, xs_strides, box2, "MoE xs"),
        EncodeBf16TensorMap(&act_map, p.act, 2, act_dims, act_strides, box2, "MoE act"),
        EncodeBf16TensorMap(&gate_up_map, p.weights, 3, gu_dims, gu_strides, box3, "MoE gate|up"),
        EncodeBf16TensorMap(&down_map, p.weights + 2 * inter * h, 3, down_dims, down_strides, box3,
                            "MoE down")}) {
    if (!st.ok()) return st;
  }
  static const cudaError_t attr = [] {
    const cudaError_t a = cudaFuncSetAttribute(
        GroupedGemmKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    const cudaError_t b = cudaFuncSetAttribute(
        GroupedGemmKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    return a != cudaSuccess ? a : b;
  }();
  if (attr != cudaSuccess) {
    return absl::InternalError(std::string("LaunchMoeGrouped: shared memory attribute: ") +
                               cudaGetErrorString(attr));
  }
  auto* schedule = static_cast<int4*>(p.schedule);
  ScheduleKernel<<<1, 1024, 0, stream>>>(p.expert_offset, p.num_experts, schedule);
  if (absl::Status st = LaunchError("schedule"); !st.ok()) return st;
  GatherKernel<<<static_cast<unsigned>(slots), 128, 0, stream>>>(p);
  if (absl::Status st = LaunchError("gather"); !st.ok()) return st;
  const int64_t tiles = MoeGroupedMaxTiles(slots, p.num_experts);
  const int64_t gu_blocks = (inter + kTileN / 2 - 1) / (kTileN / 2) * tiles;
  const int64_t down_blocks = (h + kTileN - 1) / kTileN * tiles;
  if (gu_blocks > INT32_MAX || down_blocks > INT32_MAX) return Invalid("too many tiles");
  GroupedGemmKernel<true>
      <<<static_cast<unsigned>(gu_blocks), kThreads, kSmemBytes, stream>>>(p, xs_map, gate_up_map);
  if (absl::Status st = LaunchError("gate|up"); !st.ok()) return st;
  GroupedGemmKernel<false>
      <<<static_cast<unsigned>(down_blocks), kThreads, kSmemBytes, stream>>>(p, act_map, down_map);
  return LaunchError("down");
}

}  // namespace strata::kernels
