// The CPU backend: fp32 DeepSeek-V2/V3 forward over the paged latent KV pool.
//
// Prefill chunks attend in MHA form over k/v decompressed page by page from the latents, merging
// pages by online softmax (running max and log-sum-exp), which is exact. Decode steps attend in
// the absorbed MQA form directly over the latent pages. Both use the softmax scale
// 1/sqrt(qk_head_dim) · mscale². Not thread-safe (one Forward at a time); it threads internally.
#pragma once

#include <memory>

#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/runtime/engine.h"

namespace strata::cpu {

class CpuEngine final : public runtime::Engine {
 public:
  CpuEngine(std::shared_ptr<const model::ModelWeights> weights, int64_t num_pages,
            int64_t block_tokens = 64,
            runtime::KvPrecision kv_precision = runtime::KvPrecision::kF32);

  const model::ModelConfig& config() const override { return weights_->config; }
  runtime::HostKvPool& kv_pool() override { return pool_; }
  absl::Status Forward(std::span<const runtime::SequenceInput> batch,
                       std::vector<runtime::SequenceOutput>* outputs) override;

 private:
  struct Token {
    int64_t seq;       // index in the batch
    int64_t position;  // absolute position
  };
  std::vector<float> Decompress(int64_t layer, const runtime::SequenceInput& in) const;
  void AttendHead(int64_t layer, const runtime::SequenceInput& in, bool absorbed,
                  const std::vector<float>& kv, const float* q, int64_t rows, int64_t hd,
                  float* out) const;
  void FeedForward(int64_t layer, const float* x, int64_t n, float* y);

  std::shared_ptr<const model::ModelWeights> weights_;
  runtime::HostKvPool pool_;
  Rope rope_;
};

}  // namespace strata::cpu
