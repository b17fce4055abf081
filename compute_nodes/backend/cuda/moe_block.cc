#include "compute_nodes/backend/cuda/moe_block.h"

#include <algorithm>

#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_experts/moe_grouped.h"
#include "kernels/moe_router/moe_router.h"

namespace strata::cuda {

using bf16 = __nv_bfloat16;

MoeBlock::MoeBlock(const model::ModelConfig& config, const Cublas* blas, cudaStream_t stream,
                   SideStream* side, int64_t max_device_tokens, bool grouped, int64_t* grows)
    : c_(config),
      blas_(blas),
      s_(stream),
      side_(side),
      max_device_tokens_(max_device_tokens),
      grouped_(grouped && kernels::MoeGroupedApplies()),
      expert_bytes_(3 * config.moe_intermediate_size * config.hidden_size * 2),
      router_logits_(grows),
      experts_(grows),
      weights_(grows),
      count_(grows),
      offset_(grows),
      active_(grows),
      slot_token_(grows),
      token_slot_(grows),
      act_(grows),
      num_active_(grows),
      error_(grows),
      schedule_(grows),
      xs_(grows),
      xe_(grows),
      gue_(grows),
      host_meta_(grows),
      ye_(grows),
      shared_gu_(grows),
      shared_out_(grows),
      host_active_(config.num_hidden_layers, 0),
      moe_layer_(config.num_hidden_layers, false) {}

MoeBlock::Path MoeBlock::PathFor(int64_t n) const {
  if (n <= max_device_tokens_) return Path::kDevice;
  return grouped_ ? Path::kGrouped : Path::kHost;
}

MoeBlock::~MoeBlock() {
  if (host_routing_ != nullptr) (void)cudaFreeHost(host_routing_);
  if (host_counters_ != nullptr) (void)cudaFreeHost(host_counters_);
}

absl::Status MoeBlock::Reserve(int64_t n) {
  if (c_.n_routed_experts == 0) return absl::OkStatus();
  const int64_t h = c_.hidden_size, ne = c_.n_routed_experts, k = c_.num_experts_per_tok;
  const int64_t inter = c_.moe_intermediate_size;
  const int64_t shared_inter = inter * std::max<int64_t>(1, c_.n_shared_experts);
  const int64_t slots = n * k;
  RETURN_IF_ERROR(router_logits_.Ensure(n * ne * 4));
  RETURN_IF_ERROR(experts_.Ensure(slots * 4));
  RETURN_IF_ERROR(weights_.Ensure(slots * 4));
  RETURN_IF_ERROR(ye_.Ensure(slots * h * 2));
  RETURN_IF_ERROR(shared_gu_.Ensure(n * 2 * shared_inter * 2));
  RETURN_IF_ERROR(shared_out_.Ensure(n * h * 2));
  if (host_counters_ == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_counters_),
                                       (c_.num_hidden_layers + 1) * 4, 0));
  }
  const Path path = PathFor(n);
  if (path != Path::kHost) {
    RETURN_IF_ERROR(count_.Ensure(ne * 4));
    RETURN_IF_ERROR(offset_.Ensure((ne + 1) * 4));
    RETURN_IF_ERROR(active_.Ensure(ne * 4));
    RETURN_IF_ERROR(slot_token_.Ensure(slots * 4));
    RETURN_IF_ERROR(token_slot_.Ensure(slots * 8));
    RETURN_IF_ERROR(act_.Ensure(slots * inter * 2));
    RETURN_IF_ERROR(num_active_.Ensure(c_.num_hidden_layers * 4));
    RETURN_IF_ERROR(error_.Ensure(4));
    if (path == Path::kGrouped) {
      RETURN_IF_ERROR(schedule_.Ensure(kernels::MoeGroupedScheduleBytes(slots, ne)));
      RETURN_IF_ERROR(xs_.Ensure(slots * h * 2));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(xe_.Ensure(slots * h * 2));
  RETURN_IF_ERROR(gue_.Ensure(slots * 2 * inter * 2));
  if (static_cast<size_t>(slots) > host_routing_len_) {
    if (host_routing_ != nullptr) (void)cudaFreeHost(host_routing_);
    host_routing_ = nullptr;
    host_routing_len_ = 0;
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_routing_), slots * 2 * 4, 0));
    host_routing_len_ = slots * 2;
  }
  return absl::OkStatus();
}

