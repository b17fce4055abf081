#include "compute_nodes/backend/cuda/cuda_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/cuda/cuda_status.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/backend/cuda/decode_graph.h"
#include "compute_nodes/backend/cuda/moe_block.h"
#include "compute_nodes/backend/cuda/step_util.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"
#include "kernels/common/pdl.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/moe_router/moe_router.h"
#include "kernels/norm_rope/rms_norm.h"
#include "kernels/norm_rope/rope.h"
#include "kernels/prefill_attention/prefill_attention.h"
#include "kernels/sampling/greedy_sample.h"
#include "kernels/sampling/sample.h"

namespace strata::cuda {
namespace {

using bf16 = __nv_bfloat16;
using model::ModelConfig;
using runtime::SequenceInput;

constexpr int64_t kRow = 576;  // latent 512 + k_pe 64: one KV row
constexpr int64_t kLatent = 512;
constexpr int64_t kRope = 64;
constexpr int64_t kPadQk = kernels::kPrefillQkDim;  // 192 = 128 (nope, zero-padded) + 64
constexpr int64_t kPadNope = kPadQk - kRope;
constexpr int64_t kPadV = kernels::kPrefillVDim;  // 128

kernels::RopeLanes Lanes(model::RopeLayout l) {
  switch (l) {
    case model::RopeLayout::kInterleaved:
      return kernels::RopeLanes::kInterleaved;
    case model::RopeLayout::kHalves:
      return kernels::RopeLanes::kHalves;
    case model::RopeLayout::kDeinterleaved:
    default:
      return kernels::RopeLanes::kDeinterleaved;
  }
}

// Block-table width of a step: a power of two, so that a decode graph stays valid while the
// sequences grow (the kernels read the real lengths; the padding entries are never used).
int64_t TablePages(int64_t pages) {
  int64_t p = 1;
  while (p < pages) p *= 2;
  return p;
}

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

// Copies each sequence's rows of the pinned logits into its (sized) output vector. A single
// thread copies ~6 GB/s here, so a large step (26 MB at batch 64) spreads the sequences over a
// few threads.
void CopyOutLogits(const float* pinned, const std::vector<int64_t>& first_row, int64_t vocab,
                   std::vector<runtime::SequenceOutput>* outputs) {
  const int64_t seqs = static_cast<int64_t>(outputs->size());
  auto copy = [&](int64_t lo, int64_t hi) {
    for (int64_t si = lo; si < hi; ++si) {
      auto& out = (*outputs)[si];
      std::memcpy(out.logits.data(), pinned + first_row[si] * vocab, out.logits.size() * 4);
    }
  };
  const int64_t bytes = (first_row.empty() ? 0 : first_row.back()) * vocab * 4;
  const int64_t threads = std::min<int64_t>(
      {seqs, bytes / (int64_t{2} << 20), std::max(1u, std::thread::hardware_concurrency()), 8});
  if (threads <= 1) {
    copy(0, seqs);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    pool.emplace_back(copy, seqs * t / threads, seqs * (t + 1) / threads);
  }
  copy(0, seqs / threads);
  for (std::thread& th : pool) th.join();
}

}  // namespace

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
  absl::Status Plan(std::span<const SequenceInput> batch, StepPlan* plan);
  absl::Status Reserve(const StepPlan& plan);
  absl::Status Enqueue(const StepPlan& plan);
  absl::Status Norm(int64_t rows, int64_t dim, const bf16* in, int64_t ld_in, bf16* residual,
                    const bf16* weight, bf16* out, int64_t ld_out, cudaStream_t stream);
  absl::Status Rope(bf16* x, int64_t rows, int64_t heads, int64_t token_stride, int64_t head_stride,
                    const StepPlan& P, cudaStream_t stream);
  absl::Status MhaAttention(const DeviceLayer& L, const StepPlan& P, int64_t layer);
  // Picks every output row's token on the GPU with its sequence's draw (rows before a sequence's
  // last, and sequences without a draw, are picked greedily and never read) and queues their
  // copy into host_logits (already large enough) at byte `at`.
  absl::Status PickTokens(std::span<const SequenceInput> batch, const StepPlan& P, int64_t vocab,
                          size_t at);
  absl::Status AbsorbedAttention(const DeviceLayer& L, const StepPlan& P, int64_t layer);

  const DeviceWeights& W;
  DeviceKvPool& pool;
  const Cublas& blas;
  cudaStream_t s;
  std::unique_ptr<SideStream> side;  // parallel branches: the KV path, the shared experts
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
  Buf x{&grows}, xn{&grows}, delta{&grows}, q{&grows}, qa{&grows}, kva{&grows}, attn{&grows},
      gu{&grows};
  // Decode (absorbed).
  Buf qd{&grows}, qfull{&grows}, olat{&grows}, dlse{&grows}, dws{&grows}, od{&grows};
  // Prefill (MHA).
  Buf lat{&grows}, kp{&grows}, vp{&grows}, qp{&grows}, op{&grows}, plse{&grows};
  // Output.
  Buf fin{&grows}, logits{&grows};
  MoeBlock moe;
  DecodeGraphs graphs;
};

