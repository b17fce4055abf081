// Throughput of each compiled xxh3 variant (one-shot and streamed in 256 KiB pieces, as the tcp
// transport hashes reads) against memcpy of the same bytes, side by side in one run:
//   build/tests/common/checksum_benchmark
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "common/checksum.h"

namespace strata {
namespace {

using checksum_internal::Kernels;

const Kernels* Variant(int i) {
  __builtin_cpu_init();
  switch (i) {
    case 0:
      return &checksum_internal::Sse2Variant();
    case 1:
      return __builtin_cpu_supports("avx2") ? &checksum_internal::Avx2Variant() : nullptr;
    default:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                 ? &checksum_internal::Avx512Variant()
                 : nullptr;
  }
}

void BM_Checksum(benchmark::State& state) {
  const Kernels* k = Variant(static_cast<int>(state.range(0)));
  const bool streamed = state.range(1) != 0;
  if (k == nullptr) {
    state.SkipWithError("this CPU does not run the variant");
    return;
  }
  state.SetLabel(std::string(k->name) + (streamed ? " streamed" : " one-shot"));
  std::vector<char> data(1 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131);
  alignas(64) static char st[1024];
  for (auto _ : state) {
    uint64_t d;
    if (streamed) {
      k->reset(st);
      for (size_t off = 0; off < data.size(); off += 256 << 10)
        k->update(st, &data[off], 256 << 10);
      d = k->digest(st);
    } else {
      d = k->oneshot(data.data(), data.size());
    }
    benchmark::DoNotOptimize(d);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(data.size()));
}
BENCHMARK(BM_Checksum)->ArgsProduct({{0, 1, 2}, {0, 1}});

void BM_Memcpy(benchmark::State& state) {
  std::vector<char> src(1 << 20, 1), dst(1 << 20);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(src.size()));
}
BENCHMARK(BM_Memcpy);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
