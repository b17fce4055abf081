// The MoE feed-forward block of the CUDA backend, for one layer at a time:
//
//   router GEMM (fp32 logits) -> kernels/moe_router (top-k experts + weights) -> routed experts
//   -> shared experts (fused gate|up GEMM, SiLU×mul, down GEMM); the weighted sum of the
//   experts' rows + the shared experts' is left to the next RMSNorm (kernels/norm_rope/rms_norm.h,
//   RmsNormMoeSum): one kernel less per layer
//
// Three ways to run the routed experts, picked by the token count (the host knows n, not the
// routing):
//  - device path (n <= max_device_tokens): kernels/moe_experts aligns the routing into per-expert
//    slot groups and runs the grouped gate|up + SiLU + down kernels; sizes stay on the device, no
//    host sync, so the block can be captured in a CUDA graph. For one token (batch-1 decode) the
//    router's warp writes the alignment itself: one launch less on the step's critical path.
//  - grouped path (larger n, prefill, on sm_90 unless turned off): the same alignment, then
//    kernels/moe_experts/moe_grouped.h: the slots' rows gathered per expert and two grouped wgmma
//    GEMMs (SiLU×mul in the first one's epilogue); also no host sync.
//  - host path (larger n elsewhere): the routing is copied to the host (one stream sync per layer)
//    and each expert with tokens gets one fused gate|up and one down cuBLAS GEMM.
//
// Lifecycle per step: Reserve(n) (buffers; before any capture), BeginStep() (enqueued: clears the
// device error flag), Forward() per MoE layer, EnqueueReadback() after the last layer, then, once
// the stream is synchronized, FinishStep() (bytes of routed experts read; an error when the router
// chose an id outside [0, E)). In a graph replay only EnqueueReadback/FinishStep run on the host:
// the per-layer path choices of the captured step still hold (same n). Not thread-safe.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "compute_nodes/backend/cuda/cublas_gemm.h"
#include "compute_nodes/backend/cuda/device_weights.h"
#include "compute_nodes/backend/cuda/step_util.h"
#include "compute_nodes/model/model_config.h"
#include "kernels/moe_router/moe_router.h"
#include "kernels/norm_rope/rms_norm.h"

namespace strata::cuda {

class MoeBlock {
 public:
  // `grows` counts buffer reallocations (see Buf). `blas` and `stream` outlive the block.
  // With `side`, the shared experts run on it beside the routed ones.
  MoeBlock(const model::ModelConfig& config, const Cublas* blas, cudaStream_t stream,
           SideStream* side, int64_t max_device_tokens, bool grouped, int64_t* grows);
  ~MoeBlock();
  MoeBlock(const MoeBlock&) = delete;
  MoeBlock& operator=(const MoeBlock&) = delete;

  enum class Path { kDevice, kGrouped, kHost };
  Path PathFor(int64_t n) const;
  // Whether a step of n tokens runs the routed experts on the device path (the decode kernels).
  bool DevicePath(int64_t n) const { return PathFor(n) == Path::kDevice; }
  absl::Status Reserve(int64_t n);
  absl::Status BeginStep();
  // MoE(xn[n][H]) of MoE layer `layer` (its index in the model), enqueued up to the combine: the
  // returned rows and weights are summed by the next norm (valid until the next Forward). With
  // `norm` (one token), xn is that norm's output, not yet written: the router logits' kernel
  // forms the row itself and writes xn and the norm's residual_out (kernels::MoeNormIn); the
  // shared experts start after it and read xn.
  absl::StatusOr<kernels::RmsNormMoeSum> Forward(int64_t layer, const DeviceLayer& L,
                                                 const __nv_bfloat16* xn, int64_t n,
                                                 const kernels::RmsNormParams* norm = nullptr);
  absl::Status EnqueueReadback(int64_t n);  // n: the step's tokens
  absl::StatusOr<int64_t> FinishStep();

 private:
  // The router over the layer's logits; with `aligns` (up to kMoeRouterAlignMaxTokens tokens) it
  // also writes the alignment arrays, so no alignment launch follows.
  absl::Status Route(int64_t layer, const DeviceLayer& L, int64_t n, bool aligns);
  absl::Status RouteOnDevice(int64_t layer, const DeviceLayer& L, const __nv_bfloat16* xn,
                             int64_t n);
  absl::Status Align(int64_t layer, int64_t n);
  // The alignment arrays (layer's entry of the active counts), as LaunchMoeAlign or a one-token
  // router writes them.
  kernels::MoeAlignment Alignment(int64_t layer);
  absl::Status RouteGrouped(const DeviceLayer& L, const __nv_bfloat16* xn, int64_t n);
  absl::Status RouteOnHost(int64_t layer, const DeviceLayer& L, const __nv_bfloat16* xn, int64_t n);

  const model::ModelConfig& c_;
  const Cublas* blas_;
  cudaStream_t s_;
  SideStream* side_;
  int64_t max_device_tokens_;
  bool grouped_;          // the grouped path is allowed (and the device runs it)
  int64_t expert_bytes_;  // gate, up and down of one routed expert
  // Routing: logits [n][E] fp32, experts/weights [n][k].
  Buf router_logits_, experts_, weights_;
  // Device path: counts [E], offsets [E + 1], active [E], slot_token [n k], token_slot [n k]
  // (int64, the combine's row index), act [n k][I]; per-layer active counts [layers] and the error
  // flag, mirrored into pinned host memory by EnqueueReadback.
  Buf count_, offset_, active_, slot_token_, token_slot_, act_, num_active_, error_;
  // Grouped path (with the device path's alignment and act): the tile schedule and the slots'
  // rows gathered [n k][H].
  Buf schedule_, xs_;
  // Host path: expert rows gathered [n k][H], gate|up [n k][2I].
  Buf xe_, gue_;
  Meta host_meta_;  // per layer: slot of each choice [n k] (int64), then slot -> token [n k]
  size_t host_slot_offset_ = 0;
  // Both: expert outputs per slot [n k][H]; shared experts' gate|up [n][2 I_s] and out [n][H].
  Buf ye_, shared_gu_, shared_out_;
  int32_t* host_routing_ = nullptr;  // pinned [host_routing_len_]: the host path's routing
  size_t host_routing_len_ = 0;
  int32_t* host_counters_ = nullptr;  // pinned [layers + 1]: active per layer, then the error flag
  std::vector<int64_t> host_active_;  // per layer: experts with tokens (host path) or -1
  std::vector<bool> moe_layer_;       // per layer: whether it is a MoE layer (seen by Forward)
  int64_t step_tokens_ = 0;
};

}  // namespace strata::cuda