absl::Status CudaAvailable() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return absl::UnavailableError(StrCat("no usable CUDA device: ", cudaGetErrorString(err)));
  }
  if (n == 0) return absl::UnavailableError("no CUDA device present");
  return absl::OkStatus();
}

CudaEngine::~CudaEngine() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  impl_.reset();
  blas_ = Cublas();
  pool_.reset();
  weights_.reset();
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::FromCheckpoint(
    const std::string& dir, const CudaEngineOptions& options, ModelFingerprint* fingerprint) {
  RETURN_IF_ERROR(CudaAvailable());
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(const std::string config_text, ReadFile(config_path));
  ASSIGN_OR_RETURN_WITH(model::ModelConfig config, model::ParseModelConfig(config_text),
                        config_path);
  ASSIGN_OR_RETURN(std::unique_ptr<model::TensorStore> store, model::TensorStore::Open(dir));
  if (fingerprint != nullptr) *fingerprint = model::CheckpointFingerprint(config_text, *store);
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> weights,
                   DeviceWeights::FromCheckpoint(config, *store));
  return Create(std::move(weights), options);
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    std::unique_ptr<DeviceWeights> weights, const CudaEngineOptions& options) {
  RETURN_IF_ERROR(CudaAvailable());
  const ModelConfig& c = weights->config();
  if (options.block_tokens != kernels::kMlaPageSize) {
    return absl::InvalidArgumentError(
        StrCat("cuda backend: block_tokens must be ", kernels::kMlaPageSize));
  }
  if (c.kv_lora_rank != kLatent || c.qk_rope_head_dim != kRope) {
    return absl::InvalidArgumentError("cuda backend: needs kv_lora_rank 512 and rope dim 64");
  }
  if (c.qk_nope_head_dim > kPadNope || c.v_head_dim > kPadV || c.num_attention_heads > 128) {
    return absl::InvalidArgumentError(
        "cuda backend: needs qk_nope_head_dim <= 128, v_head_dim <= 128, heads <= 128");
  }
  if (c.hidden_size % 8 != 0 || c.q_lora_rank % 8 != 0 || c.intermediate_size % 8 != 0 ||
      c.moe_intermediate_size % 8 != 0) {
    return absl::InvalidArgumentError(
        "cuda backend: hidden and intermediate sizes must be multiples of 8");
  }
  if (c.n_routed_experts > kernels::kMoeMaxExperts ||
      c.num_experts_per_tok > kernels::kMoeMaxTopK) {
    return absl::InvalidArgumentError("cuda backend: too many experts for the router kernel");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  std::unique_ptr<CudaEngine> e(new CudaEngine());
  e->weights_ = std::move(weights);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&e->stream_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(e->blas_, Cublas::Create(e->stream_));
  ASSIGN_OR_RETURN(e->pool_,
                   DeviceKvPool::Create(runtime::KvLayout{c.num_hidden_layers, options.block_tokens,
                                                          c.kv_lora_rank, c.qk_rope_head_dim},
                                        options.num_pages));
  ASSIGN_OR_RETURN(std::unique_ptr<SideStream> side, SideStream::Create(e->stream_));
  e->impl_ = std::make_unique<Impl>(*e->weights_, *e->pool_, e->blas_, e->stream_, std::move(side),
                                    options);
  Impl& I = *e->impl_;
  const cpu::Rope rope(c);  // owns inv_freq (a reference into a temporary would dangle)
  const std::vector<float>& inv = rope.inv_freq();
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&I.inv_freq), inv.size() * 4));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(I.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&I.num_sms, cudaDevAttrMultiProcessorCount, options.device));
  if (c.qk_nope_head_dim % 8 == 0) {
    const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim;
    const int64_t per_layer = heads * kLatent * nope;
    CUDA_RETURN_IF_ERROR(
        cudaMalloc(reinterpret_cast<void**>(&I.wuk_t), c.num_hidden_layers * per_layer * 2));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      RETURN_IF_ERROR(TransposeBatched(e->weights_->layers()[l].kv_b_proj.w,
                                       (nope + c.v_head_dim) * kLatent, heads, nope, kLatent,
                                       I.wuk_t + l * per_layer, e->stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(e->stream_));
  }
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&I.ev_start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&I.ev_end));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&I.ev_copied));
  return e;
}

int64_t CudaEngine::graph_captures() const { return impl_->graphs.captures(); }
int64_t CudaEngine::graph_replays() const { return impl_->graphs.replays(); }

