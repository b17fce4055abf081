// Summaries of simulation results: per-policy figures, JSON, and a hand-written SVG plot
// (TTFT CDF per policy, token hit ratio over time).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/placement/policy.h"
#include "scheduler/simulator/simulator.h"

namespace strata::scheduler::sim {

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

// Nearest-rank percentiles of `values` (all zero when empty).
Percentiles ComputePercentiles(std::vector<double> values);

struct PolicySummary {
  std::string policy;
  uint64_t requests = 0;
  uint64_t completed = 0;
  uint64_t rejected = 0;
  double token_hit_ratio = 0;
  Percentiles ttft_s;
  Percentiles tbt_s;                // over requests with more than one output token
  double slo_attainment = 0;        // of all requests, rejected ones count as misses
  double goodput_rps = 0;           // requests within both objectives per second of makespan
  double goodput_tokens_per_s = 0;  // their output tokens per second
  uint64_t moved_blocks = 0;
  Percentiles decision_us;
  double makespan_s = 0;
  std::vector<double> hit_ratio_over_time;  // per bucket of `bucket_s` by arrival
  double bucket_s = 60;
  std::vector<double> ttft_sorted;  // completed requests, ascending (for the CDF)
  PrefillModel calibrated_prefill;
};

PolicySummary Summarize(const SimulationResult& result, const Objectives& objectives,
                        double bucket_s = 60);

struct ReplayReport {
  std::string trace;
  std::string cluster;
  double unlimited_hit_ratio = 0;
  Objectives objectives;
  std::vector<PolicySummary> policies;
};

std::string ReportJson(const ReplayReport& report);
std::string ReportSvg(const ReplayReport& report);
std::string ReportTable(const ReplayReport& report);

absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace strata::scheduler::sim
