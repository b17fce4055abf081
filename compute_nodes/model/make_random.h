// Random-weight DeepSeek-V2/V3 checkpoints in Hugging Face format (`strata model make-random`).
//
// Deterministic for a seed: every tensor is drawn from its own counter-based stream seeded by
// (seed, tensor name), so the bytes do not depend on thread count or tensor order. Weights are
// stored in bf16; scales keep activations O(1) so logits are well separated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute_nodes/model/model_config.h"

namespace strata::model {

// tiny, small-v3, small-v2, v2-lite-shape, v3-shape-4l.
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

struct MakeRandomOptions {
  uint64_t seed = 0;
  size_t shard_bytes = size_t{2} << 30;  // shard above 2 GiB, as transformers does by default
  std::string tokenizer_dir;             // empty: strata::DeepSeekV3TokenizerDir()
  bool require_tokenizer = false;        // else a missing tokenizer is only a warning
};

// Writes config.json, safetensors (sharded with an index above shard_bytes), generation_config.json
// and the tokenizer files into `dir` (created if needed).
absl::Status MakeRandomCheckpoint(const ModelConfig& config, const MakeRandomOptions& options,
                                  const std::string& dir);

}  // namespace strata::model
