#include "tests/kernels/prefill_attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata::kernels {

void PrefillAttentionReference(const float* q, int q_stride, const float* k, int k_stride,
                               const float* v, int v_stride, int q_len, int k_len, bool causal,
                               float scale, std::vector<double>& out, std::vector<double>& lse) {
  constexpr int kQk = 192, kV = 128;
  out.assign(static_cast<size_t>(q_len) * kV, 0.0);
  lse.assign(q_len, -std::numeric_limits<double>::infinity());
  std::vector<double> s(std::max(k_len, 1));
  for (int i = 0; i < q_len; ++i) {
    const int visible = causal ? std::min(k_len, std::max(0, i + k_len - q_len + 1)) : k_len;
    if (visible == 0) continue;
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < visible; ++j) {
      double dot = 0;
      for (int d = 0; d < kQk; ++d) {
        dot += static_cast<double>(q[static_cast<size_t>(i) * q_stride + d]) *
               k[static_cast<size_t>(j) * k_stride + d];
      }
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < visible; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    double* o = out.data() + static_cast<size_t>(i) * kV;
    for (int j = 0; j < visible; ++j) {
      const double w = s[j] / sum;
      for (int d = 0; d < kV; ++d) o[d] += w * v[static_cast<size_t>(j) * v_stride + d];
    }
    lse[i] = mx + std::log(sum);
  }
}

}  // namespace strata::kernels
