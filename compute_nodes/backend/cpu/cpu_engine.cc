#include "compute_nodes/backend/cpu/cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/strings.h"

namespace strata::cpu {

using model::ModelConfig;
using runtime::SequenceInput;

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

bool UsesAbsorbedForm(const SequenceInput& in) {
  return in.form == runtime::AttentionForm::kAbsorbed ||
         (in.form == runtime::AttentionForm::kAuto && in.tokens.size() == 1);
}
}  // namespace

CpuEngine::CpuEngine(std::shared_ptr<const model::ModelWeights> weights, int64_t num_pages,
                     int64_t block_tokens, runtime::KvPrecision kv_precision,
                     int64_t context_cache_bytes)
    : weights_(std::move(weights)),
      pool_(runtime::KvLayout{weights_->config.num_hidden_layers, block_tokens,
                              weights_->config.kv_lora_rank, weights_->config.qk_rope_head_dim},
            num_pages, kv_precision),
      rope_(weights_->config),
      context_cache_budget_(std::max<int64_t>(0, context_cache_bytes)) {}

absl::Status CpuEngine::Forward(std::span<const SequenceInput> batch,
                                std::vector<runtime::SequenceOutput>* outputs) {
  const auto start = Clock::now();
  absl::Status st = Run(batch, outputs);
  AddTime(&Times::forward_s, Seconds(start, Clock::now()));
  return st;
}

