// The CUDA engine's state and step plan, shared by its .cc files (cuda_engine.cc: creation,
// planning, the layer loop; attention_step.cc: both attention forms). Internal to the backend.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "compute_nodes/backend/cuda/cublas_gemm.h"
#include "compute_nodes/backend/cuda/cuda_engine.h"
#include "compute_nodes/backend/cuda/decode_graph.h"
#include "compute_nodes/backend/cuda/device_kv_pool.h"
#include "compute_nodes/backend/cuda/device_weights.h"
#include "compute_nodes/backend/cuda/moe_block.h"
#include "compute_nodes/backend/cuda/step_util.h"
#include "kernels/prefill_attention/prefill_attention.h"

namespace strata::cuda {
namespace engine_detail {

constexpr int64_t kRow = 576;  // latent 512 + k_pe 64: one KV row
constexpr int64_t kLatent = 512;
constexpr int64_t kRope = 64;
constexpr int64_t kPadQk = kernels::kPrefillQkDim;  // 192 = 128 (nope, zero-padded) + 64
constexpr int64_t kPadNope = kPadQk - kRope;
constexpr int64_t kPadV = kernels::kPrefillVDim;  // 128

// A prefill (MHA) sequence of the step: its rows, context, and offsets of its context rows and
// cu_seqlens in the step's metadata.
struct MhaSeq {
  int64_t first_row, q_len, ctx;
  size_t lat_off, cu_off;
};

// The host's view of one step: what the enqueued work needs besides the device buffers.
struct StepPlan {
  int64_t n = 0;  // new tokens (activation rows)
  int64_t m = 0;  // of them, absorbed-form (MLA decode) rows
  bool all_decode = false;
  std::vector<MhaSeq> mha;
  int64_t max_ctx = 0, max_q = 0;
  int64_t table_pages = 0;  // block-table width of the decode rows
  int num_splits = 1;       // MLA decode splits
  int64_t total_out = 0;    // logits rows
  std::vector<int64_t> out_rows, out_first;
  int64_t kv_rows_read = 0;  // latent rows attention reads per layer
  // Offsets into the step's metadata buffer.
  size_t o_ids = 0, o_pos = 0, o_kv = 0, o_dec = 0, o_dlen = 0, o_dtab = 0, o_lat = 0, o_cu = 0,
         o_out = 0;
};

}  // namespace engine_detail

struct CudaEngine::Impl {
  Impl(const DeviceWeights& w, DeviceKvPool& p, const Cublas& b, cudaStream_t st,
       std::unique_ptr<SideStream> side_stream, const CudaEngineOptions& o)
      : W(w),
        pool(p),
        blas(b),
        s(st),
        side(std::move(side_stream)),
        options(o),
        moe(w.config(), &b, st, side.get(), o.moe_device_max_tokens, o.moe_grouped, &grows) {}
  ~Impl() {
    if (inv_freq != nullptr) (void)cudaFree(inv_freq);
    if (wuk_t != nullptr) (void)cudaFree(wuk_t);
    if (ev_start != nullptr) (void)cudaEventDestroy(ev_start);
    if (ev_end != nullptr) (void)cudaEventDestroy(ev_end);
    if (ev_copied != nullptr) (void)cudaEventDestroy(ev_copied);
  }
  using bf16 = __nv_bfloat16;
  using StepPlan = engine_detail::StepPlan;

