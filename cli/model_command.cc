// strata model make-random | logits, and strata generate: random checkpoints, reference logits
// for external comparison (.npy), and token generation with its speed.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/generate_remote.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "compute_nodes/backend/engine_factory.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/runtime/generate.h"
#include "compute_nodes/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

// Token ids from "1,2,3" or from a file of ids separated by whitespace or commas.
std::vector<int32_t> ParseIds(const std::string& list, const std::string& file) {
  std::string text = list;
  if (!file.empty()) {
    auto contents = ReadFile(file);
    if (!contents.ok()) Fail(2, std::string(contents.status().message()));
    text = *std::move(contents);
  }
  std::vector<int32_t> ids = ParseTokenIdsOrFail(text, "model");
  if (ids.empty()) Fail(2, "no token ids given");
  return ids;
}

// float32 .npy, C order, shape [rows, cols].
void WriteNpy(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  out.close();
  if (!out) Fail(1, StrCat("writing ", path, " failed"));
}

// The model on `backend` ("cpu" or "cuda"), with pages for `tokens` tokens. Exit 2 for a backend
// this binary lacks (or no GPU), 1 for a model that does not load.
std::unique_ptr<runtime::Engine> OpenModel(const std::string& dir, const std::string& backend,
                                           int64_t tokens) {
  backend::EngineOptions options;
  options.backend = backend;
  options.model_dir = dir;
  options.num_pages = (tokens + 63) / 64 + 1;
  auto opened = backend::OpenEngine(options);
  if (!opened.ok()) {
    const absl::StatusCode code = opened.status().code();
    Fail(code == absl::StatusCode::kUnimplemented || code == absl::StatusCode::kUnavailable ||
                 code == absl::StatusCode::kInvalidArgument
             ? 2
             : 1,
         opened.status().ToString());
  }
  return std::move(opened->engine);
}

void CheckBackend(const std::string& backend) {
  for (const std::string& b : backend::CompiledBackends()) {
    if (b == backend) return;
  }
  Fail(2, StrCat("backend '", backend, "' is not available in this build (",
                 StrJoin(backend::CompiledBackends(), ", "), ")"));
}

}  // namespace

