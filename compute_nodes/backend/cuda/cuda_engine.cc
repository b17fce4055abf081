#include "compute_nodes/backend/cuda/cuda_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/cuda/cuda_status.h"
#include "common/file_util.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/backend/cuda/engine_impl.h"
#include "compute_nodes/backend/cuda/step_util.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"
#include "kernels/common/pdl.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/moe_router/moe_router.h"
#include "kernels/norm_rope/latent_rows.h"
#include "kernels/norm_rope/rms_norm.h"
#include "kernels/norm_rope/rope.h"
#include "kernels/sampling/greedy_sample.h"
#include "kernels/sampling/sample.h"

namespace strata::cuda {
namespace {

using bf16 = __nv_bfloat16;
using model::ModelConfig;
using runtime::SequenceInput;

using engine_detail::kLatent;
using engine_detail::kPadNope;
using engine_detail::kPadQk;
using engine_detail::kPadV;
using engine_detail::kRope;
using engine_detail::kRow;
using engine_detail::MhaSeq;
using engine_detail::StepPlan;

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

// Copies each sequence's rows of the pinned logits into its (sized) output vector (26 MB at
// batch 64: spread over a few threads).
void CopyOutLogits(const float* pinned, const std::vector<int64_t>& first_row, int64_t vocab,
                   std::vector<runtime::SequenceOutput>* outputs) {
  const int64_t bytes = (first_row.empty() ? 0 : first_row.back()) * vocab * 4;
  ForEachCopy(static_cast<int64_t>(outputs->size()), bytes, [&](int64_t si) {
    auto& out = (*outputs)[si];
    std::memcpy(out.logits.data(), pinned + first_row[si] * vocab, out.logits.size() * 4);
  });
}

}  // namespace

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
  if (c.q_lora_rank == 0 && c.num_attention_heads * c.qk_head_dim() % 8 != 0) {
    // The KV rows follow the query rows in the fused projection's output, 16-byte aligned.
    return absl::InvalidArgumentError(
        "cuda backend: without q_lora_rank, heads x qk_head_dim must be a multiple of 8");
  }
  if (c.n_routed_experts > kernels::kMoeMaxExperts ||
      c.num_experts_per_tok > kernels::kMoeMaxTopK) {
    return absl::InvalidArgumentError("cuda backend: too many experts for the router kernel");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  std::unique_ptr<CudaEngine> e(new CudaEngine());
  e->weights_ = std::move(weights);
  int main_priority = 0;  // the default, which is also the lowest
  if (options.low_priority_side_rows > 0) {
    int lowest = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&lowest, &main_priority));
  }
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&e->stream_, cudaStreamNonBlocking, main_priority));
  ASSIGN_OR_RETURN(e->blas_, Cublas::Create(e->stream_));
  ASSIGN_OR_RETURN(e->pool_,
                   DeviceKvPool::Create(runtime::KvLayout{c.num_hidden_layers, options.block_tokens,
                                                          c.kv_lora_rank, c.qk_rope_head_dim},
                                        options.num_pages,
                                        {.register_shared_regions = options.read_cache_in_place}));
  ASSIGN_OR_RETURN(std::unique_ptr<SideStream> side, SideStream::Create(e->stream_, main_priority));
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
  RETURN_IF_ERROR(I.side->BelowMain(P.n <= I.options.low_priority_side_rows));
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
  const int64_t hq_pad = QueryHeadsPadded();
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
  const int64_t hq_pad = QueryHeadsPadded();
  RETURN_IF_ERROR(x.Ensure(n * h * 2));
  RETURN_IF_ERROR(x2.Ensure(n * h * 2));
  RETURN_IF_ERROR(xn.Ensure(n * h * 2));
  RETURN_IF_ERROR(delta.Ensure(n * h * 2));
  RETURN_IF_ERROR(qkva.Ensure(n * QkvaLd() * 2));
  if (c.q_lora_rank > 0) {
    RETURN_IF_ERROR(q.Ensure(n * heads * qk * 2));
    RETURN_IF_ERROR(qa.Ensure(n * c.q_lora_rank * 2));
  }
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

