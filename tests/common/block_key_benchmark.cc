// Throughput of block-key computation (target: >= 5 M tokens/s on one core).
//   build/tests/common/block_key_benchmark
#include <benchmark/benchmark.h>

#include <vector>

#include "common/block_key.h"

namespace strata {
namespace {

void BM_ComputeBlockKeys(benchmark::State& state) {
  const uint32_t block_tokens = static_cast<uint32_t>(state.range(0));
  const size_t num_tokens = static_cast<size_t>(state.range(1));
  std::vector<uint32_t> tokens(num_tokens);
  for (size_t i = 0; i < num_tokens; ++i) tokens[i] = static_cast<uint32_t>(i * 7919 % 129280);
  const Namespace ns = MakeNamespace({}, {.block_tokens = block_tokens}, "");
  for (auto _ : state) {
    auto keys = ComputeBlockKeys(ns, tokens, block_tokens);
    benchmark::DoNotOptimize(keys.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(num_tokens) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ComputeBlockKeys)->Args({64, 8192})->Args({16, 8192})->Args({64, 131072});

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
