#include "cli/bench_kernels_sample.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_kernels_timing.h"
#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "kernels/sampling/greedy_sample.h"
#include "kernels/sampling/sample.h"

namespace strata::cli::bench_kernels {
namespace {

// A draw setting of every row: temperature, top-k (0: all), top-p.
struct DrawSetting {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
};

// The chat default (t 0.7, top-p 0.95), a top-k cut with top-p, and plain temperature.
constexpr DrawSetting kSettings[] = {
    {"t0.7_p0.95", 0.7f, 0, 0.95f}, {"t0.8_k50_p0.9", 0.8f, 50, 0.9f}, {"t1.0", 1.0f, 0, 1.0f}};

// Logits ~ N(0, sigma): sigma 1 leaves most of the vocabulary inside top-p 0.95 (a random-weight
// model's rows look like this); sigma 8 puts the mass on a few tokens, as a trained model's
// confident rows.
constexpr float kSpreads[] = {1.0f, 8.0f};

absl::Status Upload(void* dst, const void* src, size_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

}  // namespace

absl::Status BenchSampling(int iters, nlohmann::json& report) {
  constexpr int kRows[] = {1, 16, 64};
  constexpr int kVocabs[] = {102400, 129280};
  constexpr int kMaxRows = 64;
  constexpr int kMaxVocab = 129280;
  DeviceBuffer logits, draws, tokens;
  RETURN_IF_ERROR(logits.Allocate(size_t{kMaxRows} * kMaxVocab * 4));
  RETURN_IF_ERROR(draws.Allocate(kMaxRows * sizeof(kernels::SampleRowDraw)));
  RETURN_IF_ERROR(tokens.Allocate(kMaxRows * 4));
  std::mt19937 rng(31);
  nlohmann::json points = nlohmann::json::array();
  std::cout << fmt::format("{:>6} {:>7} {:>6} {:>10}", "vocab", "spread", "rows", "greedy ms");
  for (const DrawSetting& s : kSettings) std::cout << fmt::format(" {:>16}", s.name);
  std::cout << fmt::format(" {:>14}\n", "host us/call");
  for (int vocab : kVocabs) {
    for (float spread : kSpreads) {
      std::vector<float> host(size_t{kMaxRows} * vocab);
      std::normal_distribution<float> normal(0.f, spread);
      for (float& x : host) x = normal(rng);
      RETURN_IF_ERROR(Upload(logits.ptr, host.data(), host.size() * 4));
      for (int rows : kRows) {
        const kernels::GreedySampleParams greedy{.rows = rows,
                                                 .vocab = vocab,
                                                 .logits = static_cast<const float*>(logits.ptr),
                                                 .ld_logits = vocab,
                                                 .tokens = static_cast<int32_t*>(tokens.ptr)};
        // One draw buffer per setting, uploaded before the timed rounds.
        std::vector<DeviceBuffer> setting_draws(std::size(kSettings));
        std::vector<std::function<absl::Status()>> fns = {
            [&] { return kernels::LaunchGreedySample(greedy, nullptr); }};
        std::vector<kernels::SampleParams> params;
        std::uniform_real_distribution<double> uniform(0.0, 1.0);
        for (size_t i = 0; i < std::size(kSettings); ++i) {
          std::vector<kernels::SampleRowDraw> d(rows);
          for (kernels::SampleRowDraw& r : d) {
            r = {.temperature = kSettings[i].temperature,
                 .top_p = kSettings[i].top_p,
                 .top_k = kSettings[i].top_k,
                 .uniform = uniform(rng)};
          }
          RETURN_IF_ERROR(setting_draws[i].Allocate(rows * sizeof(kernels::SampleRowDraw)));
          RETURN_IF_ERROR(Upload(setting_draws[i].ptr, d.data(), d.size() * sizeof(d[0])));
          params.push_back(
              {.rows = rows,
               .vocab = vocab,
               .logits = static_cast<const float*>(logits.ptr),
               .ld_logits = vocab,
               .draws = static_cast<const kernels::SampleRowDraw*>(setting_draws[i].ptr),
               .tokens = static_cast<int32_t*>(tokens.ptr)});
        }
        for (const kernels::SampleParams& p : params) {
          fns.push_back([&p] { return kernels::LaunchSample(p, nullptr); });
        }
        ASSIGN_OR_RETURN(const std::vector<double> ms, MedianMsInTurns(fns, 3, iters));
        // The launcher's host time (plan + launch) of the first setting, per call.
        CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        constexpr int kHostCalls = 50;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kHostCalls; ++i)
          RETURN_IF_ERROR(kernels::LaunchSample(params[0], nullptr));
        const double host_us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count() /
            kHostCalls;
        CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        std::cout << fmt::format("{:>6} {:>7.1f} {:>6} {:>10.3f}", vocab, spread, rows, ms[0]);
        nlohmann::json point = {{"vocab", vocab},     {"spread", spread},
                                {"rows", rows},       {"greedy_ms", ms[0]},
                                {"host_us", host_us}, {"settings", nlohmann::json::object()}};
        for (size_t i = 0; i < std::size(kSettings); ++i) {
          std::cout << fmt::format(" {:>8.3f} ({:>4.1f}x)", ms[i + 1], ms[i + 1] / ms[0]);
          point["settings"][kSettings[i].name] = ms[i + 1];
        }
        std::cout << fmt::format(" {:>14.1f}\n", host_us);
        points.push_back(std::move(point));
      }
    }
  }
  report["sample"] = points;
  return absl::OkStatus();
}

}  // namespace strata::cli::bench_kernels