absl::Status CudaEngine::Forward(std::span<const SequenceInput> batch,
                                 std::vector<runtime::SequenceOutput>* outputs) {
  const auto t_begin = std::chrono::steady_clock::now();
  Impl& I = *impl_;
  const ModelConfig& c = config();
  cudaStream_t s = stream_;
  StepPlan P;
  RETURN_IF_ERROR(I.Plan(batch, &P));
  if (P.n == 0) {
    outputs->clear();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(I.Reserve(P));
  RETURN_IF_ERROR(I.meta.Upload(s));  // the graph reads the metadata from this fixed buffer
  CUDA_RETURN_IF_ERROR(cudaEventRecord(I.ev_start, s));
  bool graphed = I.options.cuda_graphs && P.all_decode && I.moe.DevicePath(P.n);
  if (graphed) {
    const DecodeGraphKey key{P.n, P.table_pages, P.num_splits, P.total_out, I.grows};
    RETURN_IF_ERROR(I.graphs.Run(key, s, [&] { return I.Enqueue(P); }));
  } else {
    RETURN_IF_ERROR(I.Enqueue(P));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(I.ev_end, s));
  RETURN_IF_ERROR(I.moe.EnqueueReadback(P.n));
  // The tokens of sequences that bring their draw (SequenceInput::draw) are picked on the GPU:
  // by the greedy kernel when every draw is greedy, else by the sampling kernel (the sampler's
  // rule by radix selection). When every sequence brings one, 4 bytes per row come back instead
  // of the logits (26 MB at batch 64 for a 102 k vocabulary). Otherwise the logits come back too,
  // in one copy into pinned memory, then into the vectors of the sequences without a draw:
  // those are reused when the caller passes the previous step's outputs (no allocation, no page
  // faults).
  const bool picked = std::all_of(batch.begin(), batch.end(),
                                  [](const SequenceInput& in) { return in.draw.has_value(); });
  const bool any_draw = std::any_of(batch.begin(), batch.end(),
                                    [](const SequenceInput& in) { return in.draw.has_value(); });
  const size_t logits_bytes = picked ? 0 : P.total_out * c.vocab_size * 4;
  // Sized once for both (growing it later would drop a copy in flight); tokens after logits.
  RETURN_IF_ERROR(I.host_logits.Ensure(logits_bytes + P.total_out * 4));
  if (!picked) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(I.host_logits.as<float>(), I.logits.as<float>(),
                                         logits_bytes, cudaMemcpyDeviceToHost, s));
  }
  if (any_draw) RETURN_IF_ERROR(I.PickTokens(batch, P, c.vocab_size, logits_bytes));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(I.ev_copied, s));
  const auto t_enqueued = std::chrono::steady_clock::now();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  const auto t_synced = std::chrono::steady_clock::now();
  outputs->resize(batch.size());
  for (size_t si = 0; si < batch.size(); ++si) {
    auto& out = (*outputs)[si];
    out.rows = P.out_rows[si];
    if (batch[si].draw) {
      out.logits.clear();
      const auto* tokens =
          reinterpret_cast<const int32_t*>(I.host_logits.as<char>() + logits_bytes);
      out.token = tokens[P.out_first[si] + P.out_rows[si] - 1];
    } else {
      out.logits.resize(P.out_rows[si] * c.vocab_size);
      out.token = -1;
    }
  }
  if (!picked) CopyOutLogits(I.host_logits.as<float>(), P.out_first, c.vocab_size, outputs);
  const auto t_done = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const int64_t expert_bytes, I.moe.FinishStep());
  // What the step read: every dense tensor of every layer, the routed experts that had tokens,
  // the lm_head, the embedding rows, and the latent KV rows of every layer.
  StepStats stats;
  stats.tokens = P.n;
  stats.graphed = graphed;
  stats.weight_bytes = expert_bytes + weights_->lm_head().bytes() + P.n * c.hidden_size * 2;
  for (const DeviceLayer& L : weights_->layers()) {
    stats.weight_bytes += L.attention_bytes();
    stats.weight_bytes += L.moe
                              ? L.router.bytes() + L.shared_gate_up.bytes() + L.shared_down.bytes()
                              : L.gate_up.bytes() + L.down.bytes();
  }
  stats.kv_bytes = c.num_hidden_layers * P.kv_rows_read * kRow * 2;
  float ms = 0.f, copy_ms = 0.f;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, I.ev_start, I.ev_end));
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&copy_ms, I.ev_end, I.ev_copied));
  stats.device_ms = ms;
  stats.logits_copy_ms = copy_ms;
  using Ms = std::chrono::duration<double, std::milli>;
  stats.host_enqueue_ms = Ms(t_enqueued - t_begin).count();
  stats.host_output_ms = Ms(t_done - t_synced).count();
  stats_ = stats;
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::Plan(std::span<const SequenceInput> batch, StepPlan* plan) {
  const ModelConfig& c = W.config();
  StepPlan& P = *plan;
  const int64_t b = pool.layout().block_tokens;
  // ---- Validate and flatten the batch (row r of every activation is one new token).
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> kv_rows, first_row(batch.size());
  std::vector<bool> absorbed(batch.size());
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceInput& in = batch[si];
    if (in.tokens.empty())
      return absl::InvalidArgumentError(StrCat("sequence ", si, ": no tokens"));
    if (in.pages == nullptr)
      return absl::InvalidArgumentError(StrCat("sequence ", si, ": no pages"));
    const int64_t end = in.start_pos + static_cast<int64_t>(in.tokens.size());
    if (in.start_pos < 0 || static_cast<int64_t>(in.pages->pages.size()) * b < end) {
      return absl::InvalidArgumentError(StrCat("sequence ", si, ": pages cover ",
                                               in.pages->pages.size() * b, " tokens, need ", end));
    }
    for (int32_t p : in.pages->pages) {
      if (p < 0 || p >= pool.num_pages()) {
        return absl::InvalidArgumentError(StrCat("sequence ", si, ": bad page ", p));
      }
    }
    absorbed[si] = in.form == runtime::AttentionForm::kAbsorbed ||
                   (in.form == runtime::AttentionForm::kAuto && in.tokens.size() == 1);
    first_row[si] = static_cast<int64_t>(ids.size());
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            StrCat("sequence ", si, ": token ", in.tokens[i], " outside the vocabulary"));
      }
      const int64_t pos = in.start_pos + static_cast<int64_t>(i);
      ids.push_back(in.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos));
      kv_rows.push_back(static_cast<int64_t>(in.pages->pages[pos / b]) * b + pos % b);
    }
  }
  P.n = static_cast<int64_t>(ids.size());
  if (P.n == 0) return absl::OkStatus();

  // Decode queries (absorbed rows): one MLA decode "sequence" per row, seeing positions <= its own.
  std::vector<int64_t> dec_rows;
  std::vector<int32_t> dec_seqlens, dec_table;
  int64_t max_pages = 0;
  for (size_t si = 0; si < batch.size(); ++si) {
    if (absorbed[si]) max_pages = std::max<int64_t>(max_pages, batch[si].pages->pages.size());
  }
  P.table_pages = TablePages(max_pages);
  for (size_t si = 0; si < batch.size(); ++si) {
    if (!absorbed[si]) continue;
    const SequenceInput& in = batch[si];
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      dec_rows.push_back(first_row[si] + static_cast<int64_t>(i));
      const int64_t len = in.start_pos + static_cast<int64_t>(i) + 1;
      dec_seqlens.push_back(static_cast<int32_t>(len));
      P.kv_rows_read += len;
      for (int64_t p = 0; p < P.table_pages; ++p) {
        dec_table.push_back(p < static_cast<int64_t>(in.pages->pages.size()) ? in.pages->pages[p]
                                                                             : 0);
      }
    }
  }
  P.m = static_cast<int64_t>(dec_rows.size());
  P.all_decode = P.m == P.n;
  // Splits from the table's capacity, not the current lengths: a graph's split count holds while
  // its sequences grow (the kernel splits each sequence by its real length).
  const int64_t hq_pad = (c.num_attention_heads + 15) / 16 * 16;
  if (P.m > 0) {
    P.num_splits = kernels::MlaDecodeNumSplits(static_cast<int>(P.m), static_cast<int>(hq_pad),
                                               static_cast<int>(P.table_pages * b), num_sms);
  }
  // Prefill (MHA) sequences: their context rows in the pool and cu_seqlens.
  std::vector<int64_t> lat_rows;
  std::vector<int32_t> cu;
  for (size_t si = 0; si < batch.size(); ++si) {
    if (absorbed[si]) continue;
    const SequenceInput& in = batch[si];
    const int64_t q_len = static_cast<int64_t>(in.tokens.size());
    const int64_t ctx = in.start_pos + q_len;
    P.mha.push_back({first_row[si], q_len, ctx, lat_rows.size(), cu.size()});
    for (int64_t t = 0; t < ctx; ++t) {
      lat_rows.push_back(static_cast<int64_t>(in.pages->pages[t / b]) * b + t % b);
    }
    cu.insert(cu.end(), {0, static_cast<int32_t>(q_len), 0, static_cast<int32_t>(ctx)});
    P.max_ctx = std::max(P.max_ctx, ctx);
    P.max_q = std::max(P.max_q, q_len);
    P.kv_rows_read += ctx;
  }
  // Output rows (the last, or every, new token of each sequence).
  std::vector<int64_t> out_idx;
  P.out_rows.resize(batch.size());
  P.out_first.resize(batch.size());
  for (size_t si = 0; si < batch.size(); ++si) {
    P.out_rows[si] = batch[si].all_logits ? static_cast<int64_t>(batch[si].tokens.size()) : 1;
    P.out_first[si] = static_cast<int64_t>(out_idx.size());
    const int64_t last = first_row[si] + static_cast<int64_t>(batch[si].tokens.size());
    for (int64_t r = last - P.out_rows[si]; r < last; ++r) out_idx.push_back(r);
  }
  P.total_out = static_cast<int64_t>(out_idx.size());

  meta.Clear();
  P.o_ids = meta.Add(ids);
  P.o_pos = meta.Add(positions);
  P.o_kv = meta.Add(kv_rows);
  P.o_dec = meta.Add(dec_rows);
  P.o_dlen = meta.Add(dec_seqlens);
  P.o_dtab = meta.Add(dec_table);
  P.o_lat = meta.Add(lat_rows);
  P.o_cu = meta.Add(cu);
  P.o_out = meta.Add(out_idx);
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::PickTokens(std::span<const SequenceInput> batch, const StepPlan& P,
                                          int64_t vocab, size_t at) {
  const int rows = static_cast<int>(P.total_out);
  RETURN_IF_ERROR(tokens.Ensure(rows * 4));
  const bool greedy = std::all_of(batch.begin(), batch.end(), [](const SequenceInput& in) {
    return !in.draw || in.draw->greedy();
  });
  if (greedy) {
    RETURN_IF_ERROR(kernels::LaunchGreedySample({.rows = rows,
                                                 .vocab = static_cast<int>(vocab),
                                                 .logits = logits.as<float>(),
                                                 .ld_logits = vocab,
                                                 .tokens = tokens.as<int32_t>()},
                                                s));
  } else {
    RETURN_IF_ERROR(host_draws.Ensure(rows * sizeof(kernels::SampleRowDraw)));
    RETURN_IF_ERROR(draws.Ensure(rows * sizeof(kernels::SampleRowDraw)));
    auto* hd = host_draws.as<kernels::SampleRowDraw>();
    std::fill(hd, hd + rows, kernels::SampleRowDraw{});  // greedy
    for (size_t si = 0; si < batch.size(); ++si) {
      if (!batch[si].draw) continue;
      const runtime::TokenDraw& d = *batch[si].draw;
      hd[P.out_first[si] + P.out_rows[si] - 1] = {
          .temperature = d.temperature,
          .top_p = d.top_p,
          .top_k = static_cast<int32_t>(std::min<int64_t>(d.top_k, INT32_MAX)),
          .uniform = d.uniform};
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        draws.as<void>(), hd, rows * sizeof(kernels::SampleRowDraw), cudaMemcpyHostToDevice, s));
    RETURN_IF_ERROR(kernels::LaunchSample({.rows = rows,
                                           .vocab = static_cast<int>(vocab),
                                           .logits = logits.as<float>(),
                                           .ld_logits = vocab,
                                           .draws = draws.as<kernels::SampleRowDraw>(),
                                           .tokens = tokens.as<int32_t>()},
                                          s));
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_logits.as<char>() + at, tokens.as<int32_t>(), rows * 4,
                                       cudaMemcpyDeviceToHost, s));
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::Reserve(const StepPlan& P) {
  const ModelConfig& c = W.config();
  const int64_t n = P.n, m = P.m, h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = c.qk_head_dim(), vd = c.v_head_dim;
  const int64_t hq_pad = (heads + 15) / 16 * 16;
  RETURN_IF_ERROR(x.Ensure(n * h * 2));
  RETURN_IF_ERROR(xn.Ensure(n * h * 2));
  RETURN_IF_ERROR(delta.Ensure(n * h * 2));
  RETURN_IF_ERROR(q.Ensure(n * heads * qk * 2));
  RETURN_IF_ERROR(qa.Ensure(n * std::max<int64_t>(c.q_lora_rank, 8) * 2));
  RETURN_IF_ERROR(kva.Ensure(n * kRow * 2));
  RETURN_IF_ERROR(attn.Ensure(n * heads * vd * 2));
  RETURN_IF_ERROR(gu.Ensure(n * 2 * std::max<int64_t>(c.intermediate_size, 8) * 2));
  RETURN_IF_ERROR(moe.Reserve(n));
  if (m > 0) {
    if (!P.all_decode) RETURN_IF_ERROR(qd.Ensure(m * heads * qk * 2));
    RETURN_IF_ERROR(qfull.Ensure(m * hq_pad * kRow * 2));
    RETURN_IF_ERROR(olat.Ensure(m * hq_pad * kLatent * 2));
    RETURN_IF_ERROR(dlse.Ensure(m * hq_pad * 4));
    RETURN_IF_ERROR(dws.Ensure(kernels::MlaDecodeWorkspaceBytes(
                                   static_cast<int>(m), static_cast<int>(hq_pad), P.num_splits) +
                               256));
    if (!P.all_decode) RETURN_IF_ERROR(od.Ensure(m * heads * vd * 2));
  }
  if (!P.mha.empty()) {
    RETURN_IF_ERROR(lat.Ensure(P.max_ctx * kRow * 2));
    RETURN_IF_ERROR(kp.Ensure(P.max_ctx * heads * kPadQk * 2));
    RETURN_IF_ERROR(vp.Ensure(P.max_ctx * heads * kPadV * 2));
    // Q and the output in the kernel's layout only for head dims narrower than its own.
    if (c.qk_nope_head_dim != kPadNope) RETURN_IF_ERROR(qp.Ensure(P.max_q * heads * kPadQk * 2));
    if (vd != kPadV) RETURN_IF_ERROR(op.Ensure(P.max_q * heads * kPadV * 2));
    RETURN_IF_ERROR(plse.Ensure(P.max_q * heads * 4));
  }
  RETURN_IF_ERROR(fin.Ensure(P.total_out * h * 2));
  RETURN_IF_ERROR(logits.Ensure(P.total_out * c.vocab_size * 4));
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::Norm(int64_t rows, int64_t dim, const bf16* in, int64_t ld_in,
                                    bf16* residual, const bf16* weight, bf16* out, int64_t ld_out,
                                    cudaStream_t stream) {
  kernels::RmsNormParams p;
  p.rows = static_cast<int>(rows);
  p.dim = static_cast<int>(dim);
  p.eps = static_cast<float>(W.config().rms_norm_eps);
  p.x = in;
  p.ld_x = ld_in;
  if (residual != nullptr) {
    p.residual = residual;
    p.ld_residual = dim;
    p.residual_out = residual;
    p.ld_residual_out = dim;
  }
  p.weight = weight;
  p.out = out;
  p.ld_out = ld_out;
  return kernels::LaunchRmsNorm(p, stream);
}

absl::Status CudaEngine::Impl::Rope(bf16* x, int64_t rows, int64_t heads, int64_t token_stride,
                                    int64_t head_stride, const StepPlan& P, cudaStream_t stream) {
  const ModelConfig& c = W.config();
  kernels::RopeParams p;
  p.num_tokens = static_cast<int>(rows);
  p.num_heads = static_cast<int>(heads);
  p.rope_dim = static_cast<int>(kRope);
  p.layout = Lanes(c.rope_layout);
  p.attention_factor = static_cast<float>(c.RopeAttentionFactor());
  p.x = x;
  p.token_stride = token_stride;
  p.head_stride = head_stride;
  p.positions = meta.At<int32_t>(P.o_pos);
  p.inv_freq = inv_freq;
  return kernels::LaunchRope(p, stream);
}

// The step's device work, in stream order: everything here may be captured into a graph (no
// allocation, no host sync), except the MoE host path, which callers never capture.
absl::Status CudaEngine::Impl::Enqueue(const StepPlan& P) {
  const ModelConfig& c = W.config();
  const int64_t n = P.n, h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, qk = c.qk_head_dim();
  const int64_t hq_pad = (heads + 15) / 16 * 16;
  // Programmatic launches pay for few-row steps only (kernels/common/pdl.cuh).
  kernels::ProgrammaticLaunchEnabled() = n <= kSkinnyMaxRows;
  if (P.m > 0 && hq_pad != heads) {
    // Padded query heads stay zero (finite scores; their outputs are never read).
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(qfull.as<bf16>(), 0, P.m * hq_pad * kRow * 2, s));
  }
  RETURN_IF_ERROR(moe.BeginStep());
  bf16* xp = x.as<bf16>();
  bf16* xnp = xn.as<bf16>();
  bf16* dp = delta.as<bf16>();
  bf16* qp_ = q.as<bf16>();
  bf16* kvap = kva.as<bf16>();
  RETURN_IF_ERROR(GatherRows32(W.embed(), h, meta.At<int32_t>(P.o_ids), n, h, xp, h, s));

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayer& L = W.layers()[l];
    // Input norm; from layer 1 on fused with x += delta (the previous block's output).
    RETURN_IF_ERROR(
        Norm(n, h, l == 0 ? xp : dp, h, l == 0 ? nullptr : xp, L.input_norm, xnp, h, s));
    // The new latent + k_pe rows into their pages (side stream) beside the query projection.
    RETURN_IF_ERROR(side->Fork());
    const cudaStream_t s2 = side->stream();
    RETURN_IF_ERROR(LinearBf16(side->blas(), s2, L.kv_a_proj, xnp, h, n, kvap, kRow));
    RETURN_IF_ERROR(Norm(n, kLatent, kvap, kRow, nullptr, L.kv_a_norm, kvap, kRow, s2));
    RETURN_IF_ERROR(Rope(kvap + kLatent, n, 1, kRow, kRow, P, s2));
    RETURN_IF_ERROR(
        ScatterRows(kvap, kRow, meta.At<int64_t>(P.o_kv), n, kRow, pool.layer_base(l), kRow, s2));
    if (c.q_lora_rank > 0) {
      bf16* qap = qa.as<bf16>();
      RETURN_IF_ERROR(LinearBf16(blas, s, L.q_a_proj, xnp, h, n, qap, c.q_lora_rank));
      RETURN_IF_ERROR(
          Norm(n, c.q_lora_rank, qap, c.q_lora_rank, nullptr, L.q_a_norm, qap, c.q_lora_rank, s));
      RETURN_IF_ERROR(LinearBf16(blas, s, L.q_b_proj, qap, c.q_lora_rank, n, qp_, heads * qk));
    } else {
      RETURN_IF_ERROR(LinearBf16(blas, s, L.q_proj, xnp, h, n, qp_, heads * qk));
    }
    RETURN_IF_ERROR(Rope(qp_ + nope, n, heads, heads * qk, qk, P, s));
    RETURN_IF_ERROR(side->Join());
    RETURN_IF_ERROR(MhaAttention(L, P, l));
    RETURN_IF_ERROR(AbsorbedAttention(L, P, l));
    RETURN_IF_ERROR(LinearBf16(blas, s, L.o_proj, attn.as<bf16>(), heads * c.v_head_dim, n, dp, h));

    // ---- Feed-forward.
    RETURN_IF_ERROR(Norm(n, h, dp, h, xp, L.post_attention_norm, xnp, h, s));
    if (L.moe) {
      RETURN_IF_ERROR(moe.Forward(l, L, xnp, n, dp));
    } else {
      RETURN_IF_ERROR(Mlp(blas, s, L.gate_up, L.down, xnp, n, gu.as<bf16>(), dp));
    }
  }
  // Final norm (fused with the last residual add), then the LM head on the output rows only.
  RETURN_IF_ERROR(Norm(n, h, dp, h, xp, W.final_norm(), xnp, h, s));
  RETURN_IF_ERROR(
      GatherRows(xnp, h, meta.At<int64_t>(P.o_out), P.total_out, h, fin.as<bf16>(), h, s));
  return Linear(blas, W.lm_head(), fin.as<bf16>(), h, P.total_out, logits.as<float>(), c.vocab_size,
                /*fp32=*/true);
}

