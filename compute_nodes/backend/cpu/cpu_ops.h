// fp32 building blocks of the CPU backend. GEMMs go through CBLAS (OpenBLAS, itself threaded);
// ParallelFor spreads independent work (heads, experts) over hardware threads.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "compute_nodes/model/model_config.h"
#include "compute_nodes/model/weights.h"

namespace strata::cpu {

// y[n][out] = x[n][in] · Wᵀ (+ y when accumulate).
void LinearForward(const model::Linear& w, const float* x, int64_t n, float* y,
                   bool accumulate = false);
// C[m][n] = alpha · A[m][k] · B(ᵀ) + beta · C, row-major with leading dimensions.
void Gemm(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// In place: x[r] = x[r] / sqrt(mean(x[r]²) + eps) · weight, rows of `dim` with stride `ld`.
void RmsNorm(float* x, int64_t rows, int64_t dim, int64_t ld, const float* weight, double eps);

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

// RoPE tables computed as transformers does (fp32 inv_freq, fp32 position·freq, cos/sin then
// times the YaRN attention factor), applied in the lane layout of the config.
class Rope {
 public:
  explicit Rope(const model::ModelConfig& config);
  // Rotates x[dim] in place for `position`.
  void Apply(float* x, int64_t position) const;
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  int64_t dim_;
  model::RopeLayout layout_;
  float attention_factor_;
  std::vector<float> inv_freq_;
};

// y = down(silu(gate(x)) * up(x)) for n rows.
void MlpForward(const model::Mlp& mlp, const float* x, int64_t n, float* y);

// Routed-expert choice for one token: indices and weights (already scaled).
void RouteToken(const model::ModelConfig& c, const float* logits, const float* bias,
                std::vector<int32_t>* experts, std::vector<float>* weights);

}  // namespace strata::cpu
