// The engine interface shared by the CPU and CUDA backends: one call runs a batch of sequences,
// each with new tokens appended after what its pages already hold (a prefill chunk, or one decode
// token), writes the new tokens' latent + k_pe into the pages, and returns logits.
//
// The caller owns page tables and page allocation (EnsureCapacity before Forward) and may fill
// pages from cache blocks (KvPool::ImportPage) to skip a cached prefix. An engine is not
// thread-safe: one Forward at a time. Sequences of one batch may share read-only prefix pages
// but never a page that the batch writes (positions >= start_pos).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "compute_nodes/model/model_config.h"
#include "compute_nodes/runtime/kv_pool.h"
#include "compute_nodes/runtime/sampler.h"

namespace strata::runtime {

enum class AttentionForm {
  kAuto,      // MHA over decompressed k/v for chunks of > 1 token, absorbed MQA for 1 token
  kMha,       // prefill form
  kAbsorbed,  // decode form (W_UK folded into q, W_UV applied after attention over latents)
};

struct SequenceInput {
  std::span<const int32_t> tokens;  // new tokens, positions start_pos .. start_pos + n - 1
  int64_t start_pos = 0;  // tokens already in the pages (a cached prefix or earlier steps)
  const PageTable* pages = nullptr;  // must cover start_pos + tokens.size() tokens
  bool all_logits = false;           // logits of every new token, else only of the last
  AttentionForm form = AttentionForm::kAuto;
  // Nonzero: names the sequence across calls, so an engine may keep state derived from its pages
  // between the chunks of a prefill (the CPU engine keeps the decompressed context). The caller
  // calls Engine::ForgetSequence when the pages' earlier positions change (swap-out) or the
  // sequence ends, and never reuses an id.
  uint64_t sequence_id = 0;
  // Set: the caller needs only the token this draw picks from the last row (PickToken), not the
  // logits. The engine sets SequenceOutput::token and may leave `logits` empty: the CUDA backend
  // then picks every token on the GPU and copies back 4 bytes per row instead of the logits.
  std::optional<TokenDraw> draw;
};

struct SequenceOutput {
  int64_t rows = 0;           // tokens.size() or 1
  std::vector<float> logits;  // [rows][vocab]; may be empty for an input with a draw
  int32_t token = -1;         // inputs with a draw: PickToken(draw, last row)
};

// For engines that return every logit: sets `token` of the outputs whose input has a draw.
void SetDrawnTokens(std::span<const SequenceInput> batch, int64_t vocab,
                    std::vector<SequenceOutput>* outputs);

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const model::ModelConfig& config() const = 0;
  virtual KvPool& kv_pool() = 0;
  // InvalidArgument on a token out of range, missing pages or positions past the model's limit.
  virtual absl::Status Forward(std::span<const SequenceInput> batch,
                               std::vector<SequenceOutput>* outputs) = 0;
  // Drops whatever the engine kept for SequenceInput::sequence_id `id` (nothing by default).
  virtual void ForgetSequence(uint64_t id) { (void)id; }
};

}  // namespace strata::runtime
