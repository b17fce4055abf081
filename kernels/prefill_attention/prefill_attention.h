// Prefill attention of DeepSeek-V2/V3 in the MHA form over decompressed k/v: q/k head dim 192
// (128 nope + 64 rope), v head dim 128, bf16 in and out, fp32 accumulation, variable lengths.
//
// For sequence b with q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b] query rows and k_len key rows,
// query row i attends key j iff j < k_len and (not causal or j <= i + k_len - q_len) (causal is
// aligned bottom-right: the new tokens are the last q_len of the k_len). Per (row, head):
//   out = softmax(scale * q . k_j) . v_j,   lse = ln(sum_j exp(scale * q . k_j))
// A row that sees no key gets out = 0 and lse = -inf.
//
// Chunked prefix: with accumulate = true the result is merged by log-sum-exp into what out/lse
// already hold (a row whose stored lse is -inf counts as empty and its out is not read), so a long
// cached prefix is decompressed and attended chunk by chunk (causal = false, every new token sees
// every prefix key), then the new tokens themselves (causal = true), all into one out/lse:
//   lse' = ln(e^lse + e^lse_new),  out' = out e^(lse - lse') + out_new e^(lse_new - lse').
//
// Usage:
//   PrefillAttentionParams p = {...};
//   RETURN_IF_ERROR(LaunchPrefillAttention(p, stream));
// Preconditions the launcher cannot check (device memory): cu_seqlens are non-decreasing and
// every q_len <= max_seqlen_q; the tensors cover the rows they name. Thread safety: stateless;
// out/lse of concurrent launches must not overlap.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

inline constexpr int kPrefillQkDim = 192;
inline constexpr int kPrefillVDim = 128;

struct PrefillAttentionParams {
  int batch = 0;
  int num_heads = 0;
  int max_seqlen_q = 0;  // longest q_len (sizes the grid)
  bool causal = true;
  bool accumulate = false;
  float softmax_scale = 0.f;
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1], device
  const int32_t* cu_seqlens_k = nullptr;  // [batch + 1], device
  // Row r, head h of each tensor is at ptr + r * token_stride + h * head_stride (elements,
  // multiples of 8; pointers 16-byte aligned).
  const __nv_bfloat16* q = nullptr;  // [total_q][heads][192]
  int64_t q_token_stride = 0, q_head_stride = 0;
  const __nv_bfloat16* k = nullptr;  // [total_k][heads][192]
  int64_t k_token_stride = 0, k_head_stride = 0;
  const __nv_bfloat16* v = nullptr;  // [total_k][heads][128]
  int64_t v_token_stride = 0, v_head_stride = 0;
  __nv_bfloat16* out = nullptr;  // [total_q][heads][128]
  int64_t out_token_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // [total_q][num_heads], natural log
  // Rows of k and v (cu_seqlens_k[batch]); the TMA variant needs it to bound its loads (0:
  // unknown, and LaunchPrefillAttention takes a variant that does not).
  int64_t total_k = 0;
};

absl::Status ValidatePrefillAttentionParams(const PrefillAttentionParams& params);
absl::Status LaunchPrefillAttention(const PrefillAttentionParams& params, cudaStream_t stream);

// Internal, for tests and benchmarks: the same computation by one of kPrefillAttentionVariants
// kernel variants: 0 / 1: 8 warps, 128 query rows per block, Q re-read from shared memory per key
// tile / Q held in registers; 2 / 3: the same with 4 warps and 64 rows (2 blocks per SM); 4: as 1
// with S = Q K^T on wgmma (sm_90a); 5: as 4 with P V on wgmma too. 4 and 5 are correct but not yet
// faster (each wgmma is waited for at once; see prefill_attention/NOTES.md); 6: both on wgmma with
// S(t+1) issued before the softmax of tile t (3-stage ring); 7: TMA loads by a producer
// warpgroup into a 4-stage ring, two consumer warpgroups on wgmma (sm_90a, needs total_k); 8: as
// 7 with the softmax of tile t + 1 beside P V of tile t.
// LaunchPrefillAttention takes PrefillAttentionVariantFor(params): 8 where it applies (total_k
// set, a compute capability 9.x device), else 1 (the fastest of the others on the H200).
inline constexpr int kPrefillAttentionVariants = 9;
int PrefillAttentionVariantFor(const PrefillAttentionParams& params);
absl::Status LaunchPrefillAttentionVariant(const PrefillAttentionParams& params, int variant,
                                           cudaStream_t stream);
// Internal: variants 7 and 8 (prefill_attention_sm90.cu).
absl::Status LaunchPrefillAttentionSm90(const PrefillAttentionParams& params, bool overlap,
                                        cudaStream_t stream);

}  // namespace strata::kernels