absl::Status CpuEngine::Run(std::span<const SequenceInput> batch,
                            std::vector<runtime::SequenceOutput>* outputs) {
  const ModelConfig& c = weights_->config;
  const model::ModelWeights& w = *weights_;
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t qk = c.qk_head_dim();
  const int64_t kvr = c.kv_lora_rank;
  const int64_t rope = c.qk_rope_head_dim;
  const int64_t b = pool_.layout().block_tokens;

  // Validate and flatten the batch: row r of every activation is one new token.
  std::vector<Token> tokens;
  std::vector<int64_t> first_row(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    if (in.tokens.empty()) return absl::InvalidArgumentError(StrCat("sequence ", s, ": no tokens"));
    if (in.pages == nullptr)
      return absl::InvalidArgumentError(StrCat("sequence ", s, ": no pages"));
    const int64_t end = in.start_pos + static_cast<int64_t>(in.tokens.size());
    if (in.start_pos < 0 || static_cast<int64_t>(in.pages->pages.size()) * b < end) {
      return absl::InvalidArgumentError(StrCat("sequence ", s, ": pages cover ",
                                               in.pages->pages.size() * b, " tokens, need ", end));
    }
    for (int32_t p : in.pages->pages) {
      if (p < 0 || p >= pool_.num_pages()) {
        return absl::InvalidArgumentError(StrCat("sequence ", s, ": bad page ", p));
      }
    }
    first_row[s] = static_cast<int64_t>(tokens.size());
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            StrCat("sequence ", s, ": token ", in.tokens[i], " outside the vocabulary"));
      }
      tokens.push_back({static_cast<int64_t>(s), in.start_pos + static_cast<int64_t>(i)});
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> x(n * h);
  for (int64_t r = 0; r < n; ++r) {
    const SequenceInput& in = batch[tokens[r].seq];
    const int32_t id = in.tokens[r - first_row[tokens[r].seq]];
    std::copy_n(w.embed.data() + static_cast<int64_t>(id) * h, h, x.data() + r * h);
  }

  std::vector<float> xn(n * h), q(n * heads * qk), kva(n * (kvr + rope)),
      attn(n * heads * c.v_head_dim);
  std::vector<float> qa(c.q_lora_rank > 0 ? n * c.q_lora_rank : 0), ffn(n * h);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const model::LayerWeights& L = w.layers[l];
    std::copy(x.begin(), x.end(), xn.begin());
    RmsNorm(xn.data(), n, h, h, L.input_norm.data(), c.rms_norm_eps);
    if (c.q_lora_rank > 0) {
      LinearForward(L.q_a_proj, xn.data(), n, qa.data());
      RmsNorm(qa.data(), n, c.q_lora_rank, c.q_lora_rank, L.q_a_norm.data(), c.rms_norm_eps);
      LinearForward(L.q_b_proj, qa.data(), n, q.data());
    } else {
      LinearForward(L.q_proj, xn.data(), n, q.data());
    }
    LinearForward(L.kv_a_proj, xn.data(), n, kva.data());
    RmsNorm(kva.data(), n, kvr, kvr + rope, L.kv_a_norm.data(), c.rms_norm_eps);
    // RoPE on q_pe of every head and on k_pe; then latent + k_pe go into the pages.
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        rope_.Apply(q.data() + (r * heads + hd) * qk + c.qk_nope_head_dim, tokens[r].position);
      }
      float* row = kva.data() + r * (kvr + rope);
      rope_.Apply(row + kvr, tokens[r].position);
      const runtime::PageTable& pt = *batch[tokens[r].seq].pages;
      const int32_t page = pt.pages[tokens[r].position / b];
      const int64_t slot = tokens[r].position % b;
      pool_.StoreRow(page, l, slot, row, row + kvr);
    }
    // Prefill chunks: the context decompressed once, then per head a few large GEMMs (the BLAS
    // threads them). Decode rows: absorbed form, every (sequence, head) pair one task.
    std::vector<int64_t> absorbed_tasks;
    for (size_t s = 0; s < batch.size(); ++s) {
      const SequenceInput& in = batch[s];
      const bool absorbed = UsesAbsorbedForm(in);
      const int64_t rows = static_cast<int64_t>(in.tokens.size());
      const float* qs = q.data() + first_row[s] * heads * qk;
      float* os = attn.data() + first_row[s] * heads * c.v_head_dim;
      if (absorbed) {
        for (int64_t hd = 0; hd < heads; ++hd) absorbed_tasks.push_back(s * heads + hd);
        continue;
      }
      const auto t0 = Clock::now();
      const Context& context = ContextFor(l, in, &scratch_context_);
      const auto t1 = Clock::now();
      for (int64_t hd = 0; hd < heads; ++hd) AttendMha(in, context, qs, rows, hd, os);
      AddTime(&Times::decompress_s, Seconds(t0, t1));
      AddTime(&Times::attention_s, Seconds(t1, Clock::now()));
    }
    const auto t0 = Clock::now();
    ParallelFor(static_cast<int64_t>(absorbed_tasks.size()), [&](int64_t i) {
      const size_t s = static_cast<size_t>(absorbed_tasks[i] / heads);
      const SequenceInput& in = batch[s];
      AttendAbsorbed(l, in, q.data() + first_row[s] * heads * qk,
                     static_cast<int64_t>(in.tokens.size()), absorbed_tasks[i] % heads,
                     attn.data() + first_row[s] * heads * c.v_head_dim);
    });
    AddTime(&Times::attention_s, Seconds(t0, Clock::now()));
    LinearForward(L.o_proj, attn.data(), n, x.data(), /*accumulate=*/true);

    std::copy(x.begin(), x.end(), xn.begin());
    RmsNorm(xn.data(), n, h, h, L.post_attention_norm.data(), c.rms_norm_eps);
    FeedForward(l, xn.data(), n, ffn.data());
    for (int64_t i = 0; i < n * h; ++i) x[i] += ffn[i];
  }
  TrimContextCache(batch);
  RmsNorm(x.data(), n, h, h, w.final_norm.data(), c.rms_norm_eps);

  // The LM head runs once for the rows of all sequences (a GEMM, not one GEMV per sequence).
  std::vector<int64_t> out_rows(batch.size()), out_first(batch.size());
  int64_t total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    out_rows[s] = batch[s].all_logits ? static_cast<int64_t>(batch[s].tokens.size()) : 1;
    out_first[s] = total;
    total += out_rows[s];
  }
  std::vector<float> final_rows(total * h);
  for (size_t s = 0; s < batch.size(); ++s) {
    const int64_t row0 = first_row[s] + static_cast<int64_t>(batch[s].tokens.size()) - out_rows[s];
    std::copy_n(x.data() + row0 * h, out_rows[s] * h, final_rows.data() + out_first[s] * h);
  }
  std::vector<float> logits(total * c.vocab_size);
  LinearForward(w.lm_head, final_rows.data(), total, logits.data());
  outputs->assign(batch.size(), {});
  for (size_t s = 0; s < batch.size(); ++s) {
    auto& out = (*outputs)[s];
    out.rows = out_rows[s];
    const float* src = logits.data() + out_first[s] * c.vocab_size;
    out.logits.assign(src, src + out_rows[s] * c.vocab_size);
  }
  SetDrawnTokens(batch, c.vocab_size, outputs);
  return absl::OkStatus();
}

