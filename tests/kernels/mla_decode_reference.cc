#include "tests/kernels/mla_decode_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata::kernels {

void MlaDecodeReference(const MlaDecodeReferenceInputs& in, std::vector<float>& out,
                        std::vector<float>& lse) {
  constexpr int kD = 576, kV = 512, kPage = 64;
  out.assign(static_cast<size_t>(in.batch) * in.num_heads_q * kV, 0.f);
  lse.assign(static_cast<size_t>(in.batch) * in.num_heads_q,
             -std::numeric_limits<float>::infinity());
  std::vector<double> scores;
  std::vector<double> acc(kV);
  for (int b = 0; b < in.batch; ++b) {
    const int len = std::min((*in.seqlens)[b], in.max_pages_per_seq * kPage);
    if (len <= 0) continue;
    for (int h = 0; h < in.num_heads_q; ++h) {
      const float* q = in.q->data() + (static_cast<size_t>(b) * in.num_heads_q + h) * kD;
      scores.assign(len, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < len; ++t) {
        const int page =
            (*in.block_table)[static_cast<size_t>(b) * in.max_pages_per_seq + t / kPage];
        const float* k = in.kv->data() + (static_cast<size_t>(page) * kPage + t % kPage) * kD;
        float dot = 0.f;
        for (int d = 0; d < kD; ++d) dot += q[d] * k[d];
        scores[t] = static_cast<double>(dot) * in.softmax_scale;
        mx = std::max(mx, scores[t]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t < len; ++t) {
        const double w = std::exp(scores[t] - mx);
        sum += w;
        const int page =
            (*in.block_table)[static_cast<size_t>(b) * in.max_pages_per_seq + t / kPage];
        const float* v = in.kv->data() + (static_cast<size_t>(page) * kPage + t % kPage) * kD;
        for (int d = 0; d < kV; ++d) acc[d] += w * v[d];
      }
      float* o = out.data() + (static_cast<size_t>(b) * in.num_heads_q + h) * kV;
      for (int d = 0; d < kV; ++d) o[d] = static_cast<float>(acc[d] / sum);
      lse[static_cast<size_t>(b) * in.num_heads_q + h] = static_cast<float>(mx + std::log(sum));
    }
  }
}

}  // namespace strata::kernels
