// MLA decode attention in the absorbed form (DeepSeek-V2/V3), bf16, over a paged latent KV
// cache, with split-KV across the SMs and a log-sum-exp combine step.
//
// For each sequence b and query head h:
//   s[t]      = softmax_scale * dot(q[b][h][0:576], kv[token t][0:576])     for t < seqlens[b]
//   out[b][h] = sum_t softmax(s)[t] * kv[token t][0:512]                    (value = latent part)
//   lse[b][h] = ln(sum_t exp(s[t]))                                         (natural log)
// Token t of sequence b lives at kv_cache[block_table[b][t / 64]][t % 64].
//
// fp8 KV (kv_dtype kFp8E4M3, kv_cache_fp8): a page holds its 64 tokens in the block format's fp8
// layer layout (docs/block-format.md, 656 B per token): latent [64][512] e4m3, then scales
// [64][4] f32 (one per 128 latent values), then k_pe [64][64] bf16, 41,984 B per page, so a block
// saves and loads with plain copies. The kernel reads those bytes, dequantizes each tile in shared
// memory to bf16(e4m3 x scale) (as the kv_pages fp8 load does) and runs the bf16 math on it: its
// output equals the bf16 kernel's on the dequantized cache, bit for bit.
//
// Usage:
//   MlaDecodeParams p = {...};
//   p.num_splits = MlaDecodeNumSplits(batch, num_heads_q, max_seqlen, num_sms);
//   // workspace of MlaDecodeWorkspaceBytes(batch, num_heads_q, p.num_splits) bytes, 256-aligned
//   RETURN_IF_ERROR(LaunchMlaDecode(p, stream));
//
// Preconditions the launcher cannot check (device memory): every block_table entry used by a
// sequence is in [0, num_pages); seqlens[b] >= 0. Lengths above max_pages_per_seq * 64 are clamped.
// A sequence of length 0 gets out = 0 and lse = -inf. Tokens past seqlens[b] in the last page are
// never read (their contents, NaN included, do not matter).
//
// Thread safety: the launcher is stateless; concurrent launches on different streams need
// different workspaces.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

inline constexpr int kMlaQkHeadDim = 576;  // 512 latent + 64 rope
inline constexpr int kMlaValueDim = 512;
inline constexpr int kMlaPageSize = 64;  // tokens per KV page
inline constexpr int kMlaMaxSplits = 64;
inline constexpr int kMlaFp8PageBytes = kMlaPageSize * (kMlaValueDim + 4 * 4 + 64 * 2);  // 41,984

enum class MlaKvDtype { kBf16, kFp8E4M3 };

// Which kernel computes the attention. kAuto (MlaDecodeAutoImpl) takes a Hopper kernel (TMA +
// wgmma, blocks of 64 heads; fewer heads fill the block's rows and drop the rest) where they apply
// (bf16 pages on a compute capability 9.x device): kSm90Seesaw (each warpgroup the scores of
// its own tile of a pair and half of O, loads refilled box by box; mla_decode_sm90_seesaw.cu) for
// h_q >= 64, kSm90 (both warpgroups on every tile, a producer warpgroup; mla_decode_sm90.cu) for
// h_q 32..63, and at h_q 16 kSm90Transposed (mla_decode_sm90_transposed.cu:
// scores as S^T = K Q^T with the heads as the wgmma's N, for h_q 16 and 32 only), except for a
// few-row call (batch x max_pages_per_seq <= the SM count), which the mma.sync kernel finishes
// sooner. Else the mma.sync kernel (blocks of 16, 32 or 64 heads, bf16 or fp8 pages). Naming one
// forces it (the Hopper kernels fail where they do not apply): for tests and side-by-side
// benchmarks.
enum class MlaDecodeImpl { kAuto, kMmaSync, kSm90, kSm90Seesaw, kSm90Transposed };

struct MlaDecodeParams {
  int batch = 0;
  int num_heads_q = 0;  // 16..128, a multiple of 16
  int num_pages = 0;    // pages in kv_cache
  int max_pages_per_seq = 0;
  int num_splits = 1;  // 1..kMlaMaxSplits; >1 needs the workspace and runs the combine kernel
  float softmax_scale = 0.f;
  MlaDecodeImpl impl = MlaDecodeImpl::kAuto;

