#include "compute_nodes/backend/cuda/device_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"

namespace strata::cuda {
namespace {

using model::DType;
using model::TensorSpec;
using model::TensorView;

int64_t Numel(const TensorSpec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}
// Tensors start at multiples of 8 elements (16 bytes: the kernels' vector loads).
int64_t Padded(int64_t n) { return (n + 7) / 8 * 8; }

// Where a tensor's values are: a stored tensor and an element offset into it (a slice of a fused
// expert tensor), or NotFound.
struct Source {
  const TensorView* view = nullptr;
  int64_t offset = 0;
};

absl::StatusOr<Source> FindSource(const model::ModelConfig& c, const model::TensorStore& store,
                                  const TensorSpec& spec) {
  if (const TensorView* v = store.Find(spec.name); v != nullptr) {
    if (v->shape != spec.shape) {
      return absl::InvalidArgumentError(StrCat("tensor ", spec.name, ": unexpected shape"));
    }
    return Source{v, 0};
  }
  // model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight inside a fused tensor.
  const std::string key = ".mlp.experts.";
  const size_t at = spec.name.find(key);
  if (at != std::string::npos) {
    const std::string prefix = spec.name.substr(0, at + key.size());
    const std::string rest = spec.name.substr(at + key.size());
    const size_t dot = rest.find('.');
    const std::optional<int64_t> parsed =
        dot == std::string::npos ? std::nullopt : ParseInt64(rest.substr(0, dot));
    if (parsed.has_value()) {
      const int64_t e = *parsed;
      const std::string what = rest.substr(dot + 1);
      const int64_t i = c.moe_intermediate_size, h = c.hidden_size;
      const bool down = what == "down_proj.weight";
      const TensorView* v = store.Find(prefix + (down ? "down_proj" : "gate_up_proj"));
      if (v != nullptr) {
        const int64_t per = down ? h * i : 2 * i * h;
        if (v->numel() != c.n_routed_experts * per) {
          return absl::InvalidArgumentError(
              StrCat("tensor ", prefix, down ? "down_proj" : "gate_up_proj", ": unexpected size"));
        }
        int64_t off = e * per;
        if (what == "up_proj.weight") off += i * h;
        if (what == "gate_proj.weight" || what == "up_proj.weight" || down) {
          return Source{v, off};
        }
      }
    }
  }
  return absl::NotFoundError(StrCat("missing tensor ", spec.name));
}

// Converts `count` elements of `v` from element `offset` to bf16 into `dst` (host).
void ToBf16(const TensorView& v, int64_t offset, int64_t count, uint16_t* dst) {
  switch (v.dtype) {
    case DType::kBF16:
      std::memcpy(dst, v.data + 2 * offset, count * 2);
      return;
    case DType::kF32:
      for (int64_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, v.data + 4 * (offset + i), 4);
        dst[i] = model::FloatToBf16(f);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, v.data + 2 * (offset + i), 2);
        dst[i] = model::FloatToBf16(model::F16ToFloat(h));
      }
      return;
  }
}

}  // namespace

int64_t DeviceLayer::attention_bytes() const {
  return q_proj.bytes() + q_a_proj.bytes() + q_b_proj.bytes() + kv_a_proj.bytes() +
         kv_b_proj.bytes() + o_proj.bytes();
}

