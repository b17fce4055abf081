// strata bench replay: replays a Mooncake-format trace through the placement policies against
// the modelled cluster and reports hit ratio, TTFT/TBT percentiles, SLO attainment and goodput.
#include "scheduler/simulator/replay_command.h"

#include <cstdio>

#include "common/status.h"
#include "common/strings.h"
#include "scheduler/simulator/report.h"
#include "scheduler/simulator/simulator.h"
#include "scheduler/simulator/trace.h"

namespace strata::scheduler::sim {

namespace {

struct ReplayFlags {
  std::string trace;
  std::string policy = "all";
  uint32_t nodes = 0;
  uint32_t decode_nodes = 0;
  std::string json_path;
  std::string svg_path;
  double ttft_slo = 5.0;
  double tbt_slo = 0.1;
  double reject_factor = 0;
  double speedup = 1.0;
  int64_t gpu_cache_tokens = -1, dram_cache_tokens = -1, ssd_cache_tokens = -1;
};

[[noreturn]] void Fail(std::string_view message) {
  std::fprintf(stderr, "replay: %.*s\n", int(message.size()), message.data());
  throw CLI::RuntimeError(1);
}

}  // namespace

absl::StatusOr<ReplayReport> RunReplay(const ReplayOptions& options) {
  ASSIGN_OR_RETURN(std::vector<TraceRequest> trace, LoadMooncakeTrace(options.trace_path));
  if (trace.empty())
    return absl::InvalidArgumentError(StrCat("trace ", options.trace_path, " is empty"));
  if (options.speedup <= 0) return absl::InvalidArgumentError("--speedup must be positive");
  for (TraceRequest& r : trace) r.arrival_s /= options.speedup;
  std::vector<std::string> policies;
  if (options.policy == "all") {
    policies = PolicyNames();
  } else {
    for (std::string_view p : StrSplit(options.policy, ',', /*skip_empty=*/true)) {
      ASSIGN_OR_RETURN(auto unused, MakePolicy(p));
      (void)unused;
      policies.emplace_back(p);
    }
  }
  ReplayReport report;
  report.trace = options.trace_path;
  report.cluster = options.simulation.cluster.Describe();
  report.unlimited_hit_ratio =
      UnlimitedCacheHitRatio(trace, options.simulation.cluster.block_tokens);
  report.objectives = options.simulation.objectives;
  for (const std::string& policy : policies) {
    SimulationOptions sim = options.simulation;
    sim.policy = policy;
    ASSIGN_OR_RETURN_WITH(SimulationResult result, Simulate(trace, sim), "policy ", policy);
    report.policies.push_back(Summarize(result, sim.objectives));
  }
  return report;
}

void RegisterBenchReplayCommand(CLI::App& bench) {
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "replay",
      "Replay a Mooncake-format trace through the placement policies (simulated cluster)");
  cmd->add_option("--trace", flags->trace,
                  "Trace file (JSONL: timestamp, input_length, "
                  "output_length, hash_ids)")
      ->required();
  cmd->add_option("--policy", flags->policy,
                  "random | round_robin | least_loaded | cache_aware_local | strata | all, or a "
                  "comma-separated list")
      ->capture_default_str();
  cmd->add_option("--nodes", flags->nodes, "Prefill nodes (default: the cluster model's 8)");
  cmd->add_option("--decode-nodes", flags->decode_nodes, "Decode nodes (default 4)");
  cmd->add_option("--json", flags->json_path, "Write the results as JSON");
  cmd->add_option("--svg", flags->svg_path, "Write a plot (TTFT CDF, hit ratio over time) as SVG");
  cmd->add_option("--ttft-slo", flags->ttft_slo, "TTFT objective, seconds")->capture_default_str();
  cmd->add_option("--tbt-slo", flags->tbt_slo, "TBT objective, seconds")->capture_default_str();
  cmd->add_option("--reject-factor", flags->reject_factor,
                  "strata rejects when predicted TTFT > ttft-slo × this (0: never)")
      ->capture_default_str();
  cmd->add_option("--speedup", flags->speedup, "Divide arrival times by this")
      ->capture_default_str();
  cmd->add_option("--gpu-cache-tokens", flags->gpu_cache_tokens, "Per-node GPU prefix cache");
  cmd->add_option("--dram-cache-tokens", flags->dram_cache_tokens, "Per-node DRAM cache");
  cmd->add_option("--ssd-cache-tokens", flags->ssd_cache_tokens, "Per-node SSD cache");
  cmd->callback([flags] {
    ReplayOptions options;
    options.trace_path = flags->trace;
    options.policy = flags->policy;
    options.speedup = flags->speedup;
    ClusterModel& cluster = options.simulation.cluster;
    if (flags->nodes > 0) cluster.prefill_nodes = flags->nodes;
    if (flags->decode_nodes > 0) cluster.decode_nodes = flags->decode_nodes;
    if (flags->gpu_cache_tokens >= 0) cluster.cache_tokens[0] = uint64_t(flags->gpu_cache_tokens);
    if (flags->dram_cache_tokens >= 0) cluster.cache_tokens[1] = uint64_t(flags->dram_cache_tokens);
    if (flags->ssd_cache_tokens >= 0) cluster.cache_tokens[2] = uint64_t(flags->ssd_cache_tokens);
    options.simulation.objectives.ttft_s = flags->ttft_slo;
    options.simulation.objectives.tbt_s = flags->tbt_slo;
    options.simulation.objectives.reject_factor = flags->reject_factor;
    absl::StatusOr<ReplayReport> report = RunReplay(options);
    if (!report.ok()) Fail(ToStd(report.status().message()));
    std::fputs(ReportTable(*report).c_str(), stdout);
    if (!flags->json_path.empty()) {
      if (absl::Status s = WriteFile(flags->json_path, ReportJson(*report)); !s.ok()) {
        Fail(ToStd(s.message()));
      }
    }
    if (!flags->svg_path.empty()) {
      if (absl::Status s = WriteFile(flags->svg_path, ReportSvg(*report)); !s.ok()) {
        Fail(ToStd(s.message()));
      }
    }
  });
}

}  // namespace strata::scheduler::sim
