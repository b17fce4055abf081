// strata bench decode: one decode step of a whole model on the CUDA backend, against its HBM floor.
//
//   strata bench decode [--preset v2-lite-shape | --model DIR] [--batch 1,16,64] [--context 1024]
//                       [--steps 20] [--num-layers N] [--json PATH] [--cuda-graphs 1]
//                       [--moe-device-max-tokens 256] [--concurrent-loads PAGES]
//
// The weights are random bf16 drawn on the GPU (--preset; no checkpoint on disk) or a checkpoint
// (--model). Every sequence starts with --context tokens of random latent KV in its pages, then
// decode steps (absorbed form) run for all sequences of the batch at once; each step is timed on
// the host around Forward (which ends with the logits on the host, in the output vectors of the
// previous step, reused as a serving loop reuses them), median of --steps after 3 warm-up steps.
//
// HBM floor of a step = (bytes of weights the step reads + latent KV bytes it reads) / 4.27 TB/s,
// the device-to-device copy bandwidth measured on an H200 of this workplace. Weights read: every
// attention, dense-MLP, shared-expert, router and lm_head tensor, and the routed experts that got
// at least one token in that step (CudaEngine::last_step()). ratio = floor / measured step time
// (1.0 = at the floor); JSON ratios.decode_step_vs_hbm_floor_b<B>. "gpu ms" is the median GPU
// time of the step's work (events around it; without the host's planning and the logits copy).
// --cuda-graphs 0 and --moe-device-max-tokens 0 switch the decode graph and the device-side MoE
// path off (the backend as it was before both, for comparisons). --concurrent-loads PAGES then
// times greedy steps beside a KV load of PAGES blocks, zero copy and by the copy engine
// (bench_decode_loads.cc).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_decode_loads.h"
#include "cli/commands.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/cuda_engine.h"
#include "compute_nodes/model/make_random.h"

