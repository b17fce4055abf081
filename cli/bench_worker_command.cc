// strata bench worker: TTFT of a long prompt cold vs mostly cached, prefill and decode tokens/s of
// a worker (CacheServer + CpuEngine + WorkerCore in this process; compute_nodes/worker/bench/).
#include <iostream>

#include "cli/commands.h"
#include "common/logging.h"
#include "common/strings.h"
#include "compute_nodes/worker/bench/worker_bench.h"

namespace strata::cli {

void RegisterBenchWorkerCommand(CLI::App& app) {
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "worker",
      "Worker on the CPU cluster in one process: TTFT of an 8K prompt cold vs 90% cached, "
      "prefill tokens/s, decode tokens/s by batch size");
  struct Flags {
    worker::WorkerBenchOptions o;
    bool json = false;
    std::string codec = "bf16";
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--prompt-tokens", f->o.prompt_tokens, "Tokens of the long prompt")
      ->capture_default_str();
  cmd->add_option("--cached-fraction", f->o.cached_fraction,
                  "Share of the long prompt a previous request already cached")
      ->capture_default_str();
  cmd->add_option("--repeats", f->o.repeats, "Cold/cached pairs (medians are reported)")
      ->capture_default_str();
  cmd->add_option("--batches", f->o.batches, "Decode batch sizes")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--decode-tokens", f->o.decode_tokens, "New tokens per decode request")
      ->capture_default_str();
  cmd->add_option("--token-budget", f->o.token_budget,
                  "Tokens per engine step (worker.token_budget)")
      ->capture_default_str();
  cmd->add_option(
         "--preset", f->o.preset,
         "Shape of the bench model when it is written (tiny, small-v3, v2-lite-shape, ...)")
      ->capture_default_str();
  cmd->add_option("--layers", f->o.layers,
                  "Keep only this many of the preset's layers (0: all); v2-lite-shape --layers 2 "
                  "is one dense and one MoE layer of DeepSeek-V2-Lite")
      ->capture_default_str();
  cmd->add_option("--cache-codec", f->codec, "Codec of the cached blocks: bf16 or fp8")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--model", f->o.model_dir,
                  "Checkpoint to use; a directory without one receives the bench model "
                  "(default: a temp dir)");
  cmd->add_flag("--json", f->json, "Print the results as JSON on stdout");
  cmd->callback([f] {
    // Logs go to stderr and only when something is wrong: stdout is the result.
    if (absl::Status st = InitLogging({.level = "warn", .component = "bench"}); !st.ok()) {
      Fail(1, StrCat("bench worker: ", st.message()));
    }
    f->o.cache_codec = f->codec == "fp8" ? KvCodec::kFp8E4M3 : KvCodec::kBf16;
    auto result = worker::RunWorkerBench(f->o);
    if (!result.ok()) {
      const absl::Status& st = result.status();
      Fail(absl::IsInvalidArgument(st) ? 2 : 1, StrCat("bench worker: ", st.message()));
    }
    if (f->json) {
      std::cout << result->dump(2) << std::endl;
    } else {
      std::cout << worker::FormatWorkerBench(*result) << std::flush;
    }
  });
}

}  // namespace strata::cli
