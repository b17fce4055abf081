// Grouped expert GEMMs for decode-sized token counts (see moe_experts.h).
//
// Layout of one CTA's work: one or two 16-row tiles of one expert's weights (gate_up: the gate and
// up rows of 8 or 16 features; down: 16 or 32 output rows, see kMT), the whole reduction
// dimension split over 8 warps in steps of 64 elements. Per step each lane loads two 16-byte
// vectors of 2 weight rows per tile (rows g and g + 8, g = lane / 4) and the same k range of its
// token row g.
//
// The k order inside a 32-element block is free in a dot product, so the 16-byte vectors feed
// mma.m16n8k16 without any shuffle: lane (g, c = lane % 4) holds physical k = 8c..8c+7 of its rows;
// the first mma takes k 8c+{0,1} as the fragment's logical 2c+{0,1} and 8c+{2,3} as 2c+8+{0,1},
// the second mma 8c+{4..7} likewise, and the token operand (same lane, same physical k) lines up
// with it. Accumulators are reduced over the warps in shared memory in a fixed order.
#include <algorithm>
#include <string>

#include "kernels/common/alignment.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm80_ptx.cuh"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/norm_rope/rms_norm_row.cuh"

namespace strata::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStepK = 64;  // 4 lanes x 2 vectors x 8 elements

