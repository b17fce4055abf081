// The CPU backend: fp32 DeepSeek-V2/V3 forward over the paged latent KV pool.
//
// Prefill chunks attend in MHA form over k/v decompressed from the latents: per head, blocks of
// query rows against every key they may see, as three large GEMMs (scores from the nope and rope
// parts, then probabilities × values) with an exact softmax in between — large GEMMs are what
// the BLAS runs near its peak. The decompressed context of a sequence that names itself
// (SequenceInput::sequence_id) is kept between its prefill chunks, within a memory budget, so
// chunk k decompresses only its own new tokens instead of the whole context again. Decode steps
// attend in the absorbed MQA form directly over the latent pages, merging pages by online softmax
// (running max and sum), which is exact. Both use the softmax scale 1/sqrt(qk_head_dim) · mscale².
// Not thread-safe (one Forward at a time); it threads internally.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/runtime/engine.h"

namespace strata::cpu {

class CpuEngine final : public runtime::Engine {
 public:
  // The default budget for decompressed contexts kept between prefill chunks.
  static constexpr int64_t kDefaultContextCacheBytes = int64_t{1} << 30;

  CpuEngine(std::shared_ptr<const model::ModelWeights> weights, int64_t num_pages,
            int64_t block_tokens = 64,
            runtime::KvPrecision kv_precision = runtime::KvPrecision::kF32,
            int64_t context_cache_bytes = kDefaultContextCacheBytes);

  const model::ModelConfig& config() const override { return weights_->config; }
  runtime::HostKvPool& kv_pool() override { return pool_; }
  absl::Status Forward(std::span<const runtime::SequenceInput> batch,
                       std::vector<runtime::SequenceOutput>* outputs) override;
  void ForgetSequence(uint64_t id) override;

  // Wall time spent since construction: in Forward, and within it decompressing contexts and in
  // attention (both forms). Thread-safe; a running Forward adds its parts as they finish.
  struct Times {
    double forward_s = 0;
    double decompress_s = 0;
    double attention_s = 0;
  };
  Times times() const {
    std::lock_guard<std::mutex> lock(times_mu_);
    return times_;
  }
  // Bytes of decompressed context kept for live sequences, and that plus the spare buffers of
  // finished ones (reused by the next sequence; never over the budget).
  int64_t context_cache_bytes_used() const;
  int64_t context_cache_bytes_reserved() const;

 private:
  absl::Status Run(std::span<const runtime::SequenceInput> batch,
                   std::vector<runtime::SequenceOutput>* outputs);
  struct Token {
    int64_t seq;       // index in the batch
    int64_t position;  // absolute position
  };
  // A sequence's context for the MHA form: kv [ctx][heads][nope + v] decompressed from the
  // latents, k_pe [ctx][rope] gathered from the pages (shared by all heads).
  // Growing a vector must not zero what the next line overwrites: at 8K tokens a layer's context
  // is ~130 MB, and zeroing it cost more than decompressing it.
  template <typename T>
  struct UninitAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
      using other = UninitAllocator<U>;
    };
    UninitAllocator() = default;
    template <typename U>
    UninitAllocator(const UninitAllocator<U>&) noexcept {}
    template <typename U>
    void construct(U* p) noexcept {
      ::new (static_cast<void*>(p)) U;
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  using Floats = std::vector<float, UninitAllocator<float>>;
  struct Context {
    Floats kv;
    Floats k_pe;
  };
  // Decompresses positions [from, start_pos + tokens) of `in` into `out` (resized to cover them;
  // positions before `from` are kept as they are).
  void DecompressRange(int64_t layer, const runtime::SequenceInput& in, int64_t from, Context* out);
  // The context of `in` at `layer`: from the cache, extended by the new positions, when `in` names
  // its sequence; else decompressed into `scratch`.
  const Context& ContextFor(int64_t layer, const runtime::SequenceInput& in, Context* scratch);
  // Records the page tables of the batch's cached contexts and evicts the least recently used
  // ones over the budget.
  void TrimContextCache(std::span<const runtime::SequenceInput> batch);
  // Head `hd` of one sequence's attention for its `rows` new tokens. q: [rows][heads][qk] (RoPE
  // applied); out: [rows][heads][v_head_dim].
  void AttendMha(const runtime::SequenceInput& in, const Context& context, const float* q,
                 int64_t rows, int64_t hd, float* out);
  void AttendAbsorbed(int64_t layer, const runtime::SequenceInput& in, const float* q, int64_t rows,
                      int64_t hd, float* out) const;
  void FeedForward(int64_t layer, const float* x, int64_t n, float* y);

  struct CachedContext {
    std::vector<int32_t> pages;   // the page table it was decompressed from
    std::vector<Context> layers;  // per layer, covering the same positions
    uint64_t last_use = 0;
    int64_t bytes() const { return LayersBytes(layers); }
  };
  static int64_t LayersBytes(const std::vector<Context>& layers);
  // Under cache_mu_: RetireLocked moves a sequence's buffers to the spares; EnforceBudgetLocked
  // trims spares, then the least recently used sequences, to the budget.
  void RetireLocked(std::unordered_map<uint64_t, CachedContext>::iterator it);
  void EnforceBudgetLocked();

  // AttendMha's buffers, reused across heads, layers and calls: a fresh multi-megabyte vector per
  // head costs page faults and zeroing comparable to the attention itself.
  struct MhaScratch {
    std::vector<float> qn, qpe, scores, out, inv_sum;
  };

  std::shared_ptr<const model::ModelWeights> weights_;
  runtime::HostKvPool pool_;
  MhaScratch mha_;
  Context scratch_context_;  // the context of a sequence that does not name itself
  Floats latent_slab_;       // DecompressRange's gathered latents
  Rope rope_;
  const int64_t context_cache_budget_;
  mutable std::mutex cache_mu_;  // ForgetSequence may come from another thread than Forward
  std::unordered_map<uint64_t, CachedContext> context_cache_;
  std::vector<std::vector<Context>> spare_;
  uint64_t use_clock_ = 0;
  void AddTime(double Times::*part, double seconds) {
    std::lock_guard<std::mutex> lock(times_mu_);
    times_.*part += seconds;
  }
  mutable std::mutex times_mu_;
  Times times_;
};

}  // namespace strata::cpu
