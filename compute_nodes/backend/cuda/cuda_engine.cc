#include "compute_nodes/backend/cuda/cuda_engine.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/cuda/cuda_status.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"
#include "kernels/activation/silu_mul.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/moe_router/moe_router.h"
#include "kernels/norm_rope/rms_norm.h"
#include "kernels/norm_rope/rope.h"
#include "kernels/prefill_attention/prefill_attention.h"

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

// A device buffer that grows on demand (cudaFree synchronizes, so no work in flight uses it).
class Buf {
 public:
  ~Buf() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  absl::Status Ensure(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (p_ != nullptr) (void)cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
    bytes = std::max<size_t>(bytes + bytes / 4, 256);
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p_, bytes));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host staging for small per-call arrays, copied to a device buffer in one transfer.
class Meta {
 public:
  ~Meta() {
    if (host_ != nullptr) (void)cudaFreeHost(host_);
  }
  template <typename T>
  size_t Add(const std::vector<T>& v) {
    const size_t off = (data_.size() + 15) / 16 * 16;
    data_.resize(off + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(data_.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
  absl::Status Upload(cudaStream_t stream) {
    if (data_.size() > host_bytes_) {
      if (host_ != nullptr) (void)cudaFreeHost(host_);
      host_ = nullptr;
      host_bytes_ = 0;
      const size_t bytes = std::max<size_t>(data_.size() * 2, 4096);
      CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes, 0));
      host_bytes_ = bytes;
    }
    RETURN_IF_ERROR(dev_.Ensure(data_.size() + 16));
    if (data_.empty()) return absl::OkStatus();
    std::memcpy(host_, data_.data(), data_.size());
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dev_.as<uint8_t>(), host_, data_.size(), cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }
  template <typename T>
  T* At(size_t off) const {
    return reinterpret_cast<T*>(dev_.as<uint8_t>() + off);
  }
  void Clear() { data_.clear(); }

 private:
  std::vector<uint8_t> data_;
  uint8_t* host_ = nullptr;
  size_t host_bytes_ = 0;
  Buf dev_;
};

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

}  // namespace

struct CudaEngine::Impl {
  float* inv_freq = nullptr;  // [rope / 2]
  int num_sms = 132;
  Meta meta, moe_meta;
  int32_t* host_experts = nullptr;  // pinned [host_experts_len]
  size_t host_experts_len = 0;
  // Activations.
  Buf x, xn, delta, q, qa, kva, attn, gu;
  // MoE.
  Buf router_logits, experts, weights, xe, gue, ye, shared_gu, shared_out;
  // Decode (absorbed).
  Buf qd, qfull, olat, dlse, dws, od;
  // Prefill (MHA).
  Buf lat, kvd, kp, vp, qp, op, plse;
  // Output.
  Buf fin, logits;
  ~Impl() {
    if (inv_freq != nullptr) (void)cudaFree(inv_freq);
    if (host_experts != nullptr) (void)cudaFreeHost(host_experts);
  }
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
  e->impl_ = std::make_unique<Impl>();
  e->weights_ = std::move(weights);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&e->stream_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(e->blas_, Cublas::Create(e->stream_));
  ASSIGN_OR_RETURN(e->pool_,
                   DeviceKvPool::Create(runtime::KvLayout{c.num_hidden_layers, options.block_tokens,
                                                          c.kv_lora_rank, c.qk_rope_head_dim},
                                        options.num_pages));
  const cpu::Rope rope(c);  // owns inv_freq (a reference into a temporary would dangle)
  const std::vector<float>& inv = rope.inv_freq();
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&e->impl_->inv_freq), inv.size() * 4));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(e->impl_->inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&e->impl_->num_sms, cudaDevAttrMultiProcessorCount, options.device));
  return e;
}