DeviceWeights::~DeviceWeights() {
  if (arena_ != nullptr) (void)cudaFree(arena_);
  if (bias_arena_ != nullptr) (void)cudaFree(bias_arena_);
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::FromCheckpoint(
    const model::ModelConfig& config, const model::TensorStore& store) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights(config));
  const std::vector<TensorSpec> specs = model::CheckpointTensors(config);
  std::vector<Source> sources(specs.size());
  int64_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSIGN_OR_RETURN(sources[i], FindSource(config, store, specs[i]));
    total += Padded(Numel(specs[i]));
  }
  w->total_bytes_ = total * 2;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&w->arena_, std::max<int64_t>(16, total * 2)));
  auto* base = static_cast<__nv_bfloat16*>(w->arena_);
  std::vector<int64_t> offsets(specs.size());
  for (size_t i = 0, off = 0; i < specs.size(); off += Padded(Numel(specs[i])), ++i) {
    offsets[i] = static_cast<int64_t>(off);
    w->tensors_.push_back({specs[i].name, base + off});
  }
  // Tensors are converted into pinned staging buffers and copied by several threads at once (the
  // checkpoint is mmapped: reading it is most of the time).
  const int workers = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  constexpr int64_t kChunk = int64_t{32} << 20;  // elements
  std::atomic<size_t> next{0};
  std::vector<absl::Status> errors(workers);
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t) {
    threads.emplace_back([&, t] {
      absl::Status& err = errors[t];
      uint16_t* staging = nullptr;
      cudaStream_t stream = nullptr;
      err = CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&staging), kChunk * 2, 0),
                       "cudaHostAlloc");
      if (err.ok())
        err = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                         "cudaStreamCreate");
      for (size_t i = next++; err.ok() && i < specs.size(); i = next++) {
        const int64_t n = Numel(specs[i]);
        for (int64_t done = 0; err.ok() && done < n; done += kChunk) {
          const int64_t count = std::min(kChunk, n - done);
          ToBf16(*sources[i].view, sources[i].offset + done, count, staging);
          err = CudaStatus(cudaMemcpyAsync(base + offsets[i] + done, staging, count * 2,
                                           cudaMemcpyHostToDevice, stream),
                           "cudaMemcpyAsync (weights)");
          if (err.ok()) err = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        }
      }
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
      if (staging != nullptr) (void)cudaFreeHost(staging);
    });
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& st : errors) RETURN_IF_ERROR(st);
  RETURN_IF_ERROR(w->Map());
  // The correction bias in fp32 as stored (not through bf16).
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string name = StrCat("model.layers.", l, ".mlp.gate.e_score_correction_bias");
    if (!config.IsMoeLayer(l) || store.Find(name) == nullptr) continue;
    const int64_t shape[1] = {config.n_routed_experts};
    ASSIGN_OR_RETURN(std::vector<float> bias, store.LoadFloat(name, shape));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<float*>(w->layers_[l].score_bias), bias.data(),
                                    bias.size() * 4, cudaMemcpyHostToDevice));
  }
  return w;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Random(
    const model::ModelConfig& config, uint64_t seed) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights(config));
  const std::vector<TensorSpec> specs = model::CheckpointTensors(config);
  int64_t total = 0;
  for (const TensorSpec& s : specs) total += Padded(Numel(s));
  w->total_bytes_ = total * 2;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&w->arena_, std::max<int64_t>(16, total * 2)));
  auto* base = static_cast<__nv_bfloat16*>(w->arena_);
  int64_t off = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    const bool embedding = s.name == "model.embed_tokens.weight";
    const float stddev =
        embedding ? 1.f : 1.f / std::sqrt(static_cast<float>(s.shape.size() == 2 ? s.shape[1] : 1));
    const int kind = s.init == model::InitKind::kOnesish ? 1
                     : s.init == model::InitKind::kBias  ? 2
                                                         : 0;
    RETURN_IF_ERROR(
        FillRandomBf16(base + off, Numel(s), kind, stddev, seed * 1000003 + i, nullptr));
    w->tensors_.push_back({s.name, base + off});
    off += Padded(Numel(s));
  }
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  RETURN_IF_ERROR(w->Map());
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string name = StrCat("model.layers.", l, ".mlp.gate.e_score_correction_bias");
    auto it = std::find_if(w->tensors_.begin(), w->tensors_.end(),
                           [&](const auto& p) { return p.first == name; });
    if (it == w->tensors_.end()) continue;
    std::vector<uint16_t> raw(config.n_routed_experts);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(raw.data(), it->second, raw.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> bias(raw.size());
    for (size_t e = 0; e < raw.size(); ++e) bias[e] = model::Bf16ToFloat(raw[e]);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<float*>(w->layers_[l].score_bias), bias.data(),
                                    bias.size() * 4, cudaMemcpyHostToDevice));
  }
  return w;
}