namespace strata::cli {
namespace {

constexpr double kHbmBytesPerSecond = 4.27e12;

struct Args {
  std::string preset = "v2-lite-shape", model_dir, batches = "1,16,64", json;
  int64_t context = 1024, steps = 20, num_layers = 0;
  bool cuda_graphs = true;
  bool fold_norms = true;
  bool rope_beside = true;
  int64_t low_priority_side_rows = 1;
  int64_t moe_device_max_tokens = 256;
  int64_t concurrent_loads = 0;  // pages
};

void Run(const Args& a) {
  std::unique_ptr<cuda::CudaEngine> engine;
  std::vector<int64_t> batches;
  for (std::string_view b : StrSplit(a.batches, ',', /*skip_empty=*/true)) {
    const std::optional<int64_t> v = ParseInt64(b);
    if (!v || *v <= 0) Fail(2, StrCat("bad --batch entry '", b, "'"));
    batches.push_back(*v);
  }
  if (batches.empty()) Fail(2, "--batch is empty");
  const int64_t max_b = *std::max_element(batches.begin(), batches.end());
  // The concurrent-loads runs take 6 rounds of steps in one set of pages.
  const int64_t positions = a.context + (a.concurrent_loads > 0 ? 6 : 1) * (a.steps + 3) + 1;
  const int64_t pages_per_seq = (positions + 63) / 64;
  cuda::CudaEngineOptions options;
  options.num_pages = max_b * pages_per_seq;
  options.cuda_graphs = a.cuda_graphs;
  options.fold_norms = a.fold_norms;
  options.rope_beside_query = a.rope_beside;
  options.low_priority_side_rows = a.low_priority_side_rows;
  options.moe_device_max_tokens = a.moe_device_max_tokens;
  if (auto st = cuda::CudaAvailable(); !st.ok()) Fail(2, StrCat("bench decode: ", st.message()));
  const auto t0 = std::chrono::steady_clock::now();
  if (!a.model_dir.empty()) {
    auto e = cuda::CudaEngine::FromCheckpoint(a.model_dir, options);
    if (!e.ok()) Fail(1, e.status().ToString());
    engine = std::move(*e);
  } else {
    auto config = model::PresetConfig(a.preset);
    if (!config.ok()) Fail(2, config.status().ToString());
    if (a.num_layers > 0)
      config->num_hidden_layers = std::min(a.num_layers, config->num_hidden_layers);
    auto w = cuda::DeviceWeights::Random(*config, 7);
    if (!w.ok()) Fail(1, w.status().ToString());
    auto e = cuda::CudaEngine::Create(std::move(*w), options);
    if (!e.ok()) Fail(1, e.status().ToString());
    engine = std::move(*e);
  }
  if (auto st = engine->kv_pool().FillRandom(3); !st.ok()) Fail(1, st.ToString());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const model::ModelConfig& c = engine->config();
  cudaDeviceProp prop;
  (void)cudaGetDeviceProperties(&prop, 0);
  std::cout << fmt::format(
      "bench decode: {} ({} layers, hidden {}, {} experts top-{}), weights {:.2f} GB, context {} "
      "tokens, loaded in {:.1f} s, {}\n",
      a.model_dir.empty() ? a.preset : a.model_dir, c.num_hidden_layers, c.hidden_size,
      c.n_routed_experts, c.num_experts_per_tok, engine->weights().total_bytes() / 1e9, a.context,
      load_s, prop.name);
  nlohmann::json report;
  report["device"] = prop.name;
  report["model"] = a.model_dir.empty() ? a.preset : a.model_dir;
  report["num_layers"] = c.num_hidden_layers;
  report["context"] = a.context;
  report["cuda_graphs"] = a.cuda_graphs;
  report["fold_norms"] = a.fold_norms;
  report["rope_beside"] = a.rope_beside;
  report["low_priority_side_rows"] = a.low_priority_side_rows;
  report["moe_device_max_tokens"] = a.moe_device_max_tokens;
  report["hbm_bytes_per_second"] = kHbmBytesPerSecond;
  report["ratios"] = nlohmann::json::object();
  std::mt19937 rng(1);
  std::cout << fmt::format("{:>6} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>6}\n",
                           "batch", "output", "step ms", "gpu ms", "tok/s", "weights GB", "kv GB",
                           "floor ms", "ratio", "graph");
  // Each batch size three ways: the step returning every sequence's logits to the host (a
  // sampler on the host), and returning only the tokens, picked on the GPU from each sequence's
  // draw (SequenceInput::draw): greedy (temperature 0) and sampled (temperature 0.7, top-p 0.95,
  // the sampling kernel's sort + scan).
  enum class Output { kLogits, kGreedy, kSampled };
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int64_t b : batches) {
    for (const Output output : {Output::kLogits, Output::kGreedy, Output::kSampled}) {
      const char* name = output == Output::kLogits   ? "logits"
                         : output == Output::kGreedy ? "greedy"
                                                     : "sampled";
      std::vector<runtime::PageTable> pages(b);
      for (auto& p : pages) {
        if (auto st = runtime::EnsureCapacity(engine->kv_pool(), p, a.context + a.steps + 3);
            !st.ok()) {
          Fail(1, st.ToString());
        }
      }
      std::vector<int32_t> tokens(b);
      std::vector<double> ms, gpu_ms, enqueue_ms, copy_ms, output_ms;
      cuda::StepStats stats;
      std::vector<runtime::SequenceOutput> out;  // reused across steps, as a serving loop does
      for (int64_t step = 0; step < a.steps + 3; ++step) {
        std::vector<runtime::SequenceInput> batch(b);
        for (int64_t s = 0; s < b; ++s) {
          tokens[s] = static_cast<int32_t>(rng() % c.vocab_size);
          batch[s] = {std::span<const int32_t>(&tokens[s], 1), a.context + step, &pages[s], false,
                      runtime::AttentionForm::kAbsorbed};
          if (output == Output::kGreedy) batch[s].draw = runtime::TokenDraw{};
          if (output == Output::kSampled) {
            batch[s].draw =
                runtime::TokenDraw{.temperature = 0.7f, .top_p = 0.95f, .uniform = unit(rng)};
          }
        }
        const auto s0 = std::chrono::steady_clock::now();
        if (auto st = engine->Forward(batch, &out); !st.ok()) Fail(1, st.ToString());
        const double t =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0)
                .count();
        if (step >= 3) {
          ms.push_back(t);
          stats = engine->last_step();
          gpu_ms.push_back(stats.device_ms);
          enqueue_ms.push_back(stats.host_enqueue_ms);
          copy_ms.push_back(stats.logits_copy_ms);
          output_ms.push_back(stats.host_output_ms);
        }
      }
      // What sampling the returned logits on the host would add to a step (temperature 0.7,
      // top-p 0.95 with the CPU rule, one thread, as the worker does without draws).
      double host_sample_ms = 0;
      if (output == Output::kLogits) {
        const auto h0 = std::chrono::steady_clock::now();
        for (const runtime::SequenceOutput& o : out) {
          (void)runtime::PickToken({.temperature = 0.7f, .top_p = 0.95f, .uniform = unit(rng)},
                                   o.logits);
        }
        host_sample_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0)
                .count();
      }
      for (auto& p : pages) runtime::ReleasePages(engine->kv_pool(), p);
      std::sort(ms.begin(), ms.end());
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double med = ms[ms.size() / 2];
      const double gpu_med = median(gpu_ms);
      const double bytes = static_cast<double>(stats.weight_bytes + stats.kv_bytes);
      const double floor_ms = bytes / kHbmBytesPerSecond * 1e3;
      const double ratio = floor_ms / med;
      std::cout << fmt::format(
          "{:>6} {:>7} {:>10.3f} {:>10.3f} {:>10.0f} {:>10.3f} {:>10.3f} {:>10.3f} {:>8.3f} "
          "{:>6}\n",
          b, name, med, gpu_med, b / med * 1e3, stats.weight_bytes / 1e9, stats.kv_bytes / 1e9,
          floor_ms, ratio, stats.graphed ? "yes" : "no");
      std::cout << fmt::format(
          "       (host enqueue {:.3f} ms, to pinned {:.3f} ms, into vectors "
          "{:.3f} ms; medians){}\n",
          median(enqueue_ms), median(copy_ms), median(output_ms),
          output == Output::kLogits
              ? fmt::format("; sampling these logits on the host: {:.1f} ms", host_sample_ms)
              : "");
      report["points"].push_back({{"batch", b},
                                  {"output", name},
                                  {"step_ms_median", med},
                                  {"step_ms_min", ms.front()},
                                  {"gpu_ms_median", gpu_med},
                                  {"graphed", stats.graphed},
                                  {"host_enqueue_ms_median", median(enqueue_ms)},
                                  {"logits_copy_ms_median", median(copy_ms)},
                                  {"host_output_ms_median", median(output_ms)},
                                  {"host_sample_ms", host_sample_ms},
                                  {"tokens_per_second", b / med * 1e3},
                                  {"weight_bytes", stats.weight_bytes},
                                  {"kv_bytes", stats.kv_bytes},
                                  {"floor_ms", floor_ms}});
      report["ratios"]
            [StrCat(output == Output::kLogits ? "decode_step" : StrCat("decode_step_", name),
                    "_vs_hbm_floor_b", b)] = ratio;
    }
  }
  if (a.concurrent_loads > 0) {
    BenchDecodeWithLoads(*engine, batches, a.context, a.steps, a.concurrent_loads, report);
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << report.dump(2) << "\n";
    if (!f) Fail(1, StrCat("bench decode: cannot write ", a.json));
  }
}

}  // namespace

