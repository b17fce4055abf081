// `strata bench replay` (registered under the bench group) and its library entry point.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/simulator/report.h"
#include "scheduler/simulator/simulator.h"

namespace strata::scheduler::sim {

struct ReplayOptions {
  std::string trace_path;
  std::string policy = "all";  // a name, a comma-separated list, or "all"
  double speedup = 1.0;        // arrival times are divided by this
  SimulationOptions simulation;
};

// Loads the trace and simulates every requested policy on the same cluster model.
absl::StatusOr<ReplayReport> RunReplay(const ReplayOptions& options);

// Adds `replay` to `bench` (the `strata bench` group).
void RegisterBenchReplayCommand(CLI::App& bench);

}  // namespace strata::scheduler::sim