  absl::Status Plan(std::span<const runtime::SequenceInput> batch, StepPlan* plan);
  absl::Status Reserve(const StepPlan& plan);
  absl::Status Enqueue(const StepPlan& plan);
  // RMSNorm of `in` (+ residual, the sum written to residual_out), or with moe_sum set of a MoE
  // block's output summed on the way (kernels/norm_rope/rms_norm.h; `in` unused): the parameters
  // for LaunchRmsNorm, or for a one-row projection that forms its input itself (MoeNormIn).
  kernels::RmsNormParams NormParams(int64_t rows, int64_t dim, const bf16* in, int64_t ld_in,
                                    const bf16* residual, bf16* residual_out, const bf16* weight,
                                    bf16* out, int64_t ld_out,
                                    const kernels::RmsNormMoeSum& moe_sum = {}) const;
  // One kernel for a layer's RoPE: the step's new latent rows (kv_a_proj output, [n][576] at
  // stride ld_kv_a) normed, roped and written into their pages, and the query rows' q_pe roped.
  // `beside`: launched right after QueryLatent, to run beside it (RopeBesideQuery).
  absl::Status RopeRows(const bf16* kv_a, int64_t ld_kv_a, const bf16* norm_weight,
                        const StepPlan& P, bf16* pages, bool beside);
  // Whether a layer launches QueryLatent first and RopeRows beside it (LatentRowsParams::
  // beside_previous): decode-only steps with programmatic launches and the skinny q·W_UK,
  // whose query rows neither kernel writes. Else RopeRows runs first, then QueryLatent.
  bool RopeBesideQuery(const StepPlan& P) const;
  // Whether RopeRows writes q_pe straight into the MLA query rows (decode-only steps: row r is
  // decode row r) or AbsorbedAttention copies it there (mixed steps gather the decode rows).
  static bool RopesIntoQueryRows(const StepPlan& P) { return P.all_decode; }
  // The query rows [n][heads * qk_head_dim] at stride QueryLd(): q_b_proj's output, or without
  // q_lora_rank the first columns of the fused q|kv_a projection's output.
  bf16* QueryRows() const { return W.config().q_lora_rank > 0 ? q.as<bf16>() : qkva.as<bf16>(); }
  int64_t QueryLd() const {
    const model::ModelConfig& c = W.config();
    return c.q_lora_rank > 0 ? c.num_attention_heads * c.qk_head_dim() : QkvaLd();
  }
  // MLA query heads padded to the decode kernels' 16-head blocks (the padded heads' query rows
  // stay zero).
  int64_t QueryHeadsPadded() const { return (W.config().num_attention_heads + 15) / 16 * 16; }
  // The fused projection's row: [q (or the low-rank q_a) | c_kv | k_pe].
  int64_t QkvaLd() const { return W.layers().front().q_kv_a.out; }
  absl::Status MhaAttention(const DeviceLayer& L, const StepPlan& P, int64_t layer);
  // Picks every output row's token on the GPU with its sequence's draw (rows before a sequence's
  // last, and sequences without a draw, are picked greedily and never read) and queues their
  // copy into host_logits (already large enough) at byte `at`.
  absl::Status PickTokens(std::span<const runtime::SequenceInput> batch, const StepPlan& P,
                          int64_t vocab, size_t at);
  // q_lat = q_nope · W_UK into the MLA query rows (q_pe copied beside it on mixed steps).
  absl::Status QueryLatent(const DeviceLayer& L, const StepPlan& P, int64_t layer);
  // MLA decode of the decode rows, then · W_UVᵀ; QueryLatent first unless `query_latent_done`.
  absl::Status AbsorbedAttention(const DeviceLayer& L, const StepPlan& P, int64_t layer,
                                 bool query_latent_done);

  const DeviceWeights& W;
  DeviceKvPool& pool;
  const Cublas& blas;
  cudaStream_t s;
  std::unique_ptr<SideStream> side;  // parallel branches: the shared experts, q_pe copies
  const CudaEngineOptions options;
  int64_t grows = 0;          // buffer reallocations (declared before the buffers that count)
  float* inv_freq = nullptr;  // [rope / 2]
  // W_UK of every layer transposed, [layers][heads][512][nope]: the absorbed q · W_UK as a skinny
  // GEMM over contiguous rows (null when nope is not a multiple of 8).
  bf16* wuk_t = nullptr;
  int num_sms = 132;
  cudaEvent_t ev_start = nullptr, ev_end = nullptr, ev_copied = nullptr;
  // [logits rows][vocab] fp32 (unless every token was picked), then [logits rows] tokens.
  PinnedBuf host_logits;
  // Tokens picked on the GPU (outside the graphs: no address to keep).
  Buf tokens;            // [logits rows] int32
  PinnedBuf host_draws;  // [logits rows] kernels::SampleRowDraw
  Buf draws;             // [logits rows] kernels::SampleRowDraw
  Meta meta{&grows};
  // Activations.
  // qkva: [n][QkvaLd()], the fused q|kv_a projection; q: q_b_proj's output and qa: the normed
  // low-rank query (models with q_lora_rank).
  // x and x2: the residual stream, alternating (each norm fused with the residual add reads one
  // and writes the other; see Enqueue).
  Buf x{&grows}, x2{&grows}, xn{&grows}, delta{&grows}, qkva{&grows}, q{&grows}, qa{&grows},
      attn{&grows}, gu{&grows};
  // Decode (absorbed).
  Buf qd{&grows}, qfull{&grows}, olat{&grows}, dlse{&grows}, dws{&grows}, od{&grows};
  // Prefill (MHA).
  Buf lat{&grows}, kp{&grows}, vp{&grows}, qp{&grows}, op{&grows}, plse{&grows};
  // Output.
  Buf fin{&grows}, logits{&grows};
  MoeBlock moe;
  DecodeGraphs graphs;
};

}  // namespace strata::cuda
