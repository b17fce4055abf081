// Commands of the global scheduler (scheduler/): `strata bench replay`.
#include "cli/commands.h"
#include "scheduler/simulator/replay_command.h"

namespace strata::cli {

void RegisterSchedulerCommands(CLI::App& app) {
  scheduler::sim::RegisterBenchReplayCommand(BenchGroup(app));
}

}  // namespace strata::cli