// kDepth: reduction steps whose loads a warp issues before their MMAs (bytes in flight). At depth
// 4 the SASS issues them in two halves: the third step's row address is recomputed from constant
// loads that wait on the first steps' weight loads. All four at once (the row pointers held in
// registers) made the gate|up grids slower, so that throttle is relied on (docs/decode-notes.md).
// kEarly (down kernels, p.weights_static): the expert and the weights of the first pass are read
// before the programmatic-launch wait, while the kernel before this one still runs; the token
// rows only after it. This kernel is launched once every block of the one before has passed its
// own wait, so the alignment arrays (written two kernels back) are complete by then.
// kMT: 16-row weight tiles per CTA. At 2, a gate|up CTA takes 16 features (its gate rows in
// tile 0, up rows in tile 1), a down CTA 32 rows; at 1, a gate|up CTA takes 8 features (gate
// rows g, up rows g + 8 of the one tile), a down CTA 16 rows.
// kNorm: the one token row is formed from p.norm_in in shared memory (MoeNormIn), after the
// launch wait and, with kEarly, while the first weights are in flight.
template <int kNT, bool kGateUp, int kDepth, bool kEarly = false, int kMT = 2, bool kNorm = false>
__global__ void __launch_bounds__(kThreads, 2) MoeExpertsKernel(MoeExpertsParams p) {
  static_assert(!kEarly || !kGateUp, "the gate|up kernel's experts come from the kernel before");
  static_assert(kMT == 1 || kMT == 2);
  static_assert(!kNorm || kNT == 1, "a formed input is one token row");
  static_assert(kDepth * kMT <= 4, "two CTAs per SM: at most 4 tile-steps of weights in registers");
  __shared__ float red[kWarps][kMT][kNT][4][32];
  if constexpr (!kEarly) PdlGridSync();
  int e = 0, count = p.num_tokens, first = 0;
  if (!p.identity) {
    // Both reads at once (one L2 round trip, not two): `active` has num_experts >= max_active
    // entries, so the row past *num_active is in bounds, and not used.
    const int num_active = *p.num_active;
    e = p.active[blockIdx.y];
    if (static_cast<int>(blockIdx.y) >= num_active) return;
    count = p.expert_count[e];
    first = p.expert_offset[e];
  }
  const int k_dim = kGateUp ? p.hidden : p.inter;
  const int rows = kGateUp ? p.inter : p.hidden;
  const int row0 = blockIdx.x * (kGateUp ? 8 * kMT : 16 * kMT);
  const __nv_bfloat16* w =
      kGateUp || p.down == nullptr
          ? p.weights + static_cast<int64_t>(e) * p.expert_stride +
                (kGateUp ? 0 : 2 * static_cast<int64_t>(p.inter) * p.hidden)
          : p.down + static_cast<int64_t>(e) * p.expert_stride + blockIdx.z * p.batch_stride_w;
  const __nv_bfloat16* down_in =
      (p.down_in != nullptr ? p.down_in : p.act) + blockIdx.z * p.batch_stride_in;
  const int64_t ld_in = p.ld_down_in != 0 ? p.ld_down_in : p.inter;
  const int64_t ld_out = p.ld_out != 0 ? p.ld_out : p.hidden;
  const int64_t out_base = blockIdx.z * p.batch_stride_out;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;

  const uint4* wrow[kMT][2];
  bool wok[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // gate|up: kMT 2 puts the gate rows in tile 0 and the up rows in tile 1; kMT 1 the gate
      // rows in the tile's first 8 rows and the up rows in its last 8.
      const int r = row0 + (kGateUp ? (kMT == 2 ? 8 * h : 0) : 16 * mt + 8 * h) + g;
      wok[mt][h] = r < rows;
      const int64_t phys = kGateUp ? static_cast<int64_t>(kMT == 2 ? mt : h) * p.inter + r : r;
      wrow[mt][h] = reinterpret_cast<const uint4*>(w + (wok[mt][h] ? phys : 0) * k_dim);
    }
  }
  const int num_steps = (k_dim + kStepK - 1) / kStepK;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // Two 16-byte vectors of each of the lane's 2 x kMT weight rows at step s (zeros past k).
  auto load_w = [&](int s, uint4(&wv)[kMT][2][2]) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int idx = s * (kStepK / 8) + 4 * v + c;
      const bool in_k = idx * 8 < k_dim;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wv[mt][h][v] = wok[mt][h] && in_k ? LoadStream(wrow[mt][h] + idx) : zero;
        }
      }
    }
  };
  uint4 wv[kDepth][kMT][2][2];  // the weights of the kDepth steps in flight
  if constexpr (kEarly) {
    if (count > 0) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) load_w(warp + d * kWarps, wv[d]);  // the first pass's
    }
    PdlGridSync();
  }
  const uint4* formed = nullptr;  // kNorm: the input row
  if constexpr (kNorm) {
    __shared__ uint4 row[kMoeNormInMaxDim / 8];
    __shared__ norm_row::MoeChoices choices;
    __shared__ float scratch[kWarps];
    const bool writer = p.norm_in.writes && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    norm_row::NormRowInto<kThreads>(p.norm_in.params, writer, row, choices, scratch);
    formed = row;
  }

  for (int chunk = 0; chunk < count; chunk += 8 * kNT) {
    const int left = count - chunk;
    const int tiles = min(kNT, (left + 7) / 8);
    const uint4* xrow[kNT];
    bool xok[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int t = nt * 8 + g;
      xok[nt] = t < left;
      const int slot = first + chunk + (xok[nt] ? t : 0);
      if (kNorm) {
        xrow[nt] = formed;
      } else if (kGateUp) {
        // One token: every slot is token 0 (no slot_token read on the way to the row).
        const int64_t token = p.identity ? slot : p.num_tokens == 1 ? 0 : p.slot_token[slot];
        xrow[nt] = reinterpret_cast<const uint4*>(p.x + token * p.ld_x);
      } else {
        xrow[nt] = reinterpret_cast<const uint4*>(down_in + slot * ld_in);
      }
    }
    float acc[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
      }
    }
    // One step: the weights (load_w) and two 16-byte vectors of the lane's token rows (zeros
    // past k: a step past the end loads nothing and adds nothing).
    auto load = [&](int s, uint4(&wv)[kMT][2][2], uint4(&xv)[kNT][2], bool w_loaded) {
      if (!w_loaded) load_w(s, wv);
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int idx = s * (kStepK / 8) + 4 * v + c;
        const bool in_k = idx * 8 < k_dim;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          xv[nt][v] = nt < tiles && xok[nt] && in_k ? xrow[nt][idx] : zero;
        }
      }
    };
    auto mma = [&](const uint4(&wv)[kMT][2][2], const uint4(&xv)[kNT][2]) {
#pragma unroll
      for (int v = 0; v < 2; ++v) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (nt >= tiles) continue;
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            const uint32_t a0[4] = {wv[mt][0][v].x, wv[mt][1][v].x, wv[mt][0][v].y, wv[mt][1][v].y};
            Mma(acc[mt][nt], a0, xv[nt][v].x, xv[nt][v].y);
            const uint32_t a1[4] = {wv[mt][0][v].z, wv[mt][1][v].z, wv[mt][0][v].w, wv[mt][1][v].w};
            Mma(acc[mt][nt], a1, xv[nt][v].z, xv[nt][v].w);
          }
        }
      }
    };
    for (int s = warp; s < num_steps; s += kDepth * kWarps) {
      uint4 xv[kDepth][kNT][2];
      const bool early = kEarly && chunk == 0 && s == warp;  // wv holds these weights already
#pragma unroll
      for (int d = 0; d < kDepth; ++d) load(s + d * kWarps, wv[d], xv[d], early);
#pragma unroll
      for (int d = 0; d < kDepth; ++d) mma(wv[d], xv[d]);
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][mt][nt][i][lane] = acc[mt][nt][i];
      }
    }
    __syncthreads();
    // Fragment element i of lane l: row l / 4 + 8 (i / 2), token 2 (l % 4) + i % 2.
    for (int idx = threadIdx.x; idx < kNT * 4 * 32; idx += kThreads) {
      const int nt = idx / 128, i = (idx / 32) % 4, l = idx % 32;
      const int row = l / 4 + 8 * (i / 2);
      const int t = nt * 8 + 2 * (l % 4) + i % 2;
      if (t >= left) continue;
      // v0: tile 0's element; v1: tile 1's, or at kMT 1 for gate|up the up row's (element i + 2).
      if (kMT == 1 && kGateUp && i >= 2) continue;
      const int i1 = kMT == 1 && kGateUp ? i + 2 : i;
      float v0 = 0.f, v1 = 0.f;
#pragma unroll
      for (int ww = 0; ww < kWarps; ++ww) {
        v0 += red[ww][0][nt][i][l];
        if (kMT == 2 || kGateUp) v1 += red[ww][kMT - 1][nt][i1][l];
      }
      const int64_t slot = first + chunk + t;
      if (kGateUp) {
        const int f = row0 + row;
        if (f < rows) {
          const float gate = __bfloat162float(__float2bfloat16_rn(v0));
          const float up = __bfloat162float(__float2bfloat16_rn(v1));
          p.act[slot * p.inter + f] = __float2bfloat16_rn(gate / (1.f + expf(-gate)) * up);
        }
      } else {
        const int r = row0 + row;
        const int64_t o = out_base + slot * ld_out + r;
        if (p.out_f32 != nullptr) {
          if (r < rows) p.out_f32[o] = v0;
          if (kMT == 2 && r + 16 < rows) p.out_f32[o + 16] = v1;
        } else {
          if (r < rows) p.out[o] = __float2bfloat16_rn(v0);
          if (kMT == 2 && r + 16 < rows) p.out[o + 16] = __float2bfloat16_rn(v1);
        }
      }
    }
    __syncthreads();
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchMoeExperts: " + what);
}

