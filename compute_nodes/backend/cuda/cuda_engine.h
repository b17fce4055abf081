// The CUDA backend: the DeepSeek-V2/V3 forward of runtime::Engine on one GPU, in bf16 with fp32
// accumulation, as transformers runs the model in bf16.
//
// Weights are uploaded once (DeviceWeights); the latent KV lives in a DeviceKvPool. Per layer:
// RMSNorm fused with the residual add (kernels/norm_rope), the projections through cuBLAS
// (cublas_gemm.h) or, for steps of at most kSkinnyMaxRows rows, the bandwidth-bound skinny GEMM of
// kernels/moe_experts (step_util.h), YaRN RoPE (kernels/norm_rope), the new latent + k_pe rows
// written into their pages (on a side stream, beside the query projection), then attention:
//  - MHA form (prefill chunks): the sequence's whole context is gathered from its pages,
//    decompressed with kv_b_proj (one GEMM) and attended with kernels/prefill_attention (causal,
//    bottom-right: the new tokens are the last of the context). Head dims are zero-padded to the
//    kernel's 192 (q/k) and 128 (v), so the small test presets run the same code.
//  - Absorbed form (decode): q_nope · W_UK per head (a strided-batched GEMM; for few rows a
//    batched skinny GEMM over a transposed copy of W_UK) then
//    kernels/mla_decode over the latent pages (heads zero-padded to a multiple of 16), then
//    · W_UVᵀ per head. A multi-token absorbed chunk is one decode query per token.
// The MoE block (moe_block.h) routes with kernels/moe_router; for decode-sized token counts the
// routing stays on the device (kernels/moe_experts: per-expert slot groups, then grouped gate|up +
// SiLU×mul and down kernels that read each active expert's weights once); for larger counts it
// comes to the host (one sync per MoE layer) for one cuBLAS gate|up and down GEMM per expert. Then
// a weighted combine with the shared experts' output (computed on the side stream).
//
// A step whose rows are all decode rows (and whose MoE stays on the device) is captured into a
// CUDA graph keyed by its shape (decode_graph.h) and replayed on later steps of that shape; its
// per-step metadata goes through one fixed device buffer uploaded before the replay. Steps of at
// most kSkinnyMaxRows rows launch their kernels programmatically (kernels/common/pdl.h).
//
// Logits are fp32 from a bf16 lm_head GEMM, copied once into pinned memory and from there into
// the caller's output vectors. Not thread-safe (one Forward at a time, as every
// Engine); the pool's Export/ImportPage may be called between Forwards.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "common/block_key.h"
#include "compute_nodes/backend/cuda/cublas_gemm.h"
#include "compute_nodes/backend/cuda/device_kv_pool.h"
#include "compute_nodes/backend/cuda/device_weights.h"
#include "compute_nodes/runtime/engine.h"

namespace strata::model {
class TensorStore;
}

namespace strata::cuda {

struct CudaEngineOptions {
  int64_t num_pages = 256;
  int64_t block_tokens = 64;  // the MLA decode kernel's page size; nothing else is accepted
  int device = 0;
  bool cuda_graphs = true;              // capture and replay all-decode steps
  int64_t moe_device_max_tokens = 256;  // MoE routing on the device up to this many tokens
  bool moe_grouped = true;  // past that, grouped wgmma expert GEMMs (sm_90) instead of cuBLAS ones
  // One-row steps: the q|kv_a projection and a MoE layer's router logits form their norm's row
  // themselves (kernels::MoeNormIn), two norm launches less per layer; bit-identical either way.
  bool fold_norms = true;
  // Decode steps of up to 16 rows: each layer's RoPE-rows kernel runs beside q·W_UK instead of
  // ahead of it (LatentRowsParams::beside_previous); the same results either way.
  bool rope_beside_query = true;
  // Steps of up to this many rows run the side stream (the shared experts) below the main
  // stream's priority, so that the block scheduler starts the critical path's blocks first when
  // both wait for an SM; the main stream then runs at the device's highest priority. Larger steps
  // keep both at one priority (at 64 rows a low side stream measured 2.7 % slower). 0: both at the
  // default priority always. H100, v2-lite-shape, greedy GPU ms, 3 rounds in turns: batch 1
  // 2.320-2.323 against 2.328-2.332 without it; 4, 16 and 64 unchanged (docs/decode-notes.md).
  int64_t low_priority_side_rows = 1;
  // The KV pool registers a same-host cache server's shm arena with CUDA (in the background) and
  // imports cached blocks from it in place (DeviceKvPoolOptions::register_shared_regions).
  bool read_cache_in_place = true;
};

// What the last Forward read from device memory (for the decode benchmark's HBM floor).
struct StepStats {
  int64_t weight_bytes = 0;  // weights read: every dense tensor, the routed experts that had tokens
  int64_t kv_bytes = 0;      // latent pages read by attention (every layer)
  int64_t tokens = 0;
  bool graphed = false;          // the step ran as a CUDA graph (captured now or replayed)
  double device_ms = 0.0;        // GPU time of the step's work (events), without the logits copy
  double logits_copy_ms = 0.0;   // GPU -> pinned host copy of the logits (events)
  double host_enqueue_ms = 0.0;  // host: Forward's start until all work was enqueued
  double host_output_ms = 0.0;   // host: pinned logits into the callers' vectors
};

class CudaEngine final : public runtime::Engine {
 public:
  // Unavailable without a usable GPU; InvalidArgument for a model the kernels cannot run (page
  // size, latent 512 + rope 64, nope or v head dims above 128, more than 128 heads).
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(std::unique_ptr<DeviceWeights> weights,
                                                            const CudaEngineOptions& options);
  // Reads config.json and the safetensors of `dir`; with `fingerprint`, also hashes the checkpoint
  // as model::LoadModel does (the worker's model identity; reads every byte once more).
  static absl::StatusOr<std::unique_ptr<CudaEngine>> FromCheckpoint(
      const std::string& dir, const CudaEngineOptions& options,
      ModelFingerprint* fingerprint = nullptr);
  ~CudaEngine() override;

  const model::ModelConfig& config() const override { return weights_->config(); }
  DeviceKvPool& kv_pool() override { return *pool_; }
  // `outputs` may hold the previous step's outputs: their logits vectors are reused.
  absl::Status Forward(std::span<const runtime::SequenceInput> batch,
                       std::vector<runtime::SequenceOutput>* outputs) override;

  const DeviceWeights& weights() const { return *weights_; }
  const StepStats& last_step() const { return stats_; }
  cudaStream_t stream() const { return stream_; }
  // Decode graphs captured / replayed so far.
  int64_t graph_captures() const;
  int64_t graph_replays() const;

 private:
  struct Impl;
  CudaEngine() = default;

  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<DeviceKvPool> pool_;
  cudaStream_t stream_ = nullptr;
  Cublas blas_;
  std::unique_ptr<Impl> impl_;
  StepStats stats_;
};

// Whether this process sees a CUDA device (false, with the reason, when not).
absl::Status CudaAvailable();

}  // namespace strata::cuda