absl::Status MoeBlock::BeginStep() {
  if (c_.n_routed_experts == 0 || error_.as<void>() == nullptr) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(num_active_.as<void>(), 0, c_.num_hidden_layers * 4, s_));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(error_.as<void>(), 0, 4, s_));
  return absl::OkStatus();
}

absl::StatusOr<kernels::RmsNormMoeSum> MoeBlock::Forward(int64_t layer, const DeviceLayer& L,
                                                         const bf16* xn, int64_t n,
                                                         const kernels::RmsNormParams* norm) {
  const int64_t h = c_.hidden_size, ne = c_.n_routed_experts, k = c_.num_experts_per_tok;
  moe_layer_[layer] = true;
  if (norm != nullptr && n != 1) return absl::InternalError("MoeBlock: a folded norm is one row");
  const bf16* shared = nullptr;
  // Shared experts (side stream when there is one) beside the routed ones; after the router
  // logits when those write xn. Forming the row in each of the shared gate|up's CTAs instead
  // (352 at v2-lite's shape) lost: batch-1 step 2.164 vs 2.073 ms GPU on the H200.
  const auto shared_experts = [&]() -> absl::Status {
    if (!L.has_shared) return absl::OkStatus();
    const Cublas& blas = side_ != nullptr ? side_->blas() : *blas_;
    const cudaStream_t stream = side_ != nullptr ? side_->stream() : s_;
    if (side_ != nullptr) RETURN_IF_ERROR(side_->Fork());
    RETURN_IF_ERROR(Mlp(blas, stream, L.shared_gate_up, L.shared_down, xn, n, shared_gu_.as<bf16>(),
                        shared_out_.as<bf16>()));
    shared = shared_out_.as<bf16>();
    return absl::OkStatus();
  };
  if (norm == nullptr) RETURN_IF_ERROR(shared_experts());
  if (n <= kSkinnyMaxRows) {
    kernels::SkinnyGemmParams g;
    g.tokens = static_cast<int>(n);
    g.n_out = static_cast<int>(ne);
    g.k = static_cast<int>(h);
    g.x = xn;
    g.w = L.router.w;
    g.out_f32 = router_logits_.as<float>();
    g.weights_static = true;
    if (norm != nullptr) {  // xn and the residual, for the experts and the next layer
      g.norm_in = {.params = *norm, .writes = true};
    }
    RETURN_IF_ERROR(kernels::LaunchSkinnyGemm(g, s_));
  } else {
    RETURN_IF_ERROR(Linear(*blas_, L.router, xn, h, n, router_logits_.as<float>(), ne, true));
  }
  if (norm != nullptr) RETURN_IF_ERROR(shared_experts());
  const Path path = PathFor(n);
  // Up to 16 tokens the router aligns its own choices (its warp for one token, its block for
  // more): no alignment launch on the critical path of a few-row step.
  const bool router_aligns = path == Path::kDevice && n <= kernels::kMoeRouterAlignMaxTokens;
  RETURN_IF_ERROR(Route(layer, L, n, router_aligns));
  const int64_t* token_slot;
  if (path != Path::kHost) {
    if (!router_aligns) RETURN_IF_ERROR(Align(layer, n));
    RETURN_IF_ERROR(path == Path::kDevice ? RouteOnDevice(layer, L, xn, n)
                                          : RouteGrouped(L, xn, n));
    token_slot = token_slot_.as<int64_t>();
  } else {
    RETURN_IF_ERROR(RouteOnHost(layer, L, xn, n));
    token_slot = host_meta_.At<int64_t>(host_slot_offset_);
  }
  if (L.has_shared && side_ != nullptr) RETURN_IF_ERROR(side_->Join());
  kernels::RmsNormMoeSum out;
  out.top_k = static_cast<int>(k);
  out.expert_out = ye_.as<bf16>();
  out.ld_expert_out = h;
  out.slot = token_slot;
  out.weight = weights_.as<float>();
  out.shared = shared;
  out.ld_shared = h;
  return out;
}