void RegisterBenchDecodeCommand(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "decode", "Time whole-model decode steps on the CUDA backend against the HBM floor");
  cmd->add_option("--preset", a->preset, "Random weights of this preset (drawn on the GPU)")
      ->default_val("v2-lite-shape");
  cmd->add_option("--model", a->model_dir, "A checkpoint directory instead of --preset");
  cmd->add_option("--batch", a->batches, "Comma-separated batch sizes")->default_val("1,16,64");
  cmd->add_option("--context", a->context, "Tokens already in each sequence's pages")
      ->default_val(1024);
  cmd->add_option("--steps", a->steps, "Timed steps per batch size")->default_val(20);
  cmd->add_option("--num-layers", a->num_layers, "Keep only the first N layers of the preset");
  cmd->add_option("--json", a->json, "Write the figures as JSON to this file");
  cmd->add_option("--cuda-graphs", a->cuda_graphs, "Capture and replay decode steps (0: off)")
      ->default_val(true);
  cmd->add_option("--fold-norms", a->fold_norms,
                  "One-row steps: the projections after a norm form its row (0: norm kernels)")
      ->default_val(true);
  cmd->add_option("--rope-beside", a->rope_beside,
                  "Few-row steps: the RoPE-rows kernel runs beside q·W_UK (0: ahead of it)")
      ->default_val(true);
  cmd->add_option("--low-priority-side-rows", a->low_priority_side_rows,
                  "Steps of up to this many rows run the side stream below the main one (0: never)")
      ->default_val(1);
  cmd->add_option("--moe-device-max-tokens", a->moe_device_max_tokens,
                  "Device-side MoE routing up to this many tokens (0: always via the host)")
      ->default_val(256);
  cmd->add_option("--concurrent-loads", a->concurrent_loads,
                  "Then time greedy steps beside a KV load of this many blocks, zero copy and by "
                  "the copy engine (0: not)")
      ->default_val(0);
  cmd->callback([a] { Run(*a); });
}

}  // namespace strata::cli