  const __nv_bfloat16* q = nullptr;  // [batch][num_heads_q][576]
  MlaKvDtype kv_dtype = MlaKvDtype::kBf16;
  const __nv_bfloat16* kv_cache = nullptr;  // kBf16: [num_pages][64][576]
  const uint8_t* kv_cache_fp8 = nullptr;    // kFp8E4M3: [num_pages][kMlaFp8PageBytes]
  const int32_t* block_table = nullptr;     // [batch][max_pages_per_seq]
  const int32_t* seqlens = nullptr;         // [batch]
  __nv_bfloat16* out = nullptr;             // [batch][num_heads_q][512]
  float* lse = nullptr;                     // [batch][num_heads_q]
  // Split-KV partials (only when num_splits > 1), see MlaDecodeWorkspaceBytes:
  float* o_accum = nullptr;    // [batch][num_splits][num_heads_q][512]
  float* lse_accum = nullptr;  // [batch][num_splits][num_heads_q]
  // Rows that may still be being written when the kernel starts: 0 (the default) reads nothing
  // before the programmatic-launch wait. n > 0 promises that for every sequence the rows below
  // seqlens[b] - n, the block table and seqlens were complete before the kernel launched ahead of
  // this one started (a decode step whose newest rows are written by the kernels just ahead): the
  // mma.sync and kSm90 kernels then load the first such pages while the kernels ahead finish.
  // The transposed and seesaw kernels ignore it.
  int fresh_rows = 0;
  // With num_splits > 1: run the split kernel only and leave its partials in o_accum / lse_accum
  // (out and lse are not written), for LaunchMlaCombineProject (combine_project.h) to merge.
  bool skip_combine = false;
};

// The kernel kAuto runs for `batch` sequences of up to `max_pages` 64-token pages (the launch's
// max_pages_per_seq) at h_q `num_heads_q` on a device of `num_sms` SMs (the current device for
// sm90 support).
MlaDecodeImpl MlaDecodeAutoImpl(int batch, int num_heads_q, int64_t max_pages, int num_sms,
                                MlaKvDtype kv_dtype);

// Splits per sequence that balance `batch` sequences of up to `max_seqlen` tokens over `num_sms`,
// for the blocks of the kernel `impl` runs (kAuto: MlaDecodeAutoImpl with max_seqlen / 64 pages,
// the kernel a launch with max_pages_per_seq = that runs).
int MlaDecodeNumSplits(int batch, int num_heads_q, int max_seqlen, int num_sms,
                       MlaKvDtype kv_dtype = MlaKvDtype::kBf16,
                       MlaDecodeImpl impl = MlaDecodeImpl::kAuto);

// Bytes of workspace for o_accum followed by lse_accum (0 when num_splits == 1).
size_t MlaDecodeWorkspaceBytes(int batch, int num_heads_q, int num_splits);

// Points o_accum/lse_accum of `params` into `workspace` (MlaDecodeWorkspaceBytes bytes).
void MlaDecodeSetWorkspace(MlaDecodeParams& params, void* workspace);

// Checks the arguments (InvalidArgument naming the bad one) without touching the device.
absl::Status ValidateMlaDecodeParams(const MlaDecodeParams& params);

// Validates, then enqueues the split kernel (and the combine kernel when num_splits > 1, unless
// skip_combine) on `stream`. Returns the CUDA error of either launch.
absl::Status LaunchMlaDecode(const MlaDecodeParams& params, cudaStream_t stream);

// Internal: one instantiation per heads-per-block (16, 32, 64), each in its own .cu.
template <int kMTiles>
absl::Status LaunchMlaDecodeSplitKv(const MlaDecodeParams& params, cudaStream_t stream);
absl::Status LaunchMlaDecodeCombine(const MlaDecodeParams& params, cudaStream_t stream);
// Whether the Hopper kernel applies to pages of `kv_dtype` on the current device.
bool MlaDecodeSm90Applies(MlaKvDtype kv_dtype);

// Whether the transposed Hopper kernel applies: h_q 16 or 32 and MlaDecodeSm90Applies.
bool MlaDecodeSm90TransposedApplies(int num_heads_q, MlaKvDtype kv_dtype);

// Internal: the Hopper kernels (mla_decode_sm90.cu, mla_decode_sm90_seesaw.cu,
// mla_decode_sm90_transposed.cu).
absl::Status LaunchMlaDecodeSm90(const MlaDecodeParams& params, cudaStream_t stream);
absl::Status LaunchMlaDecodeSm90Seesaw(const MlaDecodeParams& params, cudaStream_t stream);
absl::Status LaunchMlaDecodeSm90Transposed(const MlaDecodeParams& params, cudaStream_t stream);

}  // namespace strata::kernels
