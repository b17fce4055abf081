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

// How a Sampler picks the next token from a row of logits, with its random draw already taken:
// what an engine needs to pick the token where the logits are (runtime::Sampler::Draw makes one;
// runtime::PickToken is the rule).
struct TokenDraw {
  float temperature = 0.0f;  // <= 0 (or top_k 1): greedy, the first maximum
  int64_t top_k = 0;         // 0: every token
  float top_p = 1.0f;
  double uniform = 0.0;  // in [0, 1), the sequence's next draw from its random stream
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

// The token `draw` picks from one row of logits: greedy takes the first maximum (as torch.argmax);
// otherwise the top_k largest logits (ties: the lower index first), softmax at `temperature`, the
// smallest prefix of them whose probability mass reaches top_p (at least one), and the first
// token of that prefix, in that order, at which the running mass exceeds uniform × its mass.
// The CPU reference of the GPU sampling kernel (kernels/sampling/sample.h).
int32_t PickToken(const TokenDraw& draw, std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  // Draw() then PickToken(): one step of this sequence's stream.
  int32_t Sample(std::span<const float> logits) { return PickToken(Draw(), logits); }
  // The next draw of this sequence (advances the random stream unless greedy): hand it to an
  // engine (SequenceInput::draw) to have the token picked where the logits are.
  TokenDraw Draw();
  // Greedy picks draw nothing from the random stream (temperature 0 or top_k 1).
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
