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

}  // namespace strata::kernels