void CpuEngine::DecompressRange(int64_t layer, const SequenceInput& in, int64_t from,
                                Context* out) {
  const ModelConfig& c = weights_->config;
  const model::LayerWeights& L = weights_->layers[layer];
  const int64_t b = pool_.layout().block_tokens;
  const int64_t kvr = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int64_t ctx = in.start_pos + static_cast<int64_t>(in.tokens.size());
  const int64_t per_token = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim);
  // The pages cover what the sequence will hold (the worker allocates them for the whole prompt):
  // reserving that once spares the copies of geometric growth.
  const int64_t capacity = std::max<int64_t>(ctx, static_cast<int64_t>(in.pages->pages.size()) * b);
  out->kv.reserve(capacity * per_token);
  out->k_pe.reserve(capacity * rope);
  out->kv.resize(ctx * per_token);
  out->k_pe.resize(ctx * rope);
  // The latents of many pages are gathered into one slab so that kv_b_proj runs as one large
  // GEMM per slab rather than one 64-row GEMM per page (half the speed).
  constexpr int64_t kSlabRows = 1024;
  latent_slab_.resize(std::min(kSlabRows, std::max<int64_t>(ctx - from, 1)) * kvr);
  for (int64_t slab = from; slab < ctx; slab += kSlabRows) {
    const int64_t end = std::min(ctx, slab + kSlabRows);
    for (int64_t pos = slab; pos < end;) {
      const int32_t page = in.pages->pages[pos / b];
      const int64_t slot = pos % b;
      const int64_t n = std::min(b - slot, end - pos);
      std::copy_n(pool_.Latent(page, layer) + slot * kvr, n * kvr,
                  latent_slab_.data() + (pos - slab) * kvr);
      std::copy_n(pool_.KPe(page, layer) + slot * rope, n * rope, out->k_pe.data() + pos * rope);
      pos += n;
    }
    LinearForward(L.kv_b_proj, latent_slab_.data(), end - slab, out->kv.data() + slab * per_token);
  }
}

const CpuEngine::Context& CpuEngine::ContextFor(int64_t layer, const SequenceInput& in,
                                                Context* scratch) {
  if (in.sequence_id == 0 || context_cache_budget_ == 0) {
    DecompressRange(layer, in, 0, scratch);
    return *scratch;
  }
  const int64_t b = pool_.layout().block_tokens;
  const int64_t rope = weights_->config.qk_rope_head_dim;
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto [it, fresh] = context_cache_.try_emplace(in.sequence_id);
  CachedContext& entry = it->second;
  if (fresh && !spare_.empty()) {
    // Buffers of a finished sequence: already faulted in, no page to zero.
    entry.layers = std::move(spare_.back());
    spare_.pop_back();
    for (Context& c : entry.layers) {
      c.kv.clear();
      c.k_pe.clear();
    }
  }
  entry.layers.resize(weights_->config.num_hidden_layers);
  Context& cached = entry.layers[layer];
  int64_t covered = static_cast<int64_t>(cached.k_pe.size()) / rope;
  // What is kept is only good for positions the pages still hold unchanged: never past
  // start_pos (those rows are being written now), and only under the same pages.
  const size_t pages_used = static_cast<size_t>((std::min(covered, in.start_pos) + b - 1) / b);
  const bool same_pages =
      entry.pages.size() >= pages_used && in.pages->pages.size() >= pages_used &&
      std::equal(entry.pages.begin(), entry.pages.begin() + pages_used, in.pages->pages.begin());
  if (!same_pages) covered = 0;
  covered = std::min(covered, in.start_pos);
  DecompressRange(layer, in, covered, &cached);
  return cached;
}

