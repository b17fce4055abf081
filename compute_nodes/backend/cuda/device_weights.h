// The model's weights in GPU memory, bf16, uploaded once: one device allocation holding every
// tensor of CheckpointTensors(config) in its order, so each expert's gate_proj and up_proj rows are
// adjacent (one fused [2I][H] gate|up GEMM), so are a layer's q_proj (q_a_proj) and kv_a_proj
// rows, and the experts of a layer are equally spaced.
//
// Sources: a checkpoint directory (bf16 tensors are copied as they are; fp32/fp16 are rounded to
// bf16; experts stored fused as transformers 5.x keeps them, gate_up_proj [E, 2I, H] and
// down_proj [E, H, I], are sliced), or random values drawn on the GPU (benchmarks; not the bytes
// of `strata model make-random`). Immutable after Create; owned by one engine.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute_nodes/model/model_config.h"

namespace strata::model {
class TensorStore;
}

namespace strata::cuda {

struct DeviceLinear {
  const __nv_bfloat16* w = nullptr;  // [out][in]
  int64_t out = 0, in = 0;
  int64_t bytes() const { return out * in * 2; }
};

struct DeviceLayer {
  const __nv_bfloat16* input_norm = nullptr;
  const __nv_bfloat16* post_attention_norm = nullptr;
  DeviceLinear q_proj, q_a_proj, q_b_proj;  // q_proj without q_lora_rank
  const __nv_bfloat16* q_a_norm = nullptr;
  DeviceLinear kv_a_proj, kv_b_proj, o_proj;
  // q_proj (or q_a_proj) and kv_a_proj as one linear: their rows are adjacent.
  DeviceLinear q_kv_a;
  const __nv_bfloat16* kv_a_norm = nullptr;
  bool moe = false;
  DeviceLinear gate_up, down;              // dense MLP: gate|up [2I][H], down [H][I]
  DeviceLinear router;                     // [E][H]
  const float* score_bias = nullptr;       // [E] (fp32 copy) or null
  const __nv_bfloat16* experts = nullptr;  // expert e: gate|up at e * expert_stride, then down
  int64_t expert_stride = 0;               // elements
  bool has_shared = false;
  DeviceLinear shared_gate_up, shared_down;
  int64_t attention_bytes() const;
};

class DeviceWeights {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> FromCheckpoint(
      const model::ModelConfig& config, const model::TensorStore& store);
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Random(const model::ModelConfig& config,
                                                               uint64_t seed);
  ~DeviceWeights();

  const model::ModelConfig& config() const { return config_; }
  const __nv_bfloat16* embed() const { return embed_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const __nv_bfloat16* final_norm() const { return final_norm_; }
  const DeviceLinear& lm_head() const { return lm_head_; }
  int64_t total_bytes() const { return total_bytes_; }

 private:
  explicit DeviceWeights(model::ModelConfig config) : config_(std::move(config)) {}
  absl::Status Map();  // sets the pointers above from the arena

  model::ModelConfig config_;
  void* arena_ = nullptr;
  float* bias_arena_ = nullptr;
  int64_t total_bytes_ = 0;
  std::vector<std::pair<std::string, __nv_bfloat16*>> tensors_;  // name -> device pointer
  const __nv_bfloat16* embed_ = nullptr;
  std::vector<DeviceLayer> layers_;
  const __nv_bfloat16* final_norm_ = nullptr;
  DeviceLinear lm_head_;
};

}  // namespace strata::cuda
