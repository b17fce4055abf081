// strata bench prefill: whole-model prefill of long prompts on a backend, as MFU.
//
//   strata bench prefill [--backend cuda|cpu] [--preset v3-shape-4l | --model DIR]
//                        [--prompt 4096] [--batch 1] [--repeats 5] [--warmup 2] [--num-layers N]
//                        [--json PATH]
//
// Each repeat prefills --batch fresh sequences of --prompt random tokens in one Forward (the MHA
// form; each sequence's token is picked from its last row, so no logits are copied back), timed on
// the host around Forward, which returns once the tokens are on the host; the figure is the median
// over --repeats after --warmup untimed calls. FLOPs: model::PrefillFlops (every matrix product;
// attention causal), MFU = FLOPs / time / 790 TFLOPS, the bf16 dense rate measured on an H200 of
// this workplace (for --backend cpu the TFLOPS column is the meaningful one). --preset draws random
// weights on the GPU (cuda only); --model opens a checkpoint on either backend.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "common/strings.h"
#include "compute_nodes/backend/engine_factory.h"
#include "compute_nodes/model/flops.h"
#include "compute_nodes/model/make_random.h"
#if STRATA_WITH_CUDA
#include "compute_nodes/backend/cuda/cuda_engine.h"
#endif

namespace strata::cli {
namespace {

constexpr double kBf16PeakFlops = 790e12;

struct Args {
  std::string backend = "cuda", preset = "v3-shape-4l", model_dir, json;
  int64_t prompt = 4096, batch = 1, repeats = 5, warmup = 2, num_layers = 0;
  bool moe_grouped = true;
};

std::unique_ptr<runtime::Engine> OpenOrFail(const Args& a, int64_t num_pages) {
  if (!a.model_dir.empty()) {
    backend::EngineOptions options;
    options.backend = a.backend;
    options.model_dir = a.model_dir;
    options.num_pages = num_pages;
    auto opened = backend::OpenEngine(options);
    if (!opened.ok()) Fail(1, StrCat("bench prefill: ", opened.status().ToString()));
    return std::move(opened->engine);
  }
#if STRATA_WITH_CUDA
  if (a.backend == "cuda") {
    if (auto st = cuda::CudaAvailable(); !st.ok()) Fail(2, StrCat("bench prefill: ", st.message()));
    auto config = model::PresetConfig(a.preset);
    if (!config.ok()) Fail(2, config.status().ToString());
    if (a.num_layers > 0) {
      config->num_hidden_layers = std::min(a.num_layers, config->num_hidden_layers);
    }
    auto weights = cuda::DeviceWeights::Random(*config, 7);
    if (!weights.ok()) Fail(1, weights.status().ToString());
    cuda::CudaEngineOptions options;
    options.num_pages = num_pages;
    options.moe_grouped = a.moe_grouped;
    auto engine = cuda::CudaEngine::Create(std::move(*weights), options);
    if (!engine.ok()) Fail(1, engine.status().ToString());
    return std::move(*engine);
  }
#endif
  Fail(2, StrCat("bench prefill: --preset draws weights on the GPU (--backend cuda in a CUDA "
                 "build); for --backend ",
                 a.backend, " pass --model (strata model make-random writes one)"));
}

void Run(const Args& a) {
  if (a.prompt <= 0 || a.batch <= 0 || a.repeats <= 0 || a.warmup < 0) {
    Fail(2,
         "bench prefill: --prompt, --batch and --repeats must be positive, --warmup not negative");
  }
  const int64_t pages_per_seq = (a.prompt + 63) / 64;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<runtime::Engine> engine = OpenOrFail(a, a.batch * pages_per_seq + 1);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const model::ModelConfig& c = engine->config();
  if (a.prompt > c.max_position_embeddings && c.max_position_embeddings > 0) {
    Fail(2, StrCat("bench prefill: --prompt ", a.prompt, " is past the model's ",
                   c.max_position_embeddings, " positions"));
  }
  const model::ForwardFlops per_seq = model::PrefillFlops(c, a.prompt, 0, 1);
  const double flops = per_seq.total() * static_cast<double>(a.batch);
  const std::string model_name = a.model_dir.empty() ? a.preset : a.model_dir;
  std::cout << fmt::format(
      "bench prefill: {} on {} ({} layers, {} heads, {} experts top-{}), {} x {} tokens, "
      "{:.4g} TFLOP per call (attention {:.0f} %), loaded in {:.1f} s\n",
      model_name, a.backend, c.num_hidden_layers, c.num_attention_heads, c.n_routed_experts,
      c.num_experts_per_tok, a.batch, a.prompt, flops / 1e12,
      100 * per_seq.attention / per_seq.total(), load_s);

  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts(a.batch, std::vector<int32_t>(a.prompt));
  std::vector<double> ms;
  for (int64_t repeat = -a.warmup; repeat < a.repeats; ++repeat) {  // < 0: warm-up calls
    std::vector<runtime::PageTable> pages(a.batch);
    std::vector<runtime::SequenceInput> batch(a.batch);
    for (int64_t s = 0; s < a.batch; ++s) {
      for (int32_t& t : prompts[s]) t = static_cast<int32_t>(rng() % c.vocab_size);
      if (auto st = runtime::EnsureCapacity(engine->kv_pool(), pages[s], a.prompt); !st.ok()) {
        Fail(1, StrCat("bench prefill: ", st.ToString()));
      }
      batch[s].tokens = prompts[s];
      batch[s].pages = &pages[s];
      batch[s].form = runtime::AttentionForm::kMha;
      batch[s].draw = runtime::TokenDraw{};  // greedy: the token, not the logits, comes back
    }
    std::vector<runtime::SequenceOutput> out;
    const auto s0 = std::chrono::steady_clock::now();
    if (auto st = engine->Forward(batch, &out); !st.ok()) Fail(1, st.ToString());
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    if (repeat >= 0) ms.push_back(t);
    for (auto& p : pages) runtime::ReleasePages(engine->kv_pool(), p);
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2];
  const double tflops = flops / (med * 1e-3) / 1e12;
  const double mfu = flops / (med * 1e-3) / kBf16PeakFlops;
  std::cout << fmt::format(
      "median {:.3f} ms (min {:.3f}) over {} calls: {:.0f} tokens/s, {:.1f} TFLOPS, MFU {:.3f} "
      "(of 790 TFLOPS bf16)\n",
      med, sorted.front(), ms.size(), a.batch * a.prompt / (med * 1e-3), tflops, mfu);
  if (!a.json.empty()) {
    nlohmann::json report = {{"backend", a.backend},
                             {"model", model_name},
                             {"num_layers", c.num_hidden_layers},
                             {"prompt", a.prompt},
                             {"batch", a.batch},
                             {"moe_grouped", a.moe_grouped},
                             {"flops",
                              {{"projections", per_seq.projections * a.batch},
                               {"attention", per_seq.attention * a.batch},
                               {"mlp", per_seq.mlp * a.batch},
                               {"lm_head", per_seq.lm_head * a.batch},
                               {"total", flops}}},
                             {"ms", ms},
                             {"ms_median", med},
                             {"tokens_per_second", a.batch * a.prompt / (med * 1e-3)},
                             {"tflops", tflops},
                             {"peak_tflops", kBf16PeakFlops / 1e12},
                             {"ratios", {{StrCat("prefill_", a.prompt, "_mfu"), mfu}}}};
    std::ofstream f(a.json);
    f << report.dump(2) << "\n";
    if (!f) Fail(1, StrCat("bench prefill: cannot write ", a.json));
  }
}

}  // namespace

void RegisterBenchPrefillCommand(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "prefill", "Time whole-model prefill of long prompts and report its MFU");
  cmd->add_option("--backend", a->backend, "cuda or cpu")->default_val("cuda");
  cmd->add_option("--preset", a->preset, "Random weights of this preset (drawn on the GPU)")
      ->default_val("v3-shape-4l");
  cmd->add_option("--model", a->model_dir, "A checkpoint directory instead of --preset");
  cmd->add_option("--prompt", a->prompt, "Tokens per prompt")->default_val(4096);
  cmd->add_option("--batch", a->batch, "Prompts prefilled together in one call")->default_val(1);
  cmd->add_option("--repeats", a->repeats, "Timed calls")->default_val(5);
  cmd->add_option("--warmup", a->warmup, "Untimed calls first (clocks, allocations, GEMM plans)")
      ->default_val(2);
  cmd->add_option("--num-layers", a->num_layers, "Keep only the first N layers of the preset");
  cmd->add_option("--moe-grouped", a->moe_grouped,
                  "With --preset: prefill MoE through the grouped wgmma GEMMs (0: one cuBLAS GEMM "
                  "pair per expert)")
      ->default_val(true);
  cmd->add_option("--json", a->json, "Write the figures as JSON to this file");
  cmd->callback([a] { Run(*a); });
}

}  // namespace strata::cli