void RegisterModelCommand(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model", "Model checkpoints and reference logits");
  model->require_subcommand(1);

  struct MakeArgs {
    std::string preset, config, out;
    uint64_t seed = 0;
    size_t shard_mb = 2048;
    int64_t num_layers = 0;
  };
  auto mk = std::make_shared<MakeArgs>();
  CLI::App* make = model->add_subcommand("make-random", "Write a random-weight HF checkpoint");
  make->add_option("--preset", mk->preset,
                   "tiny | small-v3 | small-v2 | v2-lite-shape | v3-shape-4l");
  make->add_option("--config", mk->config, "A DeepSeek-V2/V3 config.json instead of a preset");
  make->add_option("--seed", mk->seed, "Random seed")->default_val(0);
  make->add_option("--out", mk->out, "Output directory")->required();
  make->add_option("--shard-mb", mk->shard_mb, "Shard size in MiB")->default_val(2048);
  make->add_option("--num-layers", mk->num_layers,
                   "Keep only the first N layers (0: the preset's); a cut model, not the preset");
  make->callback([mk] {
    if (mk->preset.empty() == mk->config.empty()) Fail(2, "give exactly one of --preset, --config");
    auto config =
        mk->preset.empty() ? model::LoadModelConfig(mk->config) : model::PresetConfig(mk->preset);
    if (!config.ok()) Fail(2, config.status().ToString());
    if (mk->num_layers < 0 || mk->num_layers > config->num_hidden_layers) {
      Fail(2, StrCat("--num-layers must be in [0, ", config->num_hidden_layers, "]"));
    }
    if (mk->num_layers > 0) config->num_hidden_layers = mk->num_layers;
    model::MakeRandomOptions options;
    options.seed = mk->seed;
    options.shard_bytes = mk->shard_mb << 20;
    const auto t0 = std::chrono::steady_clock::now();
    if (auto st = model::MakeRandomCheckpoint(*config, options, mk->out); !st.ok()) {
      Fail(1, st.ToString());
    }
    std::cout << fmt::format(
        "wrote {} ({} layers, hidden {}, seed {}) in {:.1f} s\n", mk->out,
        config->num_hidden_layers, config->hidden_size, mk->seed,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });

  struct LogitsArgs {
    std::string dir, ids_file, ids_list, out, backend = "cpu";
  };
  auto lg = std::make_shared<LogitsArgs>();
  CLI::App* logits = model->add_subcommand("logits", "Write every position's logits as .npy");
  logits->add_option("--model", lg->dir, "Model directory (HF format)")->required();
  logits->add_option("--ids", lg->ids_file, "File of token ids");
  logits->add_option("--ids-list", lg->ids_list, "Token ids, comma separated");
  logits->add_option("--out", lg->out, "Output .npy (float32 [tokens, vocab])")->required();
  logits->add_option("--backend", lg->backend, "cpu | cuda")->default_val("cpu");
  logits->callback([lg] {
    CheckBackend(lg->backend);
    const std::vector<int32_t> ids = ParseIds(lg->ids_list, lg->ids_file);
    auto engine = OpenModel(lg->dir, lg->backend, static_cast<int64_t>(ids.size()));
    runtime::PageTable pages;
    if (auto st = runtime::EnsureCapacity(engine->kv_pool(), pages, ids.size()); !st.ok()) {
      Fail(1, st.ToString());
    }
    runtime::SequenceInput in{ids, 0, &pages, /*all_logits=*/true, runtime::AttentionForm::kMha};
    std::vector<runtime::SequenceOutput> out;
    if (auto st = engine->Forward({&in, 1}, &out); !st.ok()) Fail(1, st.ToString());
    WriteNpy(lg->out, out[0].logits, out[0].rows, engine->config().vocab_size);
    std::cout << fmt::format("wrote {} ({} x {})\n", lg->out, out[0].rows,
                             engine->config().vocab_size);
  });
}

void RegisterGenerateCommand(CLI::App& app) {
  struct Args {
    std::string dir, prompt, prompt_ids, backend = "cpu";
    std::vector<std::string> stops;
    runtime::SamplingParams sampling;
    int64_t chunk = 256;
    std::string worker, prefill, decode, cache_salt;
  };
  auto a = std::make_shared<Args>();
  CLI::App* gen = app.add_subcommand("generate", "Generate tokens from a prompt");
  gen->add_option("--model", a->dir, "Model directory (HF format)")->required();
  gen->add_option("--prompt", a->prompt, "Prompt text (encoded with the model's tokenizer.json)");
  gen->add_option("--prompt-ids", a->prompt_ids, "Prompt token ids, comma separated");
  gen->add_option("--max-tokens", a->sampling.max_tokens, "Tokens to generate")->default_val(16);
  gen->add_option("--temperature", a->sampling.temperature, "0: greedy")->default_val(0.0f);
  gen->add_option("--top-k", a->sampling.top_k, "0: all")->default_val(0);
  gen->add_option("--top-p", a->sampling.top_p, "Nucleus mass")->default_val(1.0f);
  gen->add_option("--seed", a->sampling.seed, "Sampling seed")->default_val(0);
  gen->add_option("--stop-id", a->sampling.stop_ids, "Stop at these ids");
  gen->add_option("--stop", a->stops, "Stop once the output text contains this (with --prompt)");
  gen->add_option("--prefill-chunk", a->chunk, "Prefill chunk tokens")->default_val(256);
  gen->add_option("--backend", a->backend, "cpu | cuda")->default_val("cpu");
  gen->add_option("--worker", a->worker, "Run on this worker daemon (gRPC host:port) instead");
  gen->add_option("--prefill", a->prefill, "Prefill on this worker daemon, then --decode");
  gen->add_option("--decode", a->decode, "Decode on this worker daemon (after --prefill)");
  gen->add_option("--cache-salt", a->cache_salt, "Tenant salt of the KV namespace (workers)");
  gen->callback([a] {
    const bool remote = !a->worker.empty() || !a->prefill.empty() || !a->decode.empty();
    if (remote &&
        (a->worker.empty() == a->prefill.empty() || a->prefill.empty() != a->decode.empty())) {
      Fail(2, "give --worker, or both --prefill and --decode");
    }
    if (!remote) CheckBackend(a->backend);
    if (a->prompt.empty() == a->prompt_ids.empty()) {
      Fail(2, "give exactly one of --prompt, --prompt-ids");
    }
    // With --prompt, text goes through the model's tokenizer both ways: the prompt is encoded,
    // the output streamed as whole UTF-8 characters, and --stop strings are matched on it.
    std::unique_ptr<tokenizer::Tokenizer> tok;
    std::vector<int32_t> prompt;
    if (!a->prompt.empty()) {
      auto loaded = tokenizer::Tokenizer::Load(a->dir);
      if (!loaded.ok()) Fail(1, loaded.status().ToString());
      tok = std::move(*loaded);
      auto ids = tok->Encode(a->prompt, /*add_special_tokens=*/true);
      if (!ids.ok()) Fail(2, ids.status().ToString());
      prompt = std::move(*ids);
      a->sampling.stop_strings = a->stops;
      a->sampling.detokenize = [t = tok.get()](std::span<const int32_t> out) {
        return t->Decode(out);
      };
    } else {
      prompt = ParseIds(a->prompt_ids, "");
    }
    if (remote) {
      // The model directory only provides the tokenizer here; the workers hold the model.
      RunRemoteGenerate({.worker = a->worker,
                         .prefill = a->prefill,
                         .decode = a->decode,
                         .prompt = prompt,
                         .sampling = a->sampling,
                         .cache_salt = a->cache_salt});
      return;
    }
    auto engine =
        OpenModel(a->dir, a->backend, static_cast<int64_t>(prompt.size()) + a->sampling.max_tokens);
    std::optional<tokenizer::StreamDecoder> stream;
    if (tok) stream.emplace(tok.get());
    auto result = runtime::Generate(*engine, prompt, a->sampling, a->chunk, [&](int32_t id) {
      if (stream) {
        std::cout << stream->Add(id) << std::flush;
      } else {
        std::cout << id << ' ' << std::flush;
      }
    });
    if (stream) std::cout << stream->Flush();
    if (!result.ok()) Fail(1, result.status().ToString());
    const size_t n = result->tokens.size();
    std::cout << "\n"
              << fmt::format(
                     "prompt {} tokens: prefill {:.1f} tok/s; generated {} tokens: decode {:.1f} "
                     "tok/s\n",
                     prompt.size(), prompt.size() / std::max(result->prefill_seconds, 1e-9), n,
                     n > 1 ? (n - 1) / std::max(result->decode_seconds, 1e-9) : 0.0);
  });
}

}  // namespace strata::cli
