#include "scheduler/cost_model.h"

#include <algorithm>
#include <cmath>

namespace strata::scheduler {

namespace {
// Feature scales so the normal equations stay well conditioned.
constexpr double kTokenScale = 1e-4;  // tokens → 10k tokens
constexpr double kPairScale = 1e-8;   // pairs → 100M pairs
}  // namespace

double PrefillModel::Predict(double new_tokens, double cached_tokens) const {
  if (new_tokens <= 0) return 0;
  return base_s + per_token_s * new_tokens +
         per_pair_s * new_tokens * (cached_tokens + new_tokens / 2);
}

double DecodeModel::StepSeconds(double batch, double context_tokens) const {
  return base_s + per_seq_s * batch + per_ctx_token_s * context_tokens;
}

double TierModel::LoadSeconds(const TierCounts& tiers, uint32_t block_tokens, bool remote) const {
  double seconds = 0;
  bool any = false;
  for (int t = 0; t < kNumTiers; ++t) {
    if (tiers[t] == 0) continue;
    any = true;
    double bandwidth = local_bandwidth[t];
    if (remote) bandwidth = std::min(bandwidth, network_bandwidth);
    const double bytes = double(tiers[t]) * block_tokens * kv_bytes_per_token;
    // Local GPU blocks are already in place: no copy.
    if (!remote && t == static_cast<int>(CacheTier::kGpu)) continue;
    seconds += bytes / bandwidth;
  }
  return any ? seconds + fixed_latency_s : 0;
}

PrefillCalibrator::PrefillCalibrator(PrefillModel prior, double forgetting)
    : prior_(prior), model_(prior), forgetting_(std::clamp(forgetting, 0.5, 1.0)) {}

void PrefillCalibrator::Observe(double new_tokens, double cached_tokens, double seconds) {
  if (!(new_tokens > 0) || !(seconds > 0) || !std::isfinite(seconds)) return;
  const std::array<double, 3> x{1.0, new_tokens * kTokenScale,
                                new_tokens * (cached_tokens + new_tokens / 2) * kPairScale};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xtx_[i][j] = xtx_[i][j] * forgetting_ + x[i] * x[j];
    xty_[i] = xty_[i] * forgetting_ + x[i] * seconds;
  }
  ++observations_;
  if (observations_ >= 8) Refit();
}

void PrefillCalibrator::Refit() {
  // Ridge towards the prior keeps the fit defined when observations do not vary enough (e.g.
  // every prompt of the same length): the solution is the prior plus the data's correction.
  constexpr double kRidge = 1e-3;
  const std::array<double, 3> prior{prior_.base_s, prior_.per_token_s / kTokenScale,
                                    prior_.per_pair_s / kPairScale};
  std::array<std::array<double, 4>, 3> m{};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) m[i][j] = xtx_[i][j] + (i == j ? kRidge : 0);
    m[i][3] = xty_[i] + kRidge * prior[i];
  }
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r) {
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    }
    if (std::abs(m[pivot][col]) < 1e-12) return;
    std::swap(m[col], m[pivot]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int c = col; c < 4; ++c) m[r][c] -= f * m[col][c];
    }
  }
  PrefillModel fitted;
  fitted.base_s = std::max(0.0, m[0][3] / m[0][0]);
  fitted.per_token_s = std::max(0.0, m[1][3] / m[1][1] * kTokenScale);
  fitted.per_pair_s = std::max(0.0, m[2][3] / m[2][2] * kPairScale);
  if (std::isfinite(fitted.base_s) && std::isfinite(fitted.per_token_s) &&
      std::isfinite(fitted.per_pair_s)) {
    model_ = fitted;
  }
}

}  // namespace strata::scheduler