void CpuEngine::TrimContextCache(std::span<const SequenceInput> batch) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (const SequenceInput& in : batch) {
    if (in.sequence_id == 0) continue;
    auto it = context_cache_.find(in.sequence_id);
    if (it == context_cache_.end()) continue;
    if (UsesAbsorbedForm(in)) {  // decoding: the prefill's context is not needed any more
      RetireLocked(it);
      continue;
    }
    it->second.pages = in.pages->pages;
    it->second.last_use = ++use_clock_;
  }
  EnforceBudgetLocked();
}

void CpuEngine::RetireLocked(std::unordered_map<uint64_t, CachedContext>::iterator it) {
  spare_.push_back(std::move(it->second.layers));
  context_cache_.erase(it);
}

void CpuEngine::EnforceBudgetLocked() {
  int64_t live = 0, spare = 0;
  for (const auto& [id, entry] : context_cache_) live += entry.bytes();
  for (const auto& layers : spare_) spare += LayersBytes(layers);
  // Spare buffers go first, then the least recently used sequences.
  while (live + spare > context_cache_budget_ && !spare_.empty()) {
    spare -= LayersBytes(spare_.front());
    spare_.erase(spare_.begin());
  }
  while (live > context_cache_budget_ && !context_cache_.empty()) {
    auto oldest = context_cache_.begin();
    for (auto it = context_cache_.begin(); it != context_cache_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    live -= oldest->second.bytes();
    context_cache_.erase(oldest);
  }
}

void CpuEngine::ForgetSequence(uint64_t id) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (auto it = context_cache_.find(id); it != context_cache_.end()) {
    RetireLocked(it);
    EnforceBudgetLocked();
  }
}

int64_t CpuEngine::context_cache_bytes_used() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  int64_t total = 0;
  for (const auto& [id, entry] : context_cache_) total += entry.bytes();
  return total;
}

int64_t CpuEngine::LayersBytes(const std::vector<Context>& layers) {
  int64_t total = 0;
  for (const Context& c : layers) {
    total += static_cast<int64_t>((c.kv.capacity() + c.k_pe.capacity()) * sizeof(float));
  }
  return total;
}

int64_t CpuEngine::context_cache_bytes_reserved() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  int64_t total = 0;
  for (const auto& [id, entry] : context_cache_) total += entry.bytes();
  for (const auto& layers : spare_) total += LayersBytes(layers);
  return total;
}