// Attention, MHA form: per prefill sequence over its decompressed context. The prefill kernel
// reads K = [k_nope | 0 | k_pe] (192 per head) and V = [v | ·] (128) through strides, so W_UK and
// W_UV (the two halves of every head's kv_b_proj rows) write straight into those layouts as two
// GEMMs batched over the heads, and only k_pe, shared by every head, is copied. Q and the output
// need copies only when the model's head dims are narrower than the kernel's (small presets).
absl::Status CudaEngine::Impl::MhaAttention(const DeviceLayer& L, const StepPlan& P,
                                            int64_t layer) {
  const ModelConfig& c = W.config();
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  const int64_t qk = c.qk_head_dim(), kvb_row = nope + vd;
  const bool q_direct = nope == kPadNope, out_direct = vd == kPadV;
  const bf16* pool_l = pool.layer_base(layer);
  bf16* attn_p = attn.as<bf16>();
  bf16* kpp = kp.as<bf16>();
  for (const MhaSeq& sq : P.mha) {
    bf16* latp = lat.as<bf16>();
    RETURN_IF_ERROR(GatherRows(pool_l, kRow, meta.At<int64_t>(P.o_lat) + sq.lat_off, sq.ctx, kRow,
                               latp, kRow, s));
    // k_nope[t][h] = W_UK[h] · c_kv[t] and v[t][h] = W_UV[h] · c_kv[t].
    GemmArgs g;
    g.m = sq.ctx;
    g.k = kLatent;
    g.a = latp;
    g.lda = kRow;
    g.ldb = kLatent;
    g.batch = heads;
    g.stride_a = 0;
    g.stride_b = kvb_row * kLatent;
    g.n = nope;
    g.b = L.kv_b_proj.w;
    g.c = kpp;
    g.ldc = heads * kPadQk;
    g.stride_c = kPadQk;
    RETURN_IF_ERROR(blas.Gemm(g));
    g.n = vd;
    g.b = L.kv_b_proj.w + nope * kLatent;
    g.c = vp.as<bf16>();
    g.ldc = heads * kPadV;
    g.stride_c = kPadV;
    RETURN_IF_ERROR(blas.Gemm(g));
    // V's pad lanes (vd < 128) reach only output lanes that are dropped; K's must be zero, as Q's.
    CopyHeadsParams cp;
    if (!q_direct) {
      cp = {sq.ctx, heads, 0, kPadNope - nope, nullptr, 0, 0, kpp + nope, heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }
    cp = {sq.ctx, heads, kRope,          kRope,          latp + kLatent,
          kRow,   0,     kpp + kPadNope, heads * kPadQk, kPadQk};
    RETURN_IF_ERROR(CopyHeads(cp, s));
    // Q = [q_nope | 0 | q_pe].
    const bf16* qs = q.as<bf16>() + sq.first_row * heads * qk;
    if (!q_direct) {
      cp = {sq.q_len,   heads, nope,          kPadNope,       qs,
            heads * qk, qk,    qp.as<bf16>(), heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      cp = {sq.q_len,       heads,      kRope, kRope,
            qs + nope,      heads * qk, qk,    qp.as<bf16>() + kPadNope,
            heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }
    bf16* out = attn_p + sq.first_row * heads * vd;
    kernels::PrefillAttentionParams p;
    p.batch = 1;
    p.num_heads = static_cast<int>(heads);
    p.max_seqlen_q = static_cast<int>(sq.q_len);
    p.causal = true;
    p.accumulate = false;
    p.softmax_scale = static_cast<float>(c.SoftmaxScale());
    p.cu_seqlens_q = meta.At<int32_t>(P.o_cu) + sq.cu_off;
    p.cu_seqlens_k = meta.At<int32_t>(P.o_cu) + sq.cu_off + 2;
    p.q = q_direct ? qs : qp.as<bf16>();
    p.q_token_stride = q_direct ? heads * qk : heads * kPadQk;
    p.q_head_stride = q_direct ? qk : kPadQk;
    p.k = kpp;
    p.k_token_stride = heads * kPadQk;
    p.k_head_stride = kPadQk;
    p.v = vp.as<bf16>();
    p.v_token_stride = heads * kPadV;
    p.v_head_stride = kPadV;
    p.out = out_direct ? out : op.as<bf16>();
    p.out_token_stride = heads * kPadV;
    p.out_head_stride = kPadV;
    p.lse = plse.as<float>();
    p.total_k = static_cast<int64_t>(sq.ctx);
    RETURN_IF_ERROR(kernels::LaunchPrefillAttention(p, s));
    if (!out_direct) {
      cp = {sq.q_len, heads, vd, vd, op.as<bf16>(), heads * kPadV, kPadV, out, heads * vd, vd};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }
  }
  return absl::OkStatus();
}

// Attention, absorbed form (MLA decode over the latent pages).
absl::Status CudaEngine::Impl::AbsorbedAttention(const DeviceLayer& L, const StepPlan& P,
                                                 int64_t layer) {
  if (P.m == 0) return absl::OkStatus();
  const ModelConfig& c = W.config();
  const int64_t m = P.m, heads = c.num_attention_heads, nope = c.qk_nope_head_dim;
  const int64_t vd = c.v_head_dim, qk = c.qk_head_dim(), kvb_row = nope + vd;
  const int64_t hq_pad = (heads + 15) / 16 * 16;
  const bf16* qdp = q.as<bf16>();
  if (!P.all_decode) {
    RETURN_IF_ERROR(GatherRows(q.as<bf16>(), heads * qk, meta.At<int64_t>(P.o_dec), m, heads * qk,
                               qd.as<bf16>(), heads * qk, s));
    qdp = qd.as<bf16>();
  }
  bf16* qf = qfull.as<bf16>();
  const bool skinny = m <= kSkinnyMaxRows && wuk_t != nullptr;
  // q_pe into the query rows (side stream) beside q_lat.
  RETURN_IF_ERROR(side->Fork());
  CopyHeadsParams cp{m,          heads, kRope,        kRope,         qdp + nope,
                     heads * qk, qk,    qf + kLatent, hq_pad * kRow, kRow};
  RETURN_IF_ERROR(CopyHeads(cp, side->stream()));
  // q_lat[r][hd] = q_nope[r][hd] · W_UK[hd]   ([nope] × [nope][512], one GEMM per head).
  if (skinny) {
    kernels::SkinnyGemmParams sg;
    sg.tokens = static_cast<int>(m);
    sg.n_out = static_cast<int>(kLatent);
    sg.k = static_cast<int>(nope);
    sg.batch = static_cast<int>(heads);
    sg.x = qdp;
    sg.ld_x = heads * qk;
    sg.batch_stride_x = qk;
    sg.w = wuk_t + layer * heads * kLatent * nope;
    sg.batch_stride_w = kLatent * nope;
    sg.out = qf;
    sg.ld_out = hq_pad * kRow;
    sg.batch_stride_out = kRow;
    RETURN_IF_ERROR(kernels::LaunchSkinnyGemm(sg, s));
    RETURN_IF_ERROR(side->Join());
  }
  GemmArgs g;
  g.m = m;
  g.n = kLatent;
  g.k = nope;
  g.trans_b = false;
  g.a = qdp;
  g.lda = heads * qk;
  g.stride_a = qk;
  g.b = L.kv_b_proj.w;
  g.ldb = kLatent;
  g.stride_b = kvb_row * kLatent;
  g.c = qf;
  g.ldc = hq_pad * kRow;
  g.stride_c = kRow;
  g.batch = heads;
  if (!skinny) {
    RETURN_IF_ERROR(blas.Gemm(g));
    RETURN_IF_ERROR(side->Join());
  }
  kernels::MlaDecodeParams p;
  p.batch = static_cast<int>(m);
  p.num_heads_q = static_cast<int>(hq_pad);
  p.num_pages = static_cast<int>(pool.num_pages());
  p.max_pages_per_seq = static_cast<int>(P.table_pages);
  p.num_splits = P.num_splits;
  p.softmax_scale = static_cast<float>(c.SoftmaxScale());
  p.q = qf;
  p.kv_cache = pool.layer_base(layer);
  p.block_table = meta.At<int32_t>(P.o_dtab);
  p.seqlens = meta.At<int32_t>(P.o_dlen);
  p.out = olat.as<bf16>();
  p.lse = dlse.as<float>();
  if (P.num_splits > 1) kernels::MlaDecodeSetWorkspace(p, dws.as<void>());
  RETURN_IF_ERROR(kernels::LaunchMlaDecode(p, s));
  // out[r][hd] = o_lat[r][hd] · W_UV[hd]ᵀ   ([512] × [vd][512]ᵀ, one GEMM per head).
  bf16* odp = P.all_decode ? attn.as<bf16>() : od.as<bf16>();
  if (skinny) {
    kernels::SkinnyGemmParams sg;
    sg.tokens = static_cast<int>(m);
    sg.n_out = static_cast<int>(vd);
    sg.k = static_cast<int>(kLatent);
    sg.batch = static_cast<int>(heads);
    sg.x = olat.as<bf16>();
    sg.ld_x = hq_pad * kLatent;
    sg.batch_stride_x = kLatent;
    sg.w = L.kv_b_proj.w + nope * kLatent;
    sg.batch_stride_w = kvb_row * kLatent;
    sg.out = odp;
    sg.ld_out = heads * vd;
    sg.batch_stride_out = vd;
    RETURN_IF_ERROR(kernels::LaunchSkinnyGemm(sg, s));
  }
  g = GemmArgs{};
  g.m = m;
  g.n = vd;
  g.k = kLatent;
  g.trans_b = true;
  g.a = olat.as<bf16>();
  g.lda = hq_pad * kLatent;
  g.stride_a = kLatent;
  g.b = L.kv_b_proj.w + nope * kLatent;
  g.ldb = kLatent;
  g.stride_b = kvb_row * kLatent;
  g.c = odp;
  g.ldc = heads * vd;
  g.stride_c = vd;
  g.batch = heads;
  if (!skinny) RETURN_IF_ERROR(blas.Gemm(g));
  if (!P.all_decode) {
    RETURN_IF_ERROR(ScatterRows(odp, heads * vd, meta.At<int64_t>(P.o_dec), m, heads * vd,
                                attn.as<bf16>(), heads * vd, s));
  }
  return absl::OkStatus();
}

}  // namespace strata::cuda