absl::Status DeviceWeights::Map() {
  const model::ModelConfig& c = config_;
  std::map<std::string, __nv_bfloat16*> by_name(tensors_.begin(), tensors_.end());
  auto get = [&](const std::string& name) -> absl::StatusOr<__nv_bfloat16*> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return absl::NotFoundError(StrCat("missing tensor ", name));
    return it->second;
  };
  auto linear = [&](const std::string& name, int64_t out,
                    int64_t in) -> absl::StatusOr<DeviceLinear> {
    ASSIGN_OR_RETURN(__nv_bfloat16 * p, get(name));
    return DeviceLinear{p, out, in};
  };
  // gate and up adjacent: one [2I][H] linear.
  auto mlp = [&](const std::string& p, int64_t inter, DeviceLinear* gate_up,
                 DeviceLinear* down) -> absl::Status {
    ASSIGN_OR_RETURN(__nv_bfloat16 * g, get(p + "gate_proj.weight"));
    ASSIGN_OR_RETURN(__nv_bfloat16 * u, get(p + "up_proj.weight"));
    if (u != g + inter * c.hidden_size) {
      return absl::InternalError(StrCat(p, ": gate and up not adjacent"));
    }
    *gate_up = {g, 2 * inter, c.hidden_size};
    ASSIGN_OR_RETURN(*down, linear(p + "down_proj.weight", c.hidden_size, inter));
    return absl::OkStatus();
  };
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  ASSIGN_OR_RETURN(embed_, get("model.embed_tokens.weight"));
  ASSIGN_OR_RETURN(final_norm_, get("model.norm.weight"));
  if (c.tie_word_embeddings) {
    lm_head_ = {embed_, c.vocab_size, h};
  } else {
    ASSIGN_OR_RETURN(lm_head_, linear("lm_head.weight", c.vocab_size, h));
  }
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  if (moe_layers > 0 && c.n_routed_experts > 0) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&bias_arena_),
                                    moe_layers * c.n_routed_experts * sizeof(float)));
    CUDA_RETURN_IF_ERROR(
        cudaMemset(bias_arena_, 0, moe_layers * c.n_routed_experts * sizeof(float)));
  }
  layers_.assign(c.num_hidden_layers, {});
  int64_t moe_index = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    DeviceLayer& L = layers_[l];
    const std::string p = StrCat("model.layers.", l, ".");
    ASSIGN_OR_RETURN(L.input_norm, get(p + "input_layernorm.weight"));
    ASSIGN_OR_RETURN(L.post_attention_norm, get(p + "post_attention_layernorm.weight"));
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank > 0) {
      ASSIGN_OR_RETURN(L.q_a_proj, linear(a + "q_a_proj.weight", c.q_lora_rank, h));
      ASSIGN_OR_RETURN(L.q_a_norm, get(a + "q_a_layernorm.weight"));
      ASSIGN_OR_RETURN(L.q_b_proj,
                       linear(a + "q_b_proj.weight", heads * c.qk_head_dim(), c.q_lora_rank));
    } else {
      ASSIGN_OR_RETURN(L.q_proj, linear(a + "q_proj.weight", heads * c.qk_head_dim(), h));
    }
    ASSIGN_OR_RETURN(L.kv_a_proj, linear(a + "kv_a_proj_with_mqa.weight",
                                         c.kv_lora_rank + c.qk_rope_head_dim, h));
    const DeviceLinear& q_in = c.q_lora_rank > 0 ? L.q_a_proj : L.q_proj;
    if (L.kv_a_proj.w != q_in.w + q_in.out * h) {
      return absl::InternalError(StrCat(a, ": q and kv_a projections not adjacent"));
    }
    L.q_kv_a = {q_in.w, q_in.out + L.kv_a_proj.out, h};
    ASSIGN_OR_RETURN(L.kv_a_norm, get(a + "kv_a_layernorm.weight"));
    ASSIGN_OR_RETURN(L.kv_b_proj,
                     linear(a + "kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim),
                            c.kv_lora_rank));
    ASSIGN_OR_RETURN(L.o_proj, linear(a + "o_proj.weight", h, heads * c.v_head_dim));
    const std::string m = p + "mlp.";
    L.moe = c.IsMoeLayer(l);
    if (!L.moe) {
      RETURN_IF_ERROR(mlp(m, c.intermediate_size, &L.gate_up, &L.down));
      continue;
    }
    ASSIGN_OR_RETURN(L.router, linear(m + "gate.weight", c.n_routed_experts, h));
    if (by_name.count(m + "gate.e_score_correction_bias") > 0) {
      L.score_bias = bias_arena_ + moe_index * c.n_routed_experts;
    }
    ++moe_index;
    const int64_t inter = c.moe_intermediate_size;
    DeviceLinear gu0, d0;
    RETURN_IF_ERROR(mlp(StrCat(m, "experts.0."), inter, &gu0, &d0));
    L.experts = gu0.w;
    L.expert_stride = 3 * inter * h;
    for (int64_t e = 1; e < c.n_routed_experts; ++e) {
      DeviceLinear gu, d;
      RETURN_IF_ERROR(mlp(StrCat(m, "experts.", e, "."), inter, &gu, &d));
      if (gu.w - L.experts != e * L.expert_stride || d.w != gu.w + 2 * inter * h) {
        return absl::InternalError(StrCat(m, "experts: not equally spaced"));
      }
    }
    if (d0.w != gu0.w + 2 * inter * h) return absl::InternalError("expert 0: down not after up");
    if (c.n_shared_experts > 0) {
      L.has_shared = true;
      RETURN_IF_ERROR(mlp(m + "shared_experts.", inter * c.n_shared_experts, &L.shared_gate_up,
                          &L.shared_down));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::cuda