kernels::RmsNormParams CudaEngine::Impl::NormParams(int64_t rows, int64_t dim, const bf16* in,
                                                    int64_t ld_in, const bf16* residual,
                                                    bf16* residual_out, const bf16* weight,
                                                    bf16* out, int64_t ld_out,
                                                    const kernels::RmsNormMoeSum& moe_sum) const {
  kernels::RmsNormParams p;
  p.moe = moe_sum;
  p.rows = static_cast<int>(rows);
  p.dim = static_cast<int>(dim);
  p.eps = static_cast<float>(W.config().rms_norm_eps);
  p.x = in;
  p.ld_x = ld_in;
  if (residual != nullptr) {
    p.residual = residual;
    p.ld_residual = dim;
    p.residual_out = residual_out;
    p.ld_residual_out = dim;
  }
  p.weight = weight;
  p.out = out;
  p.ld_out = ld_out;
  return p;
}

bool CudaEngine::Impl::RopeBesideQuery(const StepPlan& P) const {
  return options.rope_beside_query && P.all_decode && P.m > 0 && P.m <= kSkinnyMaxRows &&
         wuk_t != nullptr && kernels::ProgrammaticLaunchEnabled();
}

absl::Status CudaEngine::Impl::RopeRows(const bf16* kv_a, int64_t ld_kv_a, const bf16* norm_weight,
                                        const StepPlan& P, bf16* pages, bool beside) {
  const ModelConfig& c = W.config();
  const int64_t heads = c.num_attention_heads, qk = c.qk_head_dim();
  kernels::LatentRowsParams p;
  p.num_tokens = static_cast<int>(P.n);
  p.rank = static_cast<int>(kLatent);
  p.rope_dim = static_cast<int>(kRope);
  p.eps = static_cast<float>(c.rms_norm_eps);
  p.in = kv_a;
  p.ld_in = ld_kv_a;
  p.norm_weight = norm_weight;
  p.layout = Lanes(c.rope_layout);
  p.attention_factor = static_cast<float>(c.RopeAttentionFactor());
  p.positions = meta.At<int32_t>(P.o_pos);
  p.inv_freq = inv_freq;
  p.out = pages;
  p.ld_out = kRow;
  p.out_rows = meta.At<int64_t>(P.o_kv);
  p.q_heads = static_cast<int>(heads);
  p.q = QueryRows() + c.qk_nope_head_dim;
  p.q_token_stride = QueryLd();
  p.q_head_stride = qk;
  if (RopesIntoQueryRows(P)) {
    p.q_out = qfull.as<bf16>() + kLatent;
    p.q_out_token_stride = QueryHeadsPadded() * kRow;
    p.q_out_head_stride = kRow;
  }
  p.beside_previous = beside;
  return kernels::LaunchLatentRows(p, s);
}

