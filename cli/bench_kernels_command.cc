// strata bench kernels: times the CUDA kernels on the local GPU and compares them with the
// FlashMLA figures measured on an H200 of this workplace (issue #9).
//
//   strata bench kernels [--json PATH] [--iters N]
//
// MLA decode: batch 128, bf16, every sequence s_k tokens long, pages in random order; the whole
// call (split kernel + combine) timed with CUDA events, median of --iters after warm-up.
// TB/s counts KV bytes + q + out; TFLOPS counts 2 * b * h_q * s_k * (576 + 512).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "kernels/mla_decode/mla_decode.h"

namespace strata::cli {
namespace {

using kernels::MlaDecodeParams;

struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
  absl::Status Allocate(size_t bytes) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
    return absl::OkStatus();
  }
};

// Random bf16 (normal-ish, never all zeros): a 64 MiB host pattern copied over the buffer.
absl::Status FillRandomBf16(void* dst, size_t bytes, uint32_t seed) {
  const size_t pattern_elems = std::min<size_t>(bytes / 2, size_t{32} << 20);
  std::vector<uint16_t> pattern(pattern_elems);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (uint16_t& h : pattern) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    h = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  for (size_t off = 0; off < bytes; off += pattern_elems * 2) {
    const size_t n = std::min(pattern_elems * 2, bytes - off);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(static_cast<char*>(dst) + off, pattern.data(), n, cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

// Median milliseconds of `fn` over `iters` event-timed runs after `warmup` runs.
template <typename Fn>
absl::StatusOr<double> MedianMs(Fn fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(fn());
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
    RETURN_IF_ERROR(fn());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CUDA_RETURN_IF_ERROR(cudaEventDestroy(start));
  CUDA_RETURN_IF_ERROR(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// FlashMLA on an H200 of this workplace (issue #9): TB/s for h_q 16/64, TFLOPS for h_q 128.
double FlashMlaFigure(int h_q, int s_k) {
  static const std::map<std::pair<int, int>, double> kFigures = {
      {{64, 4096}, 3.60}, {{64, 8192}, 3.81}, {{64, 16384}, 3.83}, {{64, 32768}, 3.82},
      {{16, 4096}, 3.49}, {{16, 8192}, 4.16}, {{16, 16384}, 4.21}, {{16, 32768}, 4.18},
      {{128, 4096}, 633}, {{128, 8192}, 623}, {{128, 16384}, 596}, {{128, 32768}, 588}};
  return kFigures.at({h_q, s_k});
}

absl::Status BenchMlaDecode(int iters, nlohmann::json& report) {
  constexpr int kBatch = 128, kMaxSeq = 32768;
  const std::vector<int> kHeads = {16, 64, 128};
  const std::vector<int> kSeqs = {4096, 8192, 16384, 32768};
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const int pages_per_seq = kMaxSeq / kernels::kMlaPageSize;
  const int num_pages = kBatch * pages_per_seq;
  const size_t kv_bytes =
      static_cast<size_t>(num_pages) * kernels::kMlaPageSize * kernels::kMlaQkHeadDim * 2;
  DeviceBuffer kv, q, out, lse, table, lens, ws;
  RETURN_IF_ERROR(kv.Allocate(kv_bytes));
  RETURN_IF_ERROR(FillRandomBf16(kv.ptr, kv_bytes, 1));
  const size_t q_bytes = static_cast<size_t>(kBatch) * 128 * kernels::kMlaQkHeadDim * 2;
  RETURN_IF_ERROR(q.Allocate(q_bytes));
  RETURN_IF_ERROR(FillRandomBf16(q.ptr, q_bytes, 2));
  RETURN_IF_ERROR(out.Allocate(static_cast<size_t>(kBatch) * 128 * kernels::kMlaValueDim * 2));
  RETURN_IF_ERROR(lse.Allocate(static_cast<size_t>(kBatch) * 128 * 4));
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(3));
  RETURN_IF_ERROR(table.Allocate(pages.size() * 4));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(table.ptr, pages.data(), pages.size() * 4, cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(lens.Allocate(kBatch * 4));
  RETURN_IF_ERROR(
      ws.Allocate(kernels::MlaDecodeWorkspaceBytes(kBatch, 128, kernels::kMlaMaxSplits)));

  nlohmann::json points = nlohmann::json::array();
  double min_ratio = 1e30;
  nlohmann::json ratios = nlohmann::json::object();
  std::cout << fmt::format("{:>4} {:>6} {:>6} {:>9} {:>7} {:>8} {:>9} {:>7}  sweep(splits:ms)\n",
                           "h_q", "s_k", "splits", "ms", "TB/s", "TFLOPS", "FlashMLA", "ratio");
  for (int h_q : kHeads) {
    for (int s_k : kSeqs) {
      std::vector<int32_t> seqlens(kBatch, s_k);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(lens.ptr, seqlens.data(), kBatch * 4, cudaMemcpyHostToDevice));
      MlaDecodeParams p;
      p.batch = kBatch;
      p.num_heads_q = h_q;
      p.num_pages = num_pages;
      p.max_pages_per_seq = pages_per_seq;
      p.softmax_scale = 0.0721688f;  // 1/sqrt(192)
      p.q = static_cast<const __nv_bfloat16*>(q.ptr);
      p.kv_cache = static_cast<const __nv_bfloat16*>(kv.ptr);
      p.block_table = static_cast<const int32_t*>(table.ptr);
      p.seqlens = static_cast<const int32_t*>(lens.ptr);
      p.out = static_cast<__nv_bfloat16*>(out.ptr);
      p.lse = static_cast<float*>(lse.ptr);
      const int chosen = kernels::MlaDecodeNumSplits(kBatch, h_q, s_k, num_sms);
      std::vector<int> candidates = {chosen, 1, 2, 3, 4, 6, 8};
      std::sort(candidates.begin(), candidates.end());
      candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
      nlohmann::json sweep = nlohmann::json::object();
      double chosen_ms = 0, best_ms = 1e30;
      int best_splits = chosen;
      std::string sweep_text;
      for (int splits : candidates) {
        p.num_splits = splits;
        p.o_accum = nullptr;
        p.lse_accum = nullptr;
        kernels::MlaDecodeSetWorkspace(p, ws.ptr);
        ASSIGN_OR_RETURN(const double ms,
                         MedianMs([&] { return kernels::LaunchMlaDecode(p, nullptr); }, 3, iters));
        sweep[std::to_string(splits)] = ms;
        sweep_text += fmt::format(" {}:{:.3f}", splits, ms);
        if (splits == chosen) chosen_ms = ms;
        if (ms < best_ms) {
          best_ms = ms;
          best_splits = splits;
        }
      }
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      const double bytes =
          static_cast<double>(kBatch) * s_k * kernels::kMlaQkHeadDim * 2 +
          static_cast<double>(kBatch) * h_q * (kernels::kMlaQkHeadDim + kernels::kMlaValueDim) * 2;
      const double flops =
          2.0 * kBatch * h_q * s_k * (kernels::kMlaQkHeadDim + kernels::kMlaValueDim);
      const double tbps = bytes / (chosen_ms * 1e-3) / 1e12;
      const double tflops = flops / (chosen_ms * 1e-3) / 1e12;
      const double reference = FlashMlaFigure(h_q, s_k);
      const double ratio = (h_q == 128 ? tflops : tbps) / reference;
      min_ratio = std::min(min_ratio, ratio);
      ratios[fmt::format("mla_decode_h{}_s{}", h_q, s_k)] = ratio;
      points.push_back({{"h_q", h_q},
                        {"s_k", s_k},
                        {"batch", kBatch},
                        {"splits", chosen},
                        {"ms", chosen_ms},
                        {"tbps", tbps},
                        {"tflops", tflops},
                        {"flashmla", reference},
                        {"flashmla_unit", h_q == 128 ? "TFLOPS" : "TB/s"},
                        {"ratio", ratio},
                        {"best_splits", best_splits},
                        {"best_ms", best_ms},
                        {"sweep_ms", sweep}});
      std::cout << fmt::format(
          "{:>4} {:>6} {:>6} {:>9.3f} {:>7.2f} {:>8.1f} {:>9.2f} {:>7.3f} {}\n", h_q, s_k, chosen,
          chosen_ms, tbps, tflops, reference, ratio, sweep_text);
    }
  }
  ratios["mla_decode_vs_flashmla_min"] = min_ratio;
  report["mla_decode"] = points;
  report["ratios"] = ratios;

  // Device-to-device copy bandwidth (read + write), the memory ceiling of this run.
  const size_t copy_bytes = size_t{2} << 30;
  char* base = static_cast<char*>(kv.ptr);
  ASSIGN_OR_RETURN(const double copy_ms,
                   MedianMs(
                       [&]() -> absl::Status {
                         CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + copy_bytes, base, copy_bytes,
                                                              cudaMemcpyDeviceToDevice, nullptr));
                         return absl::OkStatus();
                       },
                       3, 10));
  report["copy_tbps"] = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e12;
  std::cout << fmt::format("d2d copy: {:.2f} TB/s (read + write)\n",
                           report["copy_tbps"].get<double>());
  return absl::OkStatus();
}

}  // namespace

void RegisterBenchKernelsCommand(CLI::App& app) {
  CLI::App* cmd = BenchGroup(app).add_subcommand("kernels", "Time the CUDA kernels (MLA decode)");
  auto json_path = std::make_shared<std::string>();
  auto iters = std::make_shared<int>(20);
  cmd->add_option("--json", *json_path, "Write the figures as JSON to this file");
  cmd->add_option("--iters", *iters, "Timed runs per point (median reported)")
      ->check(CLI::Range(1, 10000));
  cmd->callback([json_path, iters] {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) Fail(1, "bench kernels: no CUDA device");
    nlohmann::json report;
    report["device"] = prop.name;
    report["num_sms"] = prop.multiProcessorCount;
    report["iters"] = *iters;
    const absl::Status st = BenchMlaDecode(*iters, report);
    if (!st.ok()) Fail(1, StrCat("bench kernels: ", st.message()));
    std::cout << fmt::format("mla_decode_vs_flashmla_min = {:.3f}\n",
                             report["ratios"]["mla_decode_vs_flashmla_min"].get<double>());
    if (!json_path->empty()) {
      std::ofstream f(*json_path);
      f << report.dump(2) << "\n";
      if (!f) Fail(1, StrCat("bench kernels: cannot write ", *json_path));
    }
  });
}

}  // namespace strata::cli
