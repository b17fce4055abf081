// Prefill and decode tokens/s of the CPU backend on a random `small-v3` checkpoint (written to
// /tmp on first use). items_per_second is tokens per second.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"

namespace strata {
namespace {

std::shared_ptr<const model::ModelWeights> Weights() {
  static std::shared_ptr<const model::ModelWeights> w = [] {
    const std::string dir = std::filesystem::temp_directory_path() / "strata_bench_small_v3";
    model::MakeRandomOptions o;
    o.seed = 2;
    if (!std::filesystem::exists(dir + "/model.safetensors")) {
      (void)model::MakeRandomCheckpoint(*model::PresetConfig("small-v3"), o, dir);
    }
    return std::shared_ptr<const model::ModelWeights>(std::move(*model::LoadModel(dir)));
  }();
  return w;
}

std::vector<int32_t> Ids(int64_t n, int64_t salt) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + salt * 31) % 129280);
  return ids;
}

void BM_Prefill(benchmark::State& state) {
  const int64_t n = state.range(0);
  cpu::CpuEngine e(Weights(), (n + 63) / 64);
  runtime::PageTable pages;
  (void)runtime::EnsureCapacity(e.kv_pool(), pages, n);
  const auto ids = Ids(n, 1);
  std::vector<runtime::SequenceOutput> out;
  for (auto _ : state) {
    runtime::SequenceInput in{ids, 0, &pages, false, runtime::AttentionForm::kMha};
    (void)e.Forward({&in, 1}, &out);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Prefill)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond);

// One decode step for `batch` sequences, each with a 256-token context.
void BM_Decode(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int64_t ctx = 256;
  cpu::CpuEngine e(Weights(), batch * (ctx / 64 + 1));
  std::vector<runtime::PageTable> pages(batch);
  std::vector<runtime::SequenceOutput> out;
  std::vector<int32_t> next(batch, 42);
  for (int64_t s = 0; s < batch; ++s) {
    (void)runtime::EnsureCapacity(e.kv_pool(), pages[s], ctx + 1);
    const auto ids = Ids(ctx, s);
    runtime::SequenceInput in{ids, 0, &pages[s], false, runtime::AttentionForm::kMha};
    (void)e.Forward({&in, 1}, &out);
  }
  std::vector<runtime::SequenceInput> step;
  for (int64_t s = 0; s < batch; ++s) {
    step.push_back({{&next[s], 1}, ctx, &pages[s], false, runtime::AttentionForm::kAbsorbed});
  }
  for (auto _ : state) (void)e.Forward(step, &out);  // rewrites position ctx each time
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_Decode)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