// Whether the dim-element rows at a and b share an element.
bool Overlap(const __nv_bfloat16* a, const __nv_bfloat16* b, int dim) {
  return a != nullptr && b != nullptr && a < b + dim && b < a + dim;
}

// What is wrong with `n` for a launch of `tokens` rows of dim-wide input ("" when nothing is).
std::string NormInProblem(const MoeNormIn& n, int tokens, int dim) {
  const RmsNormParams& q = n.params;
  if (q.rows == 0) return "";
  if (q.rows != 1 || tokens != 1) return "norm_in forms one token row (rows 1, tokens 1)";
  if (q.dim != dim) return "norm_in.dim must be the input width " + std::to_string(dim);
  if (dim > kMoeNormInMaxDim) return "norm_in.dim must be <= " + std::to_string(kMoeNormInMaxDim);
  if (absl::Status st = ValidateRmsNormParams(q); !st.ok()) {
    return "norm_in: " + std::string(st.message());
  }
  if (n.writes) {
    const __nv_bfloat16* inputs[] = {q.moe.top_k > 0 ? nullptr : q.x, q.residual, q.moe.shared,
                                     q.weight};
    for (const __nv_bfloat16* in : inputs) {
      if (Overlap(q.residual_out, in, dim) || Overlap(q.out, in, dim)) {
        return "norm_in.writes: residual_out and out must not overlap the norm's inputs";
      }
    }
  }
  return "";
}