void CpuEngine::AttendMha(const SequenceInput& in, const Context& context, const float* q,
                          int64_t rows, int64_t hd, float* out) {
  const ModelConfig& c = weights_->config;
  const int64_t heads = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t qk = nope + rope;
  const int64_t kv_ld = heads * (nope + vd);
  const float* k_nope = context.kv.data() + hd * (nope + vd);
  const float* v = k_nope + nope;
  const float scale = static_cast<float>(c.SoftmaxScale());
  // Rows go in blocks, each against the keys its last row may see (causal): a block's scores
  // stay small (kRowBlock × context) and later blocks of a long chunk skip nothing they need.
  constexpr int64_t kRowBlock = 256;
  const int64_t block_rows = std::min(rows, kRowBlock);
  const int64_t max_keys = in.start_pos + rows;
  auto grow = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  grow(mha_.qn, block_rows * nope);
  grow(mha_.qpe, block_rows * rope);
  grow(mha_.scores, block_rows * max_keys);
  grow(mha_.out, block_rows * vd);
  grow(mha_.inv_sum, block_rows);
  float* qn = mha_.qn.data();
  float* qpe = mha_.qpe.data();
  float* s = mha_.scores.data();
  float* o = mha_.out.data();
  float* inv_sum = mha_.inv_sum.data();
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t nr = std::min(kRowBlock, rows - r0);
    const int64_t keys = in.start_pos + r0 + nr;
    for (int64_t r = 0; r < nr; ++r) {
      const float* src = q + ((r0 + r) * heads + hd) * qk;
      std::copy_n(src, nope, qn + r * nope);
      std::copy_n(src + nope, rope, qpe + r * rope);
    }
    Gemm(true, nr, keys, nope, scale, qn, nope, k_nope, kv_ld, 0.0f, s, keys);
    Gemm(true, nr, keys, rope, scale, qpe, rope, context.k_pe.data(), rope, 1.0f, s, keys);
    // Exact softmax per row over the keys at or before its position; later keys get weight 0.
    ParallelFor(std::min<int64_t>(nr, 8), [&](int64_t part) {
      for (int64_t r = part; r < nr; r += std::min<int64_t>(nr, 8)) {
        float* sr = s + r * keys;
        const int64_t visible = in.start_pos + r0 + r + 1;
        const float mx = *std::max_element(sr, sr + visible);
        float sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          sr[j] = std::exp(sr[j] - mx);
          sum += sr[j];
        }
        std::fill(sr + visible, sr + keys, 0.0f);
        inv_sum[r] = 1.0f / sum;
      }
    });
    Gemm(false, nr, vd, keys, 1.0f, s, keys, v, kv_ld, 0.0f, o, vd);
    for (int64_t r = 0; r < nr; ++r) {
      float* dst = out + ((r0 + r) * heads + hd) * vd;
      for (int64_t d = 0; d < vd; ++d) dst[d] = o[r * vd + d] * inv_sum[r];
    }
  }
}

// Absorbed form: q_nope folded through W_UK into the latent space, scores and values straight
// from the latent pages, W_UV after. Pages are merged by online softmax (running max and sum).
void CpuEngine::AttendAbsorbed(int64_t layer, const SequenceInput& in, const float* q, int64_t rows,
                               int64_t hd, float* out) const {
  const ModelConfig& c = weights_->config;
  const model::LayerWeights& L = weights_->layers[layer];
  const int64_t heads = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t qk = nope + rope, kvr = c.kv_lora_rank;
  const int64_t b = pool_.layout().block_tokens;
  const int64_t ctx = in.start_pos + rows;
  const int64_t n_pages = (ctx + b - 1) / b;
  const float scale = static_cast<float>(c.SoftmaxScale());
  const int64_t kv_row = nope + vd;  // kv_b_proj rows per head: W_UK [nope] then W_UV [vd]
  // q_lat[r] = q_nope[r] · W_UK[hd]  ([nope] × [nope][kvr]); the score is q_lat · latent +
  // q_pe · k_pe.
  std::vector<float> qn(rows * nope), qh(rows * kvr), qpe(rows * rope);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = q + (r * heads + hd) * qk;
    std::copy_n(src, nope, qn.data() + r * nope);
    std::copy_n(src + nope, rope, qpe.data() + r * rope);
  }
  Gemm(false, rows, kvr, nope, 1.0f, qn.data(), nope, L.kv_b_proj.w.data() + hd * kv_row * kvr, kvr,
       0.0f, qh.data(), kvr);
  // Online softmax over pages: running max m, running sum lsum, accumulator acc (latent space).
  std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), lsum(rows, 0.0f);
  std::vector<float> acc(rows * kvr, 0.0f), s(rows * b);
  for (int64_t p = 0; p < n_pages; ++p) {
    const int32_t page = in.pages->pages[p];
    const int64_t valid = std::min(b, ctx - p * b);
    const float* latent = pool_.Latent(page, layer);
    Gemm(true, rows, valid, kvr, scale, qh.data(), kvr, latent, kvr, 0.0f, s.data(), b);
    Gemm(true, rows, valid, rope, scale, qpe.data(), rope, pool_.KPe(page, layer), rope, 1.0f,
         s.data(), b);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t qpos = in.start_pos + r;
      float* sr = s.data() + r * b;
      float mx = m[r];
      for (int64_t j = 0; j < valid; ++j) {
        if (p * b + j > qpos) sr[j] = -std::numeric_limits<float>::infinity();  // causal
        mx = std::max(mx, sr[j]);
      }
      const float corr = std::exp(m[r] - mx);  // 0 for the first page (m = -inf)
      float sum = 0;
      for (int64_t j = 0; j < valid; ++j) {
        sr[j] = std::exp(sr[j] - mx);
        sum += sr[j];
      }
      lsum[r] = lsum[r] * corr + sum;
      m[r] = mx;
      float* ar = acc.data() + r * kvr;
      for (int64_t d = 0; d < kvr; ++d) ar[d] *= corr;
    }
    Gemm(false, rows, kvr, valid, 1.0f, s.data(), b, latent, kvr, 1.0f, acc.data(), kvr);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* ar = acc.data() + r * kvr;
    const float inv = 1.0f / lsum[r];
    for (int64_t d = 0; d < kvr; ++d) ar[d] *= inv;
  }
  // out = o_lat · W_UV[hd]ᵀ ([kvr] × [vd][kvr]ᵀ).
  std::vector<float> o(rows * vd);
  Gemm(true, rows, vd, kvr, 1.0f, acc.data(), kvr,
       L.kv_b_proj.w.data() + (hd * kv_row + nope) * kvr, kvr, 0.0f, o.data(), vd);
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(o.data() + r * vd, vd, out + (r * heads + hd) * vd);
}

