// Subcommands of the `strata` binary. Each lives in its own file (cli/<name>_command.cc, or in
// its module) and registers itself on the root CLI11 app; main.cc only calls the Register
// functions, in the order they appear in --help.
//
// Groups shared by several modules: `strata bench <what>` and `strata admin <what>`. Modules
// add their commands under BenchGroup(app) / AdminGroup(app).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string_view>
#include <vector>

namespace strata::cli {

// The `bench` and `admin` parent commands (created on first use).
CLI::App& BenchGroup(CLI::App& app);
CLI::App& AdminGroup(CLI::App& app);

// Exit code for a failed command: print `message` to stderr and make main() return `code`.
[[noreturn]] void Fail(int code, const std::string& message);

// Token ids written as "1,2,3", "[1, 2, 3]" or separated by whitespace; a bad id Fail()s with
// exit code 2, naming `context` (the command).
std::vector<int32_t> ParseTokenIdsOrFail(std::string_view text, std::string_view context);

void RegisterConfigCommand(CLI::App& app);         // strata config print
void RegisterInfoCommand(CLI::App& app);           // strata info
void RegisterCacheCommand(CLI::App& app);          // strata cache (the cache server daemon)
void RegisterWorkerCommand(CLI::App& app);         // strata worker (a compute node daemon)
void RegisterAdminCacheCommand(CLI::App& app);     // strata admin cache ...
void RegisterSchedulerCommands(CLI::App& app);     // strata bench replay (scheduler/)
void RegisterBenchTransferCommand(CLI::App& app);  // strata bench transfer
void RegisterBenchStoreCommand(CLI::App& app);     // strata bench store
void RegisterBenchWorkerCommand(CLI::App& app);    // strata bench worker
void RegisterUpCommand(CLI::App& app);             // strata up (a local cluster)
void RegisterChatCommand(CLI::App& app);           // strata chat (a demo client of the API)
void RegisterModelCommand(CLI::App& app);          // strata model make-random | logits
void RegisterGenerateCommand(CLI::App& app);       // strata generate

// strata scheduler (the global scheduler daemon and OpenAI gateway, scheduler/server/)
void RegisterSchedulerServeCommand(CLI::App& app);
// strata admin scheduler nodes|drain|policy|index
void RegisterAdminSchedulerCommand(CLI::App& app);

// strata batch (offline batch inference through the gateway, scheduler/batch/)
void RegisterBatchCommand(CLI::App& app);

// strata tokenize (compute_nodes/tokenizer)
void RegisterTokenizeCommand(CLI::App& app);

// strata bench kernels (kernels/; only in builds with STRATA_WITH_CUDA)
void RegisterBenchKernelsCommand(CLI::App& app);
// strata bench decode (whole-model decode steps on the CUDA backend; STRATA_WITH_CUDA only)
void RegisterBenchDecodeCommand(CLI::App& app);
// strata bench kv-pool (block payloads <-> KV pages of the CUDA or the host pool)
void RegisterBenchKvPoolCommand(CLI::App& app);
// strata bench prefill (whole-model prefill MFU; cuda or cpu)
void RegisterBenchPrefillCommand(CLI::App& app);

}  // namespace strata::cli