// The down kernel loads its first weights before the launch wait when they are static (H200,
// v2-lite-shape decode, greedy GPU ms, three alternating rounds: batch 1 2.411-2.416 vs
// 2.451-2.456, batch 4 4.290-4.293 vs 4.323-4.340, batch 16 7.705-7.713 vs 7.748-7.764).
template <int kNT, bool kGateUp, int kDepth, int kMT>
auto* KernelFor(bool weights_static, bool norm) {
  if constexpr (kNT == 1) {  // one token row: it may be formed from a norm
    if (norm) {
      if constexpr (!kGateUp) {
        if (weights_static) return MoeExpertsKernel<kNT, kGateUp, kDepth, true, kMT, true>;
      }
      return MoeExpertsKernel<kNT, kGateUp, kDepth, false, kMT, true>;
    }
  }
  if constexpr (!kGateUp) {
    if (weights_static) return MoeExpertsKernel<kNT, kGateUp, kDepth, true, kMT>;
  }
  return MoeExpertsKernel<kNT, kGateUp, kDepth, false, kMT>;
}

// Launches the gate|up (kGateUp) or down kernel over `rows` output rows (gate|up: features) of
// grid_y experts x grid_z batches. The deep form: one 16-row tile per CTA (gate|up: 8 features),
// two CTAs per SM, with 4 steps in flight per warp at one token tile, 2 at two; otherwise depth 1
// on two tiles. The kernel's tile count and the grid's CTA rows come from the same kMT here.
// `norm`: this kernel forms its input row from p.norm_in.
template <int kNT, bool kGateUp>
void LaunchKernel(bool deep, bool norm, int rows, unsigned grid_y, unsigned grid_z,
                  const MoeExpertsParams& p, cudaStream_t stream) {
  constexpr int kTileRows = kGateUp ? 8 : 16;  // CTA rows per 16-row weight tile
  constexpr int kDeepDepth = kNT == 1 ? 4 : 2;
  auto* k = KernelFor<kNT, kGateUp, 1, 2>(p.weights_static, norm);
  int cta_rows = 2 * kTileRows;
  if (deep) {
    k = KernelFor<kNT, kGateUp, kDeepDepth, 1>(p.weights_static, norm);
    cta_rows = kTileRows;
  }
  const dim3 grid((rows + cta_rows - 1) / cta_rows, grid_y, grid_z);
  (void)LaunchPdl(k, grid, dim3(kThreads), 0, stream, p);
}

// Two token tiles take the deep form up to this many tokens (the most it was measured at).
constexpr int kDeepTwoTileMaxTokens = 16;