absl::Status MoeBlock::Route(int64_t layer, const DeviceLayer& L, int64_t n, bool aligns) {
  const int64_t ne = c_.n_routed_experts, k = c_.num_experts_per_tok;
  kernels::MoeRouterParams p;
  p.num_tokens = static_cast<int>(n);
  p.num_experts = static_cast<int>(ne);
  p.top_k = static_cast<int>(k);
  p.scoring = c_.scoring_func == model::ScoringFunc::kSoftmax ? kernels::MoeScoring::kSoftmax
                                                              : kernels::MoeScoring::kSigmoid;
  p.topk_method = c_.topk_method == model::TopkMethod::kGreedy
                      ? kernels::MoeTopkMethod::kGreedy
                      : (c_.topk_method == model::TopkMethod::kGroupLimitedGreedy
                             ? kernels::MoeTopkMethod::kGroupLimitedGreedy
                             : kernels::MoeTopkMethod::kNoauxTc);
  p.n_group = static_cast<int>(c_.n_group);
  p.topk_group = static_cast<int>(c_.topk_group);
  p.normalize = c_.type == model::ModelType::kDeepseekV3 && c_.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(c_.routed_scaling_factor);
  p.logits = router_logits_.as<float>();
  p.ld_logits = ne;
  p.bias = L.score_bias;
  p.experts = experts_.as<int32_t>();
  p.weights = weights_.as<float>();
  if (aligns) p.align = Alignment(layer);
  return kernels::LaunchMoeRouter(p, s_);
}

absl::Status MoeBlock::Align(int64_t layer, int64_t n) {
  kernels::MoeAlignParams a;
  a.num_tokens = static_cast<int>(n);
  a.top_k = static_cast<int>(c_.num_experts_per_tok);
  a.num_experts = static_cast<int>(c_.n_routed_experts);
  a.experts = experts_.as<int32_t>();
  a.out = Alignment(layer);
  return kernels::LaunchMoeAlign(a, s_);
}

kernels::MoeAlignment MoeBlock::Alignment(int64_t layer) {
  return {.expert_count = count_.as<int32_t>(),
          .expert_offset = offset_.as<int32_t>(),
          .active = active_.as<int32_t>(),
          .num_active = num_active_.as<int32_t>() + layer,
          .slot_token = slot_token_.as<int32_t>(),
          .token_slot = token_slot_.as<int64_t>(),
          .error = error_.as<int32_t>()};
}

absl::Status MoeBlock::RouteGrouped(const DeviceLayer& L, const bf16* xn, int64_t n) {
  kernels::MoeGroupedParams p;
  p.num_tokens = static_cast<int>(n);
  p.top_k = static_cast<int>(c_.num_experts_per_tok);
  p.num_experts = static_cast<int>(c_.n_routed_experts);
  p.hidden = static_cast<int>(c_.hidden_size);
  p.inter = static_cast<int>(c_.moe_intermediate_size);
  p.x = xn;
  p.ld_x = c_.hidden_size;
  p.weights = L.experts;
  p.expert_stride = L.expert_stride;
  p.expert_offset = offset_.as<int32_t>();
  p.slot_token = slot_token_.as<int32_t>();
  p.schedule = schedule_.as<void>();
  p.xs = xs_.as<bf16>();
  p.act = act_.as<bf16>();
  p.out = ye_.as<bf16>();
  return kernels::LaunchMoeGrouped(p, s_);
}

absl::Status MoeBlock::RouteOnDevice(int64_t layer, const DeviceLayer& L, const bf16* xn,
                                     int64_t n) {
  const int64_t ne = c_.n_routed_experts, k = c_.num_experts_per_tok;
  kernels::MoeExpertsParams p;
  p.num_tokens = static_cast<int>(n);
  p.num_experts = static_cast<int>(ne);
  p.max_active = static_cast<int>(std::min(ne, n * k));
  p.hidden = static_cast<int>(c_.hidden_size);
  p.inter = static_cast<int>(c_.moe_intermediate_size);
  p.token_tiles = n <= 8 ? 1 : 2;
  p.x = xn;
  p.ld_x = c_.hidden_size;
  p.weights = L.experts;
  p.expert_stride = L.expert_stride;
  p.expert_count = count_.as<int32_t>();
  p.expert_offset = offset_.as<int32_t>();
  p.active = active_.as<int32_t>();
  p.num_active = num_active_.as<int32_t>() + layer;
  p.slot_token = slot_token_.as<int32_t>();
  p.act = act_.as<bf16>();
  p.out = ye_.as<bf16>();
  p.weights_static = true;
  return kernels::LaunchMoeExperts(p, s_);
}

