#include "compute_nodes/backend/cpu/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

namespace strata::cpu {

void Gemm(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda, b, ldb, beta, c, ldc);
}

void LinearForward(const model::Linear& w, const float* x, int64_t n, float* y, bool accumulate) {
  Gemm(/*trans_b=*/true, n, w.out, w.in, 1.0f, x, w.in, w.w.data(), w.in, accumulate ? 1.0f : 0.0f,
       y, w.out);
}

void RmsNorm(float* x, int64_t rows, int64_t dim, int64_t ld, const float* weight, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * ld;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(v[i]) * v[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int64_t i = 0; i < dim; ++i) v[i] = weight[i] * (v[i] * inv);
  }
}

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t workers = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  auto run = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(run);
  run();
  for (auto& t : threads) t.join();
}

namespace {
// Matches transformers' _compute_yarn_parameters (fp32 tensors, truncated correction range).
std::vector<float> YarnInvFreq(const model::ModelConfig& c) {
  const int64_t dim = c.qk_rope_head_dim;
  const double base = c.rope.theta;
  const double factor = c.rope.factor;
  const double orig = c.rope.original_max_position_embeddings > 0
                          ? static_cast<double>(c.rope.original_max_position_embeddings)
                          : static_cast<double>(c.max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(c.rope.beta_fast);
  double high = correction_dim(c.rope.beta_slow);
  if (c.rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq =
        std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}
}  // namespace

Rope::Rope(const model::ModelConfig& c)
    : dim_(c.qk_rope_head_dim),
      layout_(c.rope_layout),
      attention_factor_(static_cast<float>(c.RopeAttentionFactor())) {
  if (c.rope.yarn) {
    inv_freq_ = YarnInvFreq(c);
  } else {
    inv_freq_.resize(dim_ / 2);
    for (int64_t i = 0; i < dim_ / 2; ++i) {
      inv_freq_[i] = 1.0f / std::pow(static_cast<float>(c.rope.theta),
                                     static_cast<float>(2 * i) / static_cast<float>(dim_));
    }
  }
}

void Rope::Apply(float* x, int64_t position) const {
  const int64_t half = dim_ / 2;
  float tmp[1024];
  // (first, second) lanes of pair i, in input and output order.
  for (int64_t i = 0; i < half; ++i) {
    // transformers: freqs = inv_freq (fp32) · position (fp32), then cos/sin in fp32.
    const float f = inv_freq_[i] * static_cast<float>(position);
    const float cs = static_cast<float>(std::cos(static_cast<double>(f))) * attention_factor_;
    const float sn = static_cast<float>(std::sin(static_cast<double>(f))) * attention_factor_;
    float a, b;
    if (layout_ == model::RopeLayout::kHalves) {
      a = x[i];
      b = x[i + half];
    } else {  // interleaved input pairs (2i, 2i+1)
      a = x[2 * i];
      b = x[2 * i + 1];
    }
    const float ra = a * cs - b * sn;
    const float rb = b * cs + a * sn;
    if (layout_ == model::RopeLayout::kInterleaved) {
      tmp[2 * i] = ra;
      tmp[2 * i + 1] = rb;
    } else {  // halves output (also the de-interleaved V3 form)
      tmp[i] = ra;
      tmp[i + half] = rb;
    }
  }
  std::copy(tmp, tmp + dim_, x);
}

void MlpForward(const model::Mlp& mlp, const float* x, int64_t n, float* y) {
  const int64_t inter = mlp.gate.out;
  std::vector<float> g(n * inter), u(n * inter);
  LinearForward(mlp.gate, x, n, g.data());
  LinearForward(mlp.up, x, n, u.data());
  for (int64_t i = 0; i < n * inter; ++i) {
    const float v = g[i];
    g[i] = (v / (1.0f + std::exp(-v))) * u[i];
  }
  LinearForward(mlp.down, g.data(), n, y);
}

namespace {
// Indices of the k largest values, ties to the lower index (deterministic).
std::vector<int32_t> TopK(const std::vector<float>& v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(k);
  return idx;
}
}  // namespace

void RouteToken(const model::ModelConfig& c, const float* logits, const float* bias,
                std::vector<int32_t>* experts, std::vector<float>* weights) {
  const int64_t e_count = c.n_routed_experts;
  std::vector<float> scores(e_count);
  if (c.scoring_func == model::ScoringFunc::kSoftmax) {
    const float mx = *std::max_element(logits, logits + e_count);
    double sum = 0;
    for (int64_t e = 0; e < e_count; ++e) sum += std::exp(static_cast<double>(logits[e] - mx));
    for (int64_t e = 0; e < e_count; ++e) {
      scores[e] = static_cast<float>(std::exp(static_cast<double>(logits[e] - mx)) / sum);
    }
  } else {
    for (int64_t e = 0; e < e_count; ++e) {
      scores[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[e]))));
    }
  }
  std::vector<float> choice = scores;
  if (c.topk_method == model::TopkMethod::kNoauxTc && bias != nullptr) {
    for (int64_t e = 0; e < e_count; ++e) choice[e] += bias[e];
  }
  if (c.topk_method != model::TopkMethod::kGreedy && c.n_group > 1) {
    const int64_t per = e_count / c.n_group;
    std::vector<float> group_scores(c.n_group);
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<float> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      if (c.topk_method == model::TopkMethod::kNoauxTc) {  // sum of the group's top two
        std::partial_sort(members.begin(), members.begin() + 2, members.end(), std::greater<>());
        group_scores[g] = members[0] + members[1];
      } else {  // group_limited_greedy: the group's best
        group_scores[g] = *std::max_element(members.begin(), members.end());
      }
    }
    std::vector<bool> keep(c.n_group, false);
    for (int32_t g : TopK(group_scores, c.topk_group)) keep[g] = true;
    // transformers fills experts of dropped groups with 0.0 (not -inf).
    for (int64_t e = 0; e < e_count; ++e) {
      if (!keep[e / per]) choice[e] = 0.0f;
    }
  }
  *experts = TopK(choice, c.num_experts_per_tok);
  weights->resize(experts->size());
  double sum = 0;
  for (size_t i = 0; i < experts->size(); ++i) {
    (*weights)[i] = scores[(*experts)[i]];
    sum += (*weights)[i];
  }
  // As transformers 5.17: DeepSeek-V3 normalizes (norm_topk_prob) then scales; its DeepSeek-V2
  // always scales and ignores norm_topk_prob (every released V2 config has it false).
  if (c.type == model::ModelType::kDeepseekV3 && c.norm_topk_prob) {
    for (float& w : *weights) w = static_cast<float>(w / (sum + 1e-20));
  }
  for (float& w : *weights) w *= static_cast<float>(c.routed_scaling_factor);
}

}  // namespace strata::cpu