template <int kNT>
absl::Status Launch(const MoeExpertsParams& p, cudaStream_t stream, bool gate_up = true) {
  // Bytes in flight set the speed of these GEMVs at decode sizes: the deep form issues a warp's
  // 4 steps (one token tile; over 8 warps all of a 2048-wide reduction) or 2 (two token tiles,
  // whose token rows take the other registers) before their MMAs, and with one 16-row weight tile
  // per CTA two CTAs share an SM, one loading while the other reduces and writes. H200,
  // v2-lite-shape decode (session 21). One token tile, Nsight Compute per kernel at batch 1
  // against two row tiles at depth 4 (gate|up) or 2 (long downs): routed gate|up 29.7 -> 22.5 us
  // (69 MB), q|kv_a 8.5 -> 7.6, o_proj 7.3 -> 5.9, shared gate|up 13.0 -> 10.1, shared down 9.2
  // -> 7.6, router logits 6.2 -> 4.1, dense gate|up 34 -> 26, dense down 24.3 -> 17. Two token
  // tiles, batch 16 greedy step: 7.49 vs 7.66 ms GPU. Downs of fewer than 4 x 8 steps (the routed
  // down at 1408, q.W_UK) stay at depth 1 on two row tiles: in the deep form the routed down took
  // 13.1 -> 17 us and q.W_UK 4.2 -> 5.8 us (batch 1 step 2.223 vs 2.158 ms; depth 2 on two row
  // tiles 2.210 ms), at batch 16 the step 7.49 -> 7.94 ms. Depth 2 on one row tile at one token
  // tile (three CTAs per SM) lost everywhere. The accumulation order is s, s + kWarps,
  // s + 2 kWarps, ... in every form, so the results are equal.
  const bool deep_tiles = kNT == 1 || p.num_tokens <= kDeepTwoTileMaxTokens;
  const bool norm = p.norm_in.params.rows != 0;  // formed by the first kernel (MoeNormIn)
  cudaError_t err = cudaSuccess;
  if (gate_up) {
    LaunchKernel<kNT, true>(deep_tiles, norm, p.inter, p.max_active, 1, p, stream);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    const int steps = (p.inter + kStepK - 1) / kStepK;
    LaunchKernel<kNT, false>(deep_tiles && steps >= 4 * kWarps, norm && !gate_up, p.hidden,
                             p.max_active, p.batch, p, stream);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchMoeExperts: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMoeExpertsParams(const MoeExpertsParams& p) {
  if (p.num_tokens < 0) return Invalid("num_tokens must be >= 0");
  if (p.num_experts <= 0) return Invalid("num_experts must be > 0");
  if (p.max_active < 0 || p.max_active > p.num_experts || p.max_active > 65535) {
    return Invalid("max_active must be in 0..min(num_experts, 65535)");
  }
  if (p.hidden <= 0 || p.hidden % 8 != 0 || p.inter <= 0 || p.inter % 8 != 0) {
    return Invalid("hidden and inter must be positive multiples of 8");
  }
  if (p.token_tiles != 1 && p.token_tiles != 2) return Invalid("token_tiles must be 1 or 2");
  if (p.ld_x < p.hidden || p.ld_x % 8 != 0) return Invalid("ld_x must be >= hidden, multiple of 8");
  if (p.batch != 1) return Invalid("batch > 1 is for LaunchSkinnyGemm only");
  if (p.identity) {
    if (p.max_active != 1) return Invalid("identity needs max_active 1");
  } else {
    const int64_t held = (p.down == nullptr ? 3 : 2) * static_cast<int64_t>(p.inter) * p.hidden;
    if (p.expert_stride < held || p.expert_stride % 8 != 0) {
      return Invalid("expert_stride must hold an expert's weights and be a multiple of 8");
    }
    if (p.expert_count == nullptr || p.expert_offset == nullptr || p.active == nullptr ||
        p.num_active == nullptr || p.slot_token == nullptr) {
      return Invalid("the alignment arrays must be set");
    }
  }
  if (const std::string problem = NormInProblem(p.norm_in, p.num_tokens, p.hidden);
      !problem.empty()) {
    return Invalid(problem);
  }
  if (p.norm_in.params.rows != 0 && (p.token_tiles != 1 || !p.identity)) {
    return Invalid("norm_in needs token_tiles 1 and identity");
  }
  if ((p.x == nullptr && p.norm_in.params.rows == 0) || p.weights == nullptr || p.act == nullptr ||
      p.out == nullptr) {
    return Invalid("x (unless norm_in), weights, act and out must be set");
  }
  if (Misaligned(p.x) || Misaligned(p.weights) || Misaligned(p.act) || Misaligned(p.out) ||
      Misaligned(p.down)) {
    return Invalid("x, weights, down, act and out must be 16-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status LaunchMoeExperts(const MoeExpertsParams& params, cudaStream_t stream) {
  if (absl::Status st = ValidateMoeExpertsParams(params); !st.ok()) return st;
  if (params.num_tokens == 0 || params.max_active == 0) return absl::OkStatus();
  return params.token_tiles == 1 ? Launch<1>(params, stream) : Launch<2>(params, stream);
}

absl::Status ValidateSkinnyGemmParams(const SkinnyGemmParams& g) {
  if (g.tokens < 0 || g.n_out <= 0 || g.k <= 0 || g.k % 8 != 0 || g.batch <= 0 || g.batch > 65535) {
    return absl::InvalidArgumentError(
        "LaunchSkinnyGemm: tokens >= 0, n_out > 0, k a positive multiple of 8, batch 1..65535");
  }
  const int64_t ld_x = g.ld_x != 0 ? g.ld_x : g.k, ld_out = g.ld_out != 0 ? g.ld_out : g.n_out;
  if (ld_x < g.k || ld_x % 8 != 0 || ld_out < g.n_out || g.batch_stride_x % 8 != 0 ||
      g.batch_stride_w % 8 != 0) {
    return absl::InvalidArgumentError(
        "LaunchSkinnyGemm: ld_x >= k and x/w strides multiples of 8, ld_out >= n_out");
  }
  const bool norm = g.norm_in.params.rows != 0;
  if ((g.x == nullptr && !norm) || g.w == nullptr || (g.out == nullptr) == (g.out_f32 == nullptr) ||
      Misaligned(g.x) || Misaligned(g.w)) {
    return absl::InvalidArgumentError(
        "LaunchSkinnyGemm: x (unless norm_in) and w set and 16-byte aligned, exactly one of out "
        "and out_f32");
  }
  if (const std::string problem = NormInProblem(g.norm_in, g.tokens * g.batch, g.k);
      !problem.empty()) {
    return absl::InvalidArgumentError("LaunchSkinnyGemm: " + problem);
  }
  return absl::OkStatus();
}

absl::Status LaunchSkinnyGemm(const SkinnyGemmParams& g, cudaStream_t stream) {
  if (absl::Status st = ValidateSkinnyGemmParams(g); !st.ok()) return st;
  const int64_t ld_x = g.ld_x != 0 ? g.ld_x : g.k, ld_out = g.ld_out != 0 ? g.ld_out : g.n_out;
  if (g.tokens == 0) return absl::OkStatus();
  // The down kernel of one identity-routed expert: hidden = n_out rows, inter = k.
  MoeExpertsParams p;
  p.num_tokens = g.tokens;
  p.num_experts = 1;
  p.max_active = 1;
  p.hidden = g.n_out;
  p.inter = g.k;
  p.identity = true;
  p.weights = g.w;
  p.down = g.w;
  p.down_in = g.x;
  p.ld_down_in = ld_x;
  p.out = g.out;
  p.out_f32 = g.out_f32;
  p.ld_out = ld_out;
  p.batch = g.batch;
  p.batch_stride_w = g.batch_stride_w;
  p.batch_stride_in = g.batch_stride_x;
  p.batch_stride_out = g.batch_stride_out;
  p.weights_static = g.weights_static;
  p.norm_in = g.norm_in;
  return g.tokens <= 8 ? Launch<1>(p, stream, /*gate_up=*/false)
                       : Launch<2>(p, stream, /*gate_up=*/false);
}

}  // namespace strata::kernels
