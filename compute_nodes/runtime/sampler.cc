#include "compute_nodes/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "compute_nodes/runtime/engine.h"

namespace strata::runtime {

void SetDrawnTokens(std::span<const SequenceInput> batch, int64_t vocab,
                    std::vector<SequenceOutput>* outputs) {
  for (size_t s = 0; s < batch.size(); ++s) {
    SequenceOutput& out = (*outputs)[s];
    if (!batch[s].draw || out.rows == 0) continue;
    const float* last = out.logits.data() + (out.rows - 1) * vocab;
    out.token = PickToken(*batch[s].draw, {last, static_cast<size_t>(vocab)});
  }
}

TokenDraw Sampler::Draw() {
  TokenDraw d{.temperature = params_.temperature, .top_k = params_.top_k, .top_p = params_.top_p};
  // One draw per sampled token. uniform_real_distribution(0, 1) then × mass is bit for bit what
  // uniform_real_distribution(0, mass) returns (g × (mass − 0) + 0), the stream of earlier
  // versions.
  if (!d.greedy()) d.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return d;
}

void Sampler::SkipOne() { (void)Draw(); }

int32_t PickToken(const TokenDraw& draw, std::span<const float> logits) {
  const int64_t v = static_cast<int64_t>(logits.size());
  if (draw.greedy()) {
    // Greedy: the first maximum, as torch.argmax.
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // (logit, index) pairs, so the sort touches contiguous memory: descending, ties by index.
  std::vector<std::pair<float, int32_t>> order(v);
  for (int64_t i = 0; i < v; ++i) order[i] = {logits[i], static_cast<int32_t>(i)};
  const auto before = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const int64_t k = draw.top_k > 0 ? std::min(draw.top_k, v) : v;
  if (k == v) {
    std::sort(order.begin(), order.end(), before);
  } else {
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  }
  std::vector<double> p(k);
  const double mx = order[0].first;
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((order[i].first - mx) / draw.temperature);
    sum += p[i];
  }
  // top-p: the smallest prefix (by probability) whose mass reaches top_p; always >= 1 token.
  int64_t keep = k;
  if (draw.top_p < 1.0f) {
    double mass = 0;
    for (int64_t i = 0; i < k; ++i) {
      mass += p[i] / sum;
      if (mass >= draw.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[i];
  double x = draw.uniform * kept;
  for (int64_t i = 0; i < keep; ++i) {
    x -= p[i];
    if (x < 0) return order[i].second;
  }
  return order[keep - 1].second;
}

StopReason CheckStop(const SamplingParams& params, std::span<const int32_t> generated) {
  if (generated.empty()) return StopReason::kNone;
  if (std::find(params.stop_ids.begin(), params.stop_ids.end(), generated.back()) !=
      params.stop_ids.end()) {
    return StopReason::kStopId;
  }
  if (!params.stop_strings.empty() && params.detokenize) {
    const std::string text = params.detokenize(generated);
    for (const auto& s : params.stop_strings) {
      if (!s.empty() && text.find(s) != std::string::npos) return StopReason::kStopString;
    }
  }
  if (static_cast<int64_t>(generated.size()) >= params.max_tokens) return StopReason::kMaxTokens;
  return StopReason::kNone;
}

}  // namespace strata::runtime