// The step's device work, in stream order: everything here may be captured into a graph (no
// allocation, no host sync), except the MoE host path, which callers never capture.
absl::Status CudaEngine::Impl::Enqueue(const StepPlan& P) {
  const ModelConfig& c = W.config();
  const int64_t n = P.n, h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = c.qk_head_dim();
  const int64_t hq_pad = QueryHeadsPadded();
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
  bf16* qkvp = qkva.as<bf16>();
  const int64_t qkv_ld = QkvaLd();
  RETURN_IF_ERROR(GatherRows32(W.embed(), h, meta.At<int32_t>(P.o_ids), n, h, xp, h, s));
  // The residual stream alternates between x and x2: a norm fused with the residual add reads
  // `res` and writes `res_next`, so a projection whose every CTA forms the normed row itself
  // (`fold`, one-row steps) never reads a residual that its first CTA is updating. Folded: the
  // input norm into the q|kv_a projection, a MoE layer's post-attention norm into the router
  // logits (MoeBlock::Forward); a dense MLP keeps its norm kernel (forming the row in each of
  // its gate|up's ~1,400 CTAs cost more than the launch).
  bf16* res = xp;
  bf16* res_next = x2.as<bf16>();
  const bool fold = n == 1 && options.fold_norms;

  // The previous feed-forward block's output when it is a MoE block's (top_k > 0): summed by the
  // next norm; otherwise the output is in delta.
  kernels::RmsNormMoeSum block_out;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayer& L = W.layers()[l];
    // Input norm; from layer 1 on fused with x += the previous block's output.
    const kernels::RmsNormParams input_norm =
        l == 0 ? NormParams(n, h, xp, h, nullptr, nullptr, L.input_norm, xnp, h)
               : NormParams(n, h, dp, h, res, res_next, L.input_norm, xnp, h, block_out);
    if (l > 0) std::swap(res, res_next);
    // One projection for the query (or its low-rank part) and the new latent + k_pe rows.
    if (fold) {
      RETURN_IF_ERROR(LinearBf16(blas, s, L.q_kv_a, nullptr, h, n, qkvp, qkv_ld,
                                 {.params = input_norm, .writes = true}));
    } else {
      RETURN_IF_ERROR(kernels::LaunchRmsNorm(input_norm, s));
      RETURN_IF_ERROR(LinearBf16(blas, s, L.q_kv_a, xnp, h, n, qkvp, qkv_ld));
    }
    const int64_t q_cols = L.q_kv_a.out - kRow;
    if (c.q_lora_rank > 0) {
      bf16* qap = qa.as<bf16>();
      RETURN_IF_ERROR(kernels::LaunchRmsNorm(NormParams(n, c.q_lora_rank, qkvp, qkv_ld, nullptr,
                                                        nullptr, L.q_a_norm, qap, c.q_lora_rank),
                                             s));
      RETURN_IF_ERROR(
          LinearBf16(blas, s, L.q_b_proj, qap, c.q_lora_rank, n, QueryRows(), heads * qk));
    }
    // q·W_UK and the RoPE rows read only the projections' output: on decode steps of few rows
    // the RoPE rows run beside q·W_UK, off the critical path.
    const bool beside = RopeBesideQuery(P);
    if (beside) RETURN_IF_ERROR(QueryLatent(L, P, l));
    RETURN_IF_ERROR(RopeRows(qkvp + q_cols, qkv_ld, L.kv_a_norm, P, pool.layer_base(l), beside));
    RETURN_IF_ERROR(MhaAttention(L, P, l));
    RETURN_IF_ERROR(AbsorbedAttention(L, P, l, /*query_latent_done=*/beside));
    RETURN_IF_ERROR(LinearBf16(blas, s, L.o_proj, attn.as<bf16>(), heads * c.v_head_dim, n, dp, h));

    // ---- Feed-forward. Folded (MoE layers), the router logits' kernel writes xn and the residual.
    const kernels::RmsNormParams post_norm =
        NormParams(n, h, dp, h, res, res_next, L.post_attention_norm, xnp, h);
    std::swap(res, res_next);
    const bool fold_post = fold && L.moe;
    if (!fold_post) RETURN_IF_ERROR(kernels::LaunchRmsNorm(post_norm, s));
    if (L.moe) {
      ASSIGN_OR_RETURN(block_out, moe.Forward(l, L, xnp, n, fold_post ? &post_norm : nullptr));
    } else {
      RETURN_IF_ERROR(Mlp(blas, s, L.gate_up, L.down, xnp, n, gu.as<bf16>(), dp));
      block_out = {};
    }
  }
  // Final norm (fused with the last residual add), then the LM head on the output rows only.
  RETURN_IF_ERROR(kernels::LaunchRmsNorm(
      NormParams(n, h, dp, h, res, res_next, W.final_norm(), xnp, h, block_out), s));
  RETURN_IF_ERROR(
      GatherRows(xnp, h, meta.At<int64_t>(P.o_out), P.total_out, h, fin.as<bf16>(), h, s));
  return Linear(blas, W.lm_head(), fin.as<bf16>(), h, P.total_out, logits.as<float>(), c.vocab_size,
                /*fp32=*/true);
}

}  // namespace strata::cuda
