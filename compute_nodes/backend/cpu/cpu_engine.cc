#include "compute_nodes/backend/cpu/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/strings.h"

namespace strata::cpu {

using model::ModelConfig;
using runtime::SequenceInput;

CpuEngine::CpuEngine(std::shared_ptr<const model::ModelWeights> weights, int64_t num_pages,
                     int64_t block_tokens, runtime::KvPrecision kv_precision)
    : weights_(std::move(weights)),
      pool_(runtime::KvLayout{weights_->config.num_hidden_layers, block_tokens,
                              weights_->config.kv_lora_rank, weights_->config.qk_rope_head_dim},
            num_pages, kv_precision),
      rope_(weights_->config) {}

absl::Status CpuEngine::Forward(std::span<const SequenceInput> batch,
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
    // Prefill chunks decompress their pages once; then every (sequence, head) pair is one task.
    std::vector<bool> absorbed(batch.size());
    std::vector<std::vector<float>> kv(batch.size());
    for (size_t s = 0; s < batch.size(); ++s) {
      const SequenceInput& in = batch[s];
      absorbed[s] = in.form == runtime::AttentionForm::kAbsorbed ||
                    (in.form == runtime::AttentionForm::kAuto && in.tokens.size() == 1);
      if (!absorbed[s]) kv[s] = Decompress(l, in);
    }
    ParallelFor(static_cast<int64_t>(batch.size()) * heads, [&](int64_t task) {
      const size_t s = static_cast<size_t>(task / heads);
      const SequenceInput& in = batch[s];
      AttendHead(l, in, absorbed[s], kv[s], q.data() + first_row[s] * heads * qk,
                 static_cast<int64_t>(in.tokens.size()), task % heads,
                 attn.data() + first_row[s] * heads * c.v_head_dim);
    });
    LinearForward(L.o_proj, attn.data(), n, x.data(), /*accumulate=*/true);

    std::copy(x.begin(), x.end(), xn.begin());
    RmsNorm(xn.data(), n, h, h, L.post_attention_norm.data(), c.rms_norm_eps);
    FeedForward(l, xn.data(), n, ffn.data());
    for (int64_t i = 0; i < n * h; ++i) x[i] += ffn[i];
  }
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
  return absl::OkStatus();
}

// The sequence's context decompressed for the MHA form: kv[page][B][heads][nope + v].
std::vector<float> CpuEngine::Decompress(int64_t layer, const SequenceInput& in) const {
  const ModelConfig& c = weights_->config;
  const model::LayerWeights& L = weights_->layers[layer];
  const int64_t b = pool_.layout().block_tokens;
  const int64_t ctx = in.start_pos + static_cast<int64_t>(in.tokens.size());
  const int64_t n_pages = (ctx + b - 1) / b;
  const int64_t per_token = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim);
  std::vector<float> kv(n_pages * b * per_token);
  for (int64_t p = 0; p < n_pages; ++p) {
    const int64_t valid = std::min(b, ctx - p * b);
    LinearForward(L.kv_b_proj, pool_.Latent(in.pages->pages[p], layer), valid,
                  kv.data() + p * b * per_token);
  }
  return kv;
}

// Head `hd` of one sequence's attention for its `rows` new tokens (positions start_pos..).
// q: [rows][heads][qk] (RoPE applied); out: [rows][heads][v_head_dim]. Pages are merged by online
// softmax (running max and sum), which is exact.
void CpuEngine::AttendHead(int64_t layer, const SequenceInput& in, bool absorbed,
                           const std::vector<float>& kv, const float* q, int64_t rows, int64_t hd,
                           float* out) const {
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
  {
    const int64_t value_dim = absorbed ? kvr : vd;
    // Query for this head: [rows][dq], where the score is q · [key_nope_or_latent | k_pe].
    const int64_t dq = absorbed ? kvr : nope;
    std::vector<float> qh(rows * dq), qpe(rows * rope);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = q + (r * heads + hd) * qk;
      std::copy_n(src + nope, rope, qpe.data() + r * rope);
      if (!absorbed) std::copy_n(src, nope, qh.data() + r * dq);
    }
    if (absorbed) {
      // q_lat[r] = q_nope[r] · W_UK[hd]  ([nope] × [nope][kvr]).
      std::vector<float> qn(rows * nope);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(q + (r * heads + hd) * qk, nope, qn.data() + r * nope);
      }
      Gemm(false, rows, kvr, nope, 1.0f, qn.data(), nope, L.kv_b_proj.w.data() + hd * kv_row * kvr,
           kvr, 0.0f, qh.data(), kvr);
    }
    // Online softmax over pages: running max m, running sum l, accumulator acc.
    std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), lsum(rows, 0.0f);
    std::vector<float> acc(rows * value_dim, 0.0f), s(rows * b), vals(b * value_dim), keys(b * dq);
    for (int64_t p = 0; p < n_pages; ++p) {
      const int32_t page = in.pages->pages[p];
      const int64_t valid = std::min(b, ctx - p * b);
      const float* vsrc;
      int64_t vld;
      const float* ksrc;
      int64_t kld;
      if (absorbed) {
        ksrc = pool_.Latent(page, layer);
        kld = kvr;
        vsrc = ksrc;
        vld = kvr;
      } else {
        const float* base = kv.data() + (p * b * heads + hd) * kv_row;
        ksrc = base;
        kld = heads * kv_row;
        vsrc = base + nope;
        vld = heads * kv_row;
      }
      // s = qh · keysᵀ + qpe · k_peᵀ, scaled.
      Gemm(true, rows, valid, dq, scale, qh.data(), dq, ksrc, kld, 0.0f, s.data(), b);
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
        float* ar = acc.data() + r * value_dim;
        for (int64_t d = 0; d < value_dim; ++d) ar[d] *= corr;
      }
      Gemm(false, rows, value_dim, valid, 1.0f, s.data(), b, vsrc, vld, 1.0f, acc.data(),
           value_dim);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* ar = acc.data() + r * value_dim;
      const float inv = 1.0f / lsum[r];
      for (int64_t d = 0; d < value_dim; ++d) ar[d] *= inv;
    }
    if (absorbed) {
      // out = o_lat · W_UV[hd]ᵀ ([kvr] × [vd][kvr]ᵀ).
      std::vector<float> o(rows * vd);
      Gemm(true, rows, vd, kvr, 1.0f, acc.data(), kvr,
           L.kv_b_proj.w.data() + (hd * kv_row + nope) * kvr, kvr, 0.0f, o.data(), vd);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(o.data() + r * vd, vd, out + (r * heads + hd) * vd);
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(acc.data() + r * vd, vd, out + (r * heads + hd) * vd);
      }
    }
  }
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
