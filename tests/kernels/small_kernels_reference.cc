#include "tests/kernels/small_kernels_reference.h"

#include <cmath>
#include <cstring>

namespace strata::kernels {
namespace {
float Round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}
}  // namespace

void RmsNormReference(const std::vector<float>& x, const std::vector<float>* residual,
                      const std::vector<float>& weight, int rows, int dim, float eps,
                      std::vector<float>& h, std::vector<float>& out) {
  h.assign(static_cast<size_t>(rows) * dim, 0.f);
  out.assign(h.size(), 0.f);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) {
      const size_t idx = static_cast<size_t>(r) * dim + i;
      h[idx] = residual != nullptr ? Round(x[idx] + (*residual)[idx]) : x[idx];
      ss += static_cast<double>(h[idx]) * h[idx];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) {
      const size_t idx = static_cast<size_t>(r) * dim + i;
      out[idx] = Round(weight[i] * Round(h[idx] * inv));
    }
  }
}

void SiluMulReference(const std::vector<float>& gate, const std::vector<float>& up,
                      std::vector<float>& out) {
  out.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = gate[i];
    out[i] = Round(g / (1.f + std::exp(-g)) * up[i]);
  }
}

void PoolLayerToPayloadBf16(const uint16_t* pool_rows, int block_tokens, int latent_dim,
                            int rope_dim, uint16_t* payload_layer) {
  const int row = latent_dim + rope_dim;
  for (int t = 0; t < block_tokens; ++t) {
    std::memcpy(payload_layer + static_cast<size_t>(t) * latent_dim,
                pool_rows + static_cast<size_t>(t) * row, latent_dim * 2);
    std::memcpy(payload_layer + static_cast<size_t>(block_tokens) * latent_dim +
                    static_cast<size_t>(t) * rope_dim,
                pool_rows + static_cast<size_t>(t) * row + latent_dim, rope_dim * 2);
  }
}

void MoeExpertReference(const std::vector<float>& weights, int64_t expert_stride, int e,
                        int hidden, int inter, const float* x, std::vector<float>& act,
                        std::vector<float>& out) {
  const float* gate = weights.data() + e * expert_stride;
  const float* up = gate + static_cast<int64_t>(inter) * hidden;
  const float* down = up + static_cast<int64_t>(inter) * hidden;
  act.assign(inter, 0.f);
  out.assign(hidden, 0.f);
  for (int i = 0; i < inter; ++i) {
    double g = 0, u = 0;
    for (int k = 0; k < hidden; ++k) {
      g += static_cast<double>(gate[static_cast<int64_t>(i) * hidden + k]) * x[k];
      u += static_cast<double>(up[static_cast<int64_t>(i) * hidden + k]) * x[k];
    }
    const float gb = Round(static_cast<float>(g)), ub = Round(static_cast<float>(u));
    act[i] = Round(gb / (1.f + std::exp(-gb)) * ub);
  }
  for (int j = 0; j < hidden; ++j) {
    double acc = 0;
    for (int i = 0; i < inter; ++i) {
      acc += static_cast<double>(down[static_cast<int64_t>(j) * inter + i]) * act[i];
    }
    out[j] = Round(static_cast<float>(acc));
  }
}

}  // namespace strata::kernels