absl::Status MoeBlock::RouteOnHost(int64_t layer, const DeviceLayer& L, const bf16* xn, int64_t n) {
  const int64_t h = c_.hidden_size, ne = c_.n_routed_experts, k = c_.num_experts_per_tok;
  const int64_t inter = c_.moe_intermediate_size;
  // The routing comes to the host: per-expert GEMM sizes are host decisions.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_routing_, experts_.as<int32_t>(), n * k * 4,
                                       cudaMemcpyDeviceToHost, s_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s_));
  std::vector<int64_t> count(ne, 0), offset(ne + 1, 0);
  for (int64_t i = 0; i < n * k; ++i) {
    const int32_t e = host_routing_[i];
    if (e < 0 || e >= ne) return absl::InternalError(StrCat("router chose expert ", e));
    ++count[e];
  }
  int64_t active = 0;
  for (int64_t e = 0; e < ne; ++e) {
    offset[e + 1] = offset[e] + count[e];
    active += count[e] > 0 ? 1 : 0;
  }
  host_active_[layer] = active;
  std::vector<int64_t> pos(n * k), perm(n * k);
  {
    std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
    for (int64_t i = 0; i < n * k; ++i) {
      const int64_t row = fill[host_routing_[i]]++;
      pos[i] = row;
      perm[row] = i / k;
    }
  }
  host_meta_.Clear();
  host_slot_offset_ = host_meta_.Add(pos);
  const size_t o_perm = host_meta_.Add(perm);
  RETURN_IF_ERROR(host_meta_.Upload(s_));
  bf16* xe = xe_.as<bf16>();
  bf16* gue = gue_.as<bf16>();
  bf16* ye = ye_.as<bf16>();
  RETURN_IF_ERROR(GatherRows(xn, h, host_meta_.At<int64_t>(o_perm), n * k, h, xe, h, s_));
  for (int64_t e = 0; e < ne; ++e) {
    if (count[e] == 0) continue;
    const DeviceLinear gate_up{L.experts + e * L.expert_stride, 2 * inter, h};
    RETURN_IF_ERROR(Linear(*blas_, gate_up, xe + offset[e] * h, h, count[e],
                           gue + offset[e] * 2 * inter, 2 * inter));
  }
  RETURN_IF_ERROR(SiluMulRows(n * k, inter, gue, s_));
  for (int64_t e = 0; e < ne; ++e) {
    if (count[e] == 0) continue;
    const DeviceLinear down{L.experts + e * L.expert_stride + 2 * inter * h, h, inter};
    RETURN_IF_ERROR(Linear(*blas_, down, gue + offset[e] * 2 * inter, 2 * inter, count[e],
                           ye + offset[e] * h, h));
  }
  return absl::OkStatus();
}

absl::Status MoeBlock::EnqueueReadback(int64_t n) {
  step_tokens_ = n;
  if (c_.n_routed_experts == 0 || PathFor(n) == Path::kHost) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_counters_, num_active_.as<int32_t>(),
                                       c_.num_hidden_layers * 4, cudaMemcpyDeviceToHost, s_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_counters_ + c_.num_hidden_layers, error_.as<int32_t>(),
                                       4, cudaMemcpyDeviceToHost, s_));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MoeBlock::FinishStep() {
  if (c_.n_routed_experts == 0) return 0;
  const bool device = PathFor(step_tokens_) != Path::kHost;
  if (device && host_counters_[c_.num_hidden_layers] != 0) {
    return absl::InternalError("MoE: the router chose an expert id outside [0, n_routed_experts)");
  }
  int64_t bytes = 0;
  for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
    if (!moe_layer_[l]) continue;
    bytes += (device ? host_counters_[l] : host_active_[l]) * expert_bytes_;
  }
  return bytes;
}

}  // namespace strata::cuda