absl::Status CudaEngine::Forward(std::span<const SequenceInput> batch,
                                 std::vector<runtime::SequenceOutput>* outputs) {
  const ModelConfig& c = config();
  const DeviceWeights& W = *weights_;
  Impl& I = *impl_;
  cudaStream_t s = stream_;
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  const int64_t qk = c.qk_head_dim();
  const int64_t kvb_row = nope + vd;  // kv_b_proj rows per head: W_UK [nope] then W_UV [vd]
  const int64_t b = pool_->layout().block_tokens;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = static_cast<float>(c.SoftmaxScale());
  const int64_t hq_pad = (heads + 15) / 16 * 16;

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
      if (p < 0 || p >= pool_->num_pages()) {
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
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) {
    outputs->clear();
    return absl::OkStatus();
  }

  // Decode queries (absorbed rows): one MLA decode "sequence" per row, seeing positions <= its own.
  std::vector<int64_t> dec_rows;
  std::vector<int32_t> dec_seqlens, dec_table;
  int64_t max_pages = 0, dec_max_len = 0;
  for (size_t si = 0; si < batch.size(); ++si) {
    if (absorbed[si]) max_pages = std::max<int64_t>(max_pages, batch[si].pages->pages.size());
  }
  for (size_t si = 0; si < batch.size(); ++si) {
    if (!absorbed[si]) continue;
    const SequenceInput& in = batch[si];
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      dec_rows.push_back(first_row[si] + static_cast<int64_t>(i));
      const int64_t len = in.start_pos + static_cast<int64_t>(i) + 1;
      dec_seqlens.push_back(static_cast<int32_t>(len));
      dec_max_len = std::max(dec_max_len, len);
      for (int64_t p = 0; p < max_pages; ++p) {
        dec_table.push_back(p < static_cast<int64_t>(in.pages->pages.size()) ? in.pages->pages[p]
                                                                             : 0);
      }
    }
  }
  const int64_t m = static_cast<int64_t>(dec_rows.size());
  const bool all_decode = m == n;
  // Prefill (MHA) sequences: their context rows in the pool and cu_seqlens.
  struct MhaSeq {
    int64_t first_row, q_len, ctx;
    size_t lat_off, cu_off;
  };
  std::vector<MhaSeq> mha;
  int64_t max_ctx = 0, max_q = 0;
  std::vector<int64_t> lat_rows;
  std::vector<int32_t> cu;
  for (size_t si = 0; si < batch.size(); ++si) {
    if (absorbed[si]) continue;
    const SequenceInput& in = batch[si];
    const int64_t q_len = static_cast<int64_t>(in.tokens.size());
    const int64_t ctx = in.start_pos + q_len;
    mha.push_back({first_row[si], q_len, ctx, lat_rows.size(), cu.size()});
    for (int64_t t = 0; t < ctx; ++t) {
      lat_rows.push_back(static_cast<int64_t>(in.pages->pages[t / b]) * b + t % b);
    }
    cu.insert(cu.end(), {0, static_cast<int32_t>(q_len), 0, static_cast<int32_t>(ctx)});
    max_ctx = std::max(max_ctx, ctx);
    max_q = std::max(max_q, q_len);
  }
  // Output rows (the last, or every, new token of each sequence).
  std::vector<int64_t> out_rows(batch.size()), out_first(batch.size()), out_idx;
  for (size_t si = 0; si < batch.size(); ++si) {
    out_rows[si] = batch[si].all_logits ? static_cast<int64_t>(batch[si].tokens.size()) : 1;
    out_first[si] = static_cast<int64_t>(out_idx.size());
    const int64_t last = first_row[si] + static_cast<int64_t>(batch[si].tokens.size());
    for (int64_t r = last - out_rows[si]; r < last; ++r) out_idx.push_back(r);
  }
  const int64_t total_out = static_cast<int64_t>(out_idx.size());

  I.meta.Clear();
  const size_t o_ids = I.meta.Add(ids), o_pos = I.meta.Add(positions), o_kv = I.meta.Add(kv_rows),
               o_dec = I.meta.Add(dec_rows), o_dlen = I.meta.Add(dec_seqlens),
               o_dtab = I.meta.Add(dec_table), o_lat = I.meta.Add(lat_rows), o_cu = I.meta.Add(cu),
               o_out = I.meta.Add(out_idx);
  RETURN_IF_ERROR(I.meta.Upload(s));

  // ---- Buffers.
  const int64_t k_top = c.num_experts_per_tok;
  const int64_t big_inter = std::max(
      {c.intermediate_size, c.moe_intermediate_size * std::max<int64_t>(1, c.n_shared_experts)});
  RETURN_IF_ERROR(I.x.Ensure(n * h * 2));
  RETURN_IF_ERROR(I.xn.Ensure(n * h * 2));
  RETURN_IF_ERROR(I.delta.Ensure(n * h * 2));
  RETURN_IF_ERROR(I.q.Ensure(n * heads * qk * 2));
  RETURN_IF_ERROR(I.qa.Ensure(n * std::max<int64_t>(c.q_lora_rank, 8) * 2));
  RETURN_IF_ERROR(I.kva.Ensure(n * kRow * 2));
  RETURN_IF_ERROR(I.attn.Ensure(n * heads * vd * 2));
  RETURN_IF_ERROR(I.gu.Ensure(n * 2 * big_inter * 2));
  if (c.n_routed_experts > 0) {
    RETURN_IF_ERROR(I.router_logits.Ensure(n * c.n_routed_experts * 4));
    RETURN_IF_ERROR(I.experts.Ensure(n * k_top * 4));
    RETURN_IF_ERROR(I.weights.Ensure(n * k_top * 4));
    RETURN_IF_ERROR(I.xe.Ensure(n * k_top * h * 2));
    RETURN_IF_ERROR(I.gue.Ensure(n * k_top * 2 * c.moe_intermediate_size * 2));
    RETURN_IF_ERROR(I.ye.Ensure(n * k_top * h * 2));
    RETURN_IF_ERROR(I.shared_out.Ensure(n * h * 2));
    if (static_cast<size_t>(n * k_top) > I.host_experts_len) {
      if (I.host_experts != nullptr) (void)cudaFreeHost(I.host_experts);
      I.host_experts = nullptr;
      I.host_experts_len = 0;
      CUDA_RETURN_IF_ERROR(
          cudaHostAlloc(reinterpret_cast<void**>(&I.host_experts), n * k_top * 2 * 4, 0));
      I.host_experts_len = n * k_top * 2;
    }
  }
  int num_splits = 1;
  if (m > 0) {
    if (!all_decode) RETURN_IF_ERROR(I.qd.Ensure(m * heads * qk * 2));
    RETURN_IF_ERROR(I.qfull.Ensure(m * hq_pad * kRow * 2));
    RETURN_IF_ERROR(I.olat.Ensure(m * hq_pad * kLatent * 2));
    RETURN_IF_ERROR(I.dlse.Ensure(m * hq_pad * 4));
    num_splits = kernels::MlaDecodeNumSplits(static_cast<int>(m), static_cast<int>(hq_pad),
                                             static_cast<int>(dec_max_len), I.num_sms);
    RETURN_IF_ERROR(I.dws.Ensure(kernels::MlaDecodeWorkspaceBytes(
                                     static_cast<int>(m), static_cast<int>(hq_pad), num_splits) +
                                 256));
    if (!all_decode) RETURN_IF_ERROR(I.od.Ensure(m * heads * vd * 2));
    if (hq_pad != heads) {
      // Padded query heads stay zero (finite scores; their outputs are never read).
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(I.qfull.as<bf16>(), 0, m * hq_pad * kRow * 2, s));
    }
  }
  if (!mha.empty()) {
    RETURN_IF_ERROR(I.lat.Ensure(max_ctx * kRow * 2));
    RETURN_IF_ERROR(I.kvd.Ensure(max_ctx * heads * kvb_row * 2));
    RETURN_IF_ERROR(I.kp.Ensure(max_ctx * heads * kPadQk * 2));
    RETURN_IF_ERROR(I.vp.Ensure(max_ctx * heads * kPadV * 2));
    RETURN_IF_ERROR(I.qp.Ensure(max_q * heads * kPadQk * 2));
    RETURN_IF_ERROR(I.op.Ensure(max_q * heads * kPadV * 2));
    RETURN_IF_ERROR(I.plse.Ensure(max_q * heads * 4));
  }
  RETURN_IF_ERROR(I.fin.Ensure(total_out * h * 2));
  RETURN_IF_ERROR(I.logits.Ensure(total_out * c.vocab_size * 4));

  bf16* x = I.x.as<bf16>();
  bf16* xn = I.xn.as<bf16>();
  bf16* delta = I.delta.as<bf16>();
  bf16* q = I.q.as<bf16>();
  bf16* kva = I.kva.as<bf16>();
  bf16* attn = I.attn.as<bf16>();
  const int32_t* d_positions = I.meta.At<int32_t>(o_pos);

  auto linear = [&](const DeviceLinear& w, const bf16* a, int64_t lda, int64_t rows, void* out,
                    int64_t ldc, bool fp32 = false) {
    GemmArgs g;
    g.m = rows;
    g.n = w.out;
    g.k = w.in;
    g.trans_b = true;
    g.a = a;
    g.lda = lda;
    g.b = w.w;
    g.ldb = w.in;
    g.c = out;
    g.ldc = ldc;
    g.c_fp32 = fp32;
    return blas_.Gemm(g);
  };
  auto norm = [&](int64_t rows, int64_t dim, const bf16* in, int64_t ld_in, bf16* residual,
                  const bf16* weight, bf16* out, int64_t ld_out) {
    kernels::RmsNormParams p;
    p.rows = static_cast<int>(rows);
    p.dim = static_cast<int>(dim);
    p.eps = eps;
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
    return kernels::LaunchRmsNorm(p, s);
  };
  auto silu = [&](int64_t rows, int64_t inter, bf16* gate_up) {
    kernels::SiluMulParams p;
    p.rows = static_cast<int>(rows);
    p.dim = static_cast<int>(inter);
    p.gate = gate_up;
    p.ld_gate = 2 * inter;
    p.up = gate_up + inter;
    p.ld_up = 2 * inter;
    p.out = gate_up;
    p.ld_out = 2 * inter;
    return kernels::LaunchSiluMul(p, s);
  };

  StepStats stats;
  stats.tokens = n;
  RETURN_IF_ERROR(GatherRows32(W.embed(), h, I.meta.At<int32_t>(o_ids), n, h, x, h, s));

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayer& L = W.layers()[l];
    stats.weight_bytes += L.attention_bytes();
    // Input norm; from layer 1 on fused with x += delta (the previous block's output).
    RETURN_IF_ERROR(norm(n, h, l == 0 ? x : delta, h, l == 0 ? nullptr : x, L.input_norm, xn, h));
    if (c.q_lora_rank > 0) {
      bf16* qa = I.qa.as<bf16>();
      RETURN_IF_ERROR(linear(L.q_a_proj, xn, h, n, qa, c.q_lora_rank));
      RETURN_IF_ERROR(
          norm(n, c.q_lora_rank, qa, c.q_lora_rank, nullptr, L.q_a_norm, qa, c.q_lora_rank));
      RETURN_IF_ERROR(linear(L.q_b_proj, qa, c.q_lora_rank, n, q, heads * qk));
    } else {
      RETURN_IF_ERROR(linear(L.q_proj, xn, h, n, q, heads * qk));
    }
    RETURN_IF_ERROR(linear(L.kv_a_proj, xn, h, n, kva, kRow));
    RETURN_IF_ERROR(norm(n, kLatent, kva, kRow, nullptr, L.kv_a_norm, kva, kRow));
    {
      kernels::RopeParams p;
      p.num_tokens = static_cast<int>(n);
      p.num_heads = static_cast<int>(heads);
      p.rope_dim = static_cast<int>(kRope);
      p.layout = Lanes(c.rope_layout);
      p.attention_factor = static_cast<float>(c.RopeAttentionFactor());
      p.x = q + nope;
      p.token_stride = heads * qk;
      p.head_stride = qk;
      p.positions = d_positions;
      p.inv_freq = I.inv_freq;
      RETURN_IF_ERROR(kernels::LaunchRope(p, s));
      p.num_heads = 1;
      p.x = kva + kLatent;
      p.token_stride = kRow;
      p.head_stride = kRow;
      RETURN_IF_ERROR(kernels::LaunchRope(p, s));
    }
    bf16* pool_l = pool_->layer_base(l);
    RETURN_IF_ERROR(ScatterRows(kva, kRow, I.meta.At<int64_t>(o_kv), n, kRow, pool_l, kRow, s));

    // ---- Attention, MHA form: per sequence over its decompressed context.
    for (const MhaSeq& sq : mha) {
      bf16* lat = I.lat.as<bf16>();
      bf16* kvd = I.kvd.as<bf16>();
      RETURN_IF_ERROR(GatherRows(pool_l, kRow, I.meta.At<int64_t>(o_lat) + sq.lat_off, sq.ctx, kRow,
                                 lat, kRow, s));
      RETURN_IF_ERROR(linear(L.kv_b_proj, lat, kRow, sq.ctx, kvd, heads * kvb_row));
      stats.kv_bytes += sq.ctx * kRow * 2;
      CopyHeadsParams cp;
      // K = [k_nope | 0 | k_pe] per head, V = [v | 0].
      cp = {sq.ctx,  heads,           nope,           kPadNope, kvd, heads * kvb_row,
            kvb_row, I.kp.as<bf16>(), heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      cp = {sq.ctx,         heads, kRope, kRope, lat + kLatent, kRow, 0, I.kp.as<bf16>() + kPadNope,
            heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      cp = {sq.ctx,          heads,         vd,   kPadV, kvd + nope, heads * kvb_row, kvb_row,
            I.vp.as<bf16>(), heads * kPadV, kPadV};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      // Q = [q_nope | 0 | q_pe].
      const bf16* qs = q + sq.first_row * heads * qk;
      cp = {sq.q_len, heads,           nope,           kPadNope, qs, heads * qk,
            qk,       I.qp.as<bf16>(), heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      cp = {sq.q_len,       heads,      kRope, kRope,
            qs + nope,      heads * qk, qk,    I.qp.as<bf16>() + kPadNope,
            heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      kernels::PrefillAttentionParams p;
      p.batch = 1;
      p.num_heads = static_cast<int>(heads);
      p.max_seqlen_q = static_cast<int>(sq.q_len);
      p.causal = true;
      p.accumulate = false;
      p.softmax_scale = scale;
      p.cu_seqlens_q = I.meta.At<int32_t>(o_cu) + sq.cu_off;
      p.cu_seqlens_k = I.meta.At<int32_t>(o_cu) + sq.cu_off + 2;
      p.q = I.qp.as<bf16>();
      p.q_token_stride = heads * kPadQk;
      p.q_head_stride = kPadQk;
      p.k = I.kp.as<bf16>();
      p.k_token_stride = heads * kPadQk;
      p.k_head_stride = kPadQk;
      p.v = I.vp.as<bf16>();
      p.v_token_stride = heads * kPadV;
      p.v_head_stride = kPadV;
      p.out = I.op.as<bf16>();
      p.out_token_stride = heads * kPadV;
      p.out_head_stride = kPadV;
      p.lse = I.plse.as<float>();
      RETURN_IF_ERROR(kernels::LaunchPrefillAttention(p, s));
      cp = {sq.q_len,
            heads,
            vd,
            vd,
            I.op.as<bf16>(),
            heads * kPadV,
            kPadV,
            attn + sq.first_row * heads * vd,
            heads * vd,
            vd};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }

    // ---- Attention, absorbed form (MLA decode over the latent pages).
    if (m > 0) {
      const bf16* qd = q;
      if (!all_decode) {
        RETURN_IF_ERROR(GatherRows(q, heads * qk, I.meta.At<int64_t>(o_dec), m, heads * qk,
                                   I.qd.as<bf16>(), heads * qk, s));
        qd = I.qd.as<bf16>();
      }
      bf16* qfull = I.qfull.as<bf16>();
      // q_lat[r][hd] = q_nope[r][hd] · W_UK[hd]   ([nope] × [nope][512], one GEMM per head).
      GemmArgs g;
      g.m = m;
      g.n = kLatent;
      g.k = nope;
      g.trans_b = false;
      g.a = qd;
      g.lda = heads * qk;
      g.stride_a = qk;
      g.b = L.kv_b_proj.w;
      g.ldb = kLatent;
      g.stride_b = kvb_row * kLatent;
      g.c = qfull;
      g.ldc = hq_pad * kRow;
      g.stride_c = kRow;
      g.batch = heads;
      RETURN_IF_ERROR(blas_.Gemm(g));
      CopyHeadsParams cp{m,          heads, kRope,           kRope,         qd + nope,
                         heads * qk, qk,    qfull + kLatent, hq_pad * kRow, kRow};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      kernels::MlaDecodeParams p;
      p.batch = static_cast<int>(m);
      p.num_heads_q = static_cast<int>(hq_pad);
      p.num_pages = static_cast<int>(pool_->num_pages());
      p.max_pages_per_seq = static_cast<int>(max_pages);
      p.num_splits = num_splits;
      p.softmax_scale = scale;
      p.q = qfull;
      p.kv_cache = pool_l;
      p.block_table = I.meta.At<int32_t>(o_dtab);
      p.seqlens = I.meta.At<int32_t>(o_dlen);
      p.out = I.olat.as<bf16>();
      p.lse = I.dlse.as<float>();
      if (num_splits > 1) kernels::MlaDecodeSetWorkspace(p, I.dws.as<void>());
      RETURN_IF_ERROR(kernels::LaunchMlaDecode(p, s));
      for (int32_t len : dec_seqlens) stats.kv_bytes += static_cast<int64_t>(len) * kRow * 2;
      // out[r][hd] = o_lat[r][hd] · W_UV[hd]ᵀ   ([512] × [vd][512]ᵀ, one GEMM per head).
      bf16* od = all_decode ? attn : I.od.as<bf16>();
      g = GemmArgs{};
      g.m = m;
      g.n = vd;
      g.k = kLatent;
      g.trans_b = true;
      g.a = I.olat.as<bf16>();
      g.lda = hq_pad * kLatent;
      g.stride_a = kLatent;
      g.b = L.kv_b_proj.w + nope * kLatent;
      g.ldb = kLatent;
      g.stride_b = kvb_row * kLatent;
      g.c = od;
      g.ldc = heads * vd;
      g.stride_c = vd;
      g.batch = heads;
      RETURN_IF_ERROR(blas_.Gemm(g));
      if (!all_decode) {
        RETURN_IF_ERROR(ScatterRows(od, heads * vd, I.meta.At<int64_t>(o_dec), m, heads * vd, attn,
                                    heads * vd, s));
      }
    }
    RETURN_IF_ERROR(linear(L.o_proj, attn, heads * vd, n, delta, h));

    // ---- Feed-forward.
    RETURN_IF_ERROR(norm(n, h, delta, h, x, L.post_attention_norm, xn, h));
    if (!L.moe) {
      const int64_t inter = L.down.in;
      RETURN_IF_ERROR(linear(L.gate_up, xn, h, n, I.gu.as<bf16>(), 2 * inter));
      RETURN_IF_ERROR(silu(n, inter, I.gu.as<bf16>()));
      RETURN_IF_ERROR(linear(L.down, I.gu.as<bf16>(), 2 * inter, n, delta, h));
      stats.weight_bytes += L.gate_up.bytes() + L.down.bytes();
      continue;
    }
    const int64_t ne = c.n_routed_experts;
    RETURN_IF_ERROR(linear(L.router, xn, h, n, I.router_logits.as<float>(), ne, /*fp32=*/true));
    {
      kernels::MoeRouterParams p;
      p.num_tokens = static_cast<int>(n);
      p.num_experts = static_cast<int>(ne);
      p.top_k = static_cast<int>(k_top);
      p.scoring = c.scoring_func == model::ScoringFunc::kSoftmax ? kernels::MoeScoring::kSoftmax
                                                                 : kernels::MoeScoring::kSigmoid;
      p.topk_method = c.topk_method == model::TopkMethod::kGreedy
                          ? kernels::MoeTopkMethod::kGreedy
                          : (c.topk_method == model::TopkMethod::kGroupLimitedGreedy
                                 ? kernels::MoeTopkMethod::kGroupLimitedGreedy
                                 : kernels::MoeTopkMethod::kNoauxTc);
      p.n_group = static_cast<int>(c.n_group);
      p.topk_group = static_cast<int>(c.topk_group);
      p.normalize = c.type == model::ModelType::kDeepseekV3 && c.norm_topk_prob;
      p.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
      p.logits = I.router_logits.as<float>();
      p.ld_logits = ne;
      p.bias = L.score_bias;
      p.experts = I.experts.as<int32_t>();
      p.weights = I.weights.as<float>();
      RETURN_IF_ERROR(kernels::LaunchMoeRouter(p, s));
    }
    // The routing comes to the host: per-expert GEMM sizes are host decisions.
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(I.host_experts, I.experts.as<int32_t>(), n * k_top * 4,
                                         cudaMemcpyDeviceToHost, s));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    std::vector<int64_t> count(ne, 0), offset(ne + 1, 0);
    for (int64_t i = 0; i < n * k_top; ++i) {
      const int32_t e = I.host_experts[i];
      if (e < 0 || e >= ne) return absl::InternalError(StrCat("router chose expert ", e));
      ++count[e];
    }
    for (int64_t e = 0; e < ne; ++e) offset[e + 1] = offset[e] + count[e];
    std::vector<int64_t> perm(n * k_top), pos(n * k_top);
    {
      std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
      for (int64_t i = 0; i < n * k_top; ++i) {
        const int64_t row = fill[I.host_experts[i]]++;
        pos[i] = row;
        perm[row] = i / k_top;
      }
    }
    I.moe_meta.Clear();
    const size_t o_perm = I.moe_meta.Add(perm), o_mpos = I.moe_meta.Add(pos);
    RETURN_IF_ERROR(I.moe_meta.Upload(s));
    bf16* xe = I.xe.as<bf16>();
    bf16* gue = I.gue.as<bf16>();
    bf16* ye = I.ye.as<bf16>();
    const int64_t inter = c.moe_intermediate_size;
    RETURN_IF_ERROR(GatherRows(xn, h, I.moe_meta.At<int64_t>(o_perm), n * k_top, h, xe, h, s));
    for (int64_t e = 0; e < ne; ++e) {
      if (count[e] == 0) continue;
      const DeviceLinear gate_up{L.experts + e * L.expert_stride, 2 * inter, h};
      RETURN_IF_ERROR(
          linear(gate_up, xe + offset[e] * h, h, count[e], gue + offset[e] * 2 * inter, 2 * inter));
      stats.weight_bytes += 3 * inter * h * 2;
    }
    RETURN_IF_ERROR(silu(n * k_top, inter, gue));
    for (int64_t e = 0; e < ne; ++e) {
      if (count[e] == 0) continue;
      const DeviceLinear down{L.experts + e * L.expert_stride + 2 * inter * h, h, inter};
      RETURN_IF_ERROR(
          linear(down, gue + offset[e] * 2 * inter, 2 * inter, count[e], ye + offset[e] * h, h));
    }
    const bf16* shared = nullptr;
    if (L.has_shared) {
      const int64_t si = L.shared_down.in;
      RETURN_IF_ERROR(linear(L.shared_gate_up, xn, h, n, I.gu.as<bf16>(), 2 * si));
      RETURN_IF_ERROR(silu(n, si, I.gu.as<bf16>()));
      RETURN_IF_ERROR(
          linear(L.shared_down, I.gu.as<bf16>(), 2 * si, n, I.shared_out.as<bf16>(), h));
      shared = I.shared_out.as<bf16>();
      stats.weight_bytes += L.shared_gate_up.bytes() + L.shared_down.bytes();
    }
    stats.weight_bytes += L.router.bytes();
    RETURN_IF_ERROR(MoeCombine(ye, I.moe_meta.At<int64_t>(o_mpos), I.weights.as<float>(), n, k_top,
                               h, shared, delta, s));
  }
  // Final norm (fused with the last residual add), then the LM head on the output rows only.
  RETURN_IF_ERROR(norm(n, h, delta, h, x, W.final_norm(), xn, h));
  bf16* fin = I.fin.as<bf16>();
  RETURN_IF_ERROR(GatherRows(xn, h, I.meta.At<int64_t>(o_out), total_out, h, fin, h, s));
  float* logits = I.logits.as<float>();
  RETURN_IF_ERROR(linear(W.lm_head(), fin, h, total_out, logits, c.vocab_size, /*fp32=*/true));
  stats.weight_bytes += W.lm_head().bytes() + n * h * 2;
  outputs->assign(batch.size(), {});
  for (size_t si = 0; si < batch.size(); ++si) {
    auto& out = (*outputs)[si];
    out.rows = out_rows[si];
    out.logits.resize(out_rows[si] * c.vocab_size);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.logits.data(), logits + out_first[si] * c.vocab_size,
                                         out.logits.size() * 4, cudaMemcpyDeviceToHost, s));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  stats_ = stats;
  return absl::OkStatus();
}

}  // namespace strata::cuda