void CpuEngine::FeedForward(int64_t layer, const float* x, int64_t n, float* y) {
  const ModelConfig& c = weights_->config;
  const model::LayerWeights& L = weights_->layers[layer];
  const int64_t h = c.hidden_size;
  if (!L.moe) {
    MlpForward(L.dense, x, n, y);
    return;
  }
  // The router runs in fp32 (as transformers does, whatever the model dtype).
  std::vector<float> logits(n * c.n_routed_experts);
  LinearForward(L.router, x, n, logits.data());
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(c.n_routed_experts);
  std::vector<int32_t> experts;
  std::vector<float> weights;
  for (int64_t r = 0; r < n; ++r) {
    RouteToken(c, logits.data() + r * c.n_routed_experts,
               L.score_bias.empty() ? nullptr : L.score_bias.data(), &experts, &weights);
    for (size_t k = 0; k < experts.size(); ++k) assigned[experts[k]].push_back({r, weights[k]});
  }
  // Each expert runs on its tokens; results are summed per token in expert order.
  std::vector<std::vector<float>> results(c.n_routed_experts);
  ParallelFor(c.n_routed_experts, [&](int64_t e) {
    const auto& rows = assigned[e];
    if (rows.empty()) return;
    std::vector<float> in(rows.size() * h);
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy_n(x + rows[i].first * h, h, in.data() + i * h);
    results[e].resize(rows.size() * h);
    MlpForward(L.experts[e], in.data(), static_cast<int64_t>(rows.size()), results[e].data());
  });
  std::fill(y, y + n * h, 0.0f);
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const auto& rows = assigned[e];
    for (size_t i = 0; i < rows.size(); ++i) {
      float* dst = y + rows[i].first * h;
      const float* src = results[e].data() + i * h;
      for (int64_t d = 0; d < h; ++d) dst[d] += rows[i].second * src[d];
    }
  }
  if (L.has_shared) {
    std::vector<float> shared(n * h);
    MlpForward(L.shared, x, n, shared.data());
    for (int64_t i = 0; i < n * h; ++i) y[i] += shared[i];
  }
}

}  // namespace strata::cpu
