// strata: one binary, one subcommand per process kind or tool (ARCHITECTURE.md §1).
#include <CLI/CLI.hpp>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "cli/commands.h"
#include "common/build_info.h"

int main(int argc, char** argv) {
  // Debian's Abseil is built with deadlock detection on (a debug aid): every absl::Mutex lock,
  // and gRPC takes many per call, would update a lock-order graph. Off, as in release Abseil.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"Strata: a KV-cache-centric, disaggregated LLM serving system", "strata"};
  app.set_version_flag("--version,-V", std::string("strata ") + strata::kVersion);
  app.require_subcommand(1);
  app.fallthrough();

  strata::cli::RegisterConfigCommand(app);
  strata::cli::RegisterInfoCommand(app);
  strata::cli::RegisterUpCommand(app);
  strata::cli::RegisterChatCommand(app);
  strata::cli::RegisterCacheCommand(app);
  strata::cli::RegisterWorkerCommand(app);
  strata::cli::RegisterSchedulerCommands(app);
  strata::cli::RegisterSchedulerServeCommand(app);
  strata::cli::RegisterAdminSchedulerCommand(app);
  strata::cli::RegisterBatchCommand(app);
  strata::cli::RegisterTokenizeCommand(app);
  strata::cli::RegisterModelCommand(app);
  strata::cli::RegisterGenerateCommand(app);
  strata::cli::RegisterAdminCacheCommand(app);
  strata::cli::RegisterBenchTransferCommand(app);
  strata::cli::RegisterBenchStoreCommand(app);
  strata::cli::RegisterBenchWorkerCommand(app);
  strata::cli::RegisterBenchPrefillCommand(app);
  strata::cli::RegisterBenchKvPoolCommand(app);
#if STRATA_WITH_CUDA
  strata::cli::RegisterBenchKernelsCommand(app);
  strata::cli::RegisterBenchDecodeCommand(app);
#endif

  CLI11_PARSE(app, argc, argv);
  return 0;
}
