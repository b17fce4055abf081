#include "compute_nodes/runtime/generate.h"

#include <chrono>

namespace strata::runtime {

absl::StatusOr<GenerateResult> Generate(Engine& engine, std::span<const int32_t> prompt,
                                        const SamplingParams& params, int64_t prefill_chunk,
                                        const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  KvPool& pool = engine.kv_pool();
  PageTable pages;
  GenerateResult result;
  Sampler sampler(params);
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto run = [&]() -> absl::Status {
    std::vector<SequenceOutput> out;
    const auto t0 = now();
    int64_t pos = 0;
    while (pos < static_cast<int64_t>(prompt.size())) {
      const int64_t n = std::min<int64_t>(prefill_chunk, prompt.size() - pos);
      if (auto st = EnsureCapacity(pool, pages, pos + n); !st.ok()) return st;
      SequenceInput in{prompt.subspan(pos, n), pos, &pages, false, AttentionForm::kMha};
      if (auto st = engine.Forward({&in, 1}, &out); !st.ok()) return st;
      pos += n;
    }
    const auto t1 = now();
    result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    while (true) {
      const int32_t next = sampler.Sample(out[0].logits);
      result.tokens.push_back(next);
      if (on_token) on_token(next);
      result.stop = CheckStop(params, result.tokens);
      if (result.stop != StopReason::kNone) break;
      if (auto st = EnsureCapacity(pool, pages, pos + 1); !st.ok()) return st;
      SequenceInput in{{&result.tokens.back(), 1}, pos, &pages, false, AttentionForm::kAbsorbed};
      if (auto st = engine.Forward({&in, 1}, &out); !st.ok()) return st;
      ++pos;
    }
    result.decode_seconds = std::chrono::duration<double>(now() - t1).count();
    return absl::OkStatus();
  };
  const absl::Status st = run();
  ReleasePages(pool, pages);
  if (!st.ok()) return st;
  return result;
}

}  // namespace strata::runtime
