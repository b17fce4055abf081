// Token sampling: greedy (temperature 0), temperature, top-k, top-p, seeded; stop conditions.
//
// A Sampler belongs to one sequence (its RNG advances per draw) and is not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace strata::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: all
  float top_p = 1.0f;
  uint64_t seed = 0;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
  // Hook for stop strings: text of the generated ids so far (set once a tokenizer is loaded).
  // Without it, stop_strings are ignored.
  std::function<std::string(std::span<const int32_t>)> detokenize;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t Sample(std::span<const float> logits);
  // Sample() picks the first maximum and draws nothing from the random stream (temperature 0 or
  // top_k 1): an engine's greedy token (SequenceInput::greedy_only) is the same choice.
  bool greedy() const { return params_.temperature <= 0.0f || params_.top_k == 1; }
  // Advances the random stream exactly as one Sample() would, without sampling: a decode worker
  // continuing a sequence whose first token was drawn elsewhere (the prefill worker) stays on the
  // same stream as a single worker would.
  void SkipOne();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

enum class StopReason { kNone, kMaxTokens, kStopId, kStopString };

// Whether generation ends after `generated` (the newest id last).
StopReason CheckStop(const SamplingParams& params, std::span<const int32_t> generated);

}  // namespace strata::runtime
