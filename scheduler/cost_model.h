// Cost model of the `strata` policy: how long a prefill takes, how long loading cached blocks
// takes, how long a decode step takes. All times in seconds.
//
//   prefill(n_new, n_cached) = a + b·n_new + c·n_new·(n_cached + n_new/2)
//
// The c term is causal attention: each new token attends to every cached token and, on average,
// to half of the other new ones, so a long cached context still costs compute. The model is linear
// in (a, b, c), so PrefillCalibrator fits it online by exponentially weighted least squares on
// the (n_new, n_cached, seconds) reports of workers.
//
// Thread safety: the models are values; PrefillCalibrator is not thread-safe (callers lock).
#pragma once

#include <array>
#include <cstdint>

#include "scheduler/types.h"

namespace strata::scheduler {

struct PrefillModel {
  double base_s = 0.02;
  double per_token_s = 25e-6;
  double per_pair_s = 1.6e-9;  // per (new token, attended token) pair

  double Predict(double new_tokens, double cached_tokens) const;
};

struct DecodeModel {
  double base_s = 0.012;          // weights read + launch, per step
  double per_seq_s = 0.00008;     // per sequence in the batch
  double per_ctx_token_s = 2e-9;  // KV read, per context token of the batch

  double StepSeconds(double batch, double context_tokens) const;
};

// Bandwidths in bytes per second; KV size per token decides bytes per block.
struct TierModel {
  double kv_bytes_per_token = 70272;  // DeepSeek-V3 MLA, bf16: 61 layers × 576 × 2 B
  std::array<double, kNumTiers> local_bandwidth{400e9, 50e9, 12e9};  // gpu, dram, ssd
  double network_bandwidth = 100e9;  // between hosts (8 × 400 Gb/s NICs ≈ 200 GB/s; half usable)
  double fixed_latency_s = 0.0005;   // per load, any size

  // Seconds to bring `tiers` blocks of `block_tokens` tokens into the GPU; over the network
  // when `remote`, limited by the slower of the source tier and the network.
  double LoadSeconds(const TierCounts& tiers, uint32_t block_tokens, bool remote) const;
};

class PrefillCalibrator {
 public:
  // `forgetting` in (0, 1]: weight kept by old observations per new one.
  explicit PrefillCalibrator(PrefillModel prior = {}, double forgetting = 0.995);

  void Observe(double new_tokens, double cached_tokens, double seconds);
  // The fitted model once enough varied observations exist, else the prior.
  PrefillModel Model() const { return model_; }
  uint64_t observations() const { return observations_; }

 private:
  void Refit();

  PrefillModel prior_;
  PrefillModel model_;
  double forgetting_;
  uint64_t observations_ = 0;
  // Normal equations of the weighted least squares, features scaled to O(1).
  std::array<std::array<double, 3>, 3> xtx_{};
  std::array<double, 3> xty_{};
};

}  // namespace strata::scheduler
