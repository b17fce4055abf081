// strata worker [--config FILE] [--set key=value]... [--role R] [--model DIR] [--ready-file PATH]
//
// A compute node: loads the model, serves the Worker gRPC API (prefill, decode, generate) with
// /metrics and /healthz, moves KV blocks through its cache server, registers with the scheduler
// when one is configured; until SIGINT or SIGTERM.
#include <memory>

#include "cli/commands.h"
#include "cli/daemon.h"
#include "cli/strata_config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "compute_nodes/worker/worker_server.h"

namespace strata::cli {
namespace {

absl::StatusOr<worker::WorkerServerOptions> ToWorkerOptions(const StrataConfig& config) {
  const WorkerSection& w = config.worker;
  worker::WorkerServerOptions o;
  if (w.model.empty()) {
    return absl::InvalidArgumentError("worker.model (or --model) names no model directory");
  }
  o.node_id = w.node_id;
  o.role = w.role == "prefill"  ? v1::ROLE_PREFILL
           : w.role == "decode" ? v1::ROLE_DECODE
                                : v1::ROLE_BOTH;
  o.model_dir = w.model;
  o.backend = w.backend;
  o.listen = w.listen;
  o.http_listen = w.http_listen;
  o.host_id = w.host_id;
  o.cache_address = w.cache_address;
  o.scheduler_address = w.scheduler_address;
  if (!config.cluster.secret_file.empty()) {
    auto secret = ReadSecretFile(config.cluster.secret_file, "cluster secret");
    if (!secret.ok()) return secret.status();
    o.cluster_secret = *secret;
  }
  auto transfer = config.transfer.ToEngineOptions(o.host_id, {});  // the client sets both
  if (!transfer.ok()) return transfer.status();
  o.transfer = *transfer;
  o.transfer_timeout = config.transfer.request_timeout;
  o.kv_pages = w.kv_pages;
  o.block_tokens = w.block_tokens;
  if (w.block_tokens & (w.block_tokens - 1)) {
    return absl::InvalidArgumentError("worker.block_tokens must be a power of two");
  }
  o.kv_bf16 = w.kv_precision == "bf16";
  o.cache_read_in_place = w.cache_read_in_place;
  o.core.cache_codec = w.cache_codec == "fp8" ? KvCodec::kFp8E4M3 : KvCodec::kBf16;
  o.core.resident_blocks = w.resident_blocks;
  o.core.token_budget = w.token_budget;
  o.core.max_running = w.max_running;
  o.core.max_queued = w.max_queued;
  if (w.fault_corrupt > 0 || w.fault_delay > 0) {
    o.cache_faults = transfer::FaultPolicy{
        .delay = w.fault_delay, .corrupt = w.fault_corrupt, .delay_by = w.fault_delay_by};
  }
  return o;
}

}  // namespace

void RegisterWorkerCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("worker", "Run a compute node (prefill, decode or both)");
  auto flags = std::make_shared<ConfigFlags>();
  auto ready_file = std::make_shared<std::string>();
  auto role = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>();
  cmd->add_option("--config,-c", flags->file, "YAML config file")->check(CLI::ExistingFile);
  cmd->add_option("--set", flags->overrides, "Override one key: key=value (repeatable)");
  cmd->add_option("--role", *role, "prefill | decode | both (worker.role)");
  cmd->add_option("--model", *model, "Model directory (worker.model)");
  cmd->add_option("--ready-file", *ready_file,
                  "Write 'grpc=PORT http=PORT' here once serving (for scripts and tests)");
  cmd->callback([flags, ready_file, role, model] {
    std::vector<std::string> extra;
    if (!role->empty()) extra.push_back("worker.role=" + *role);
    if (!model->empty()) extra.push_back("worker.model=" + *model);
    const StrataConfig config = LoadDaemonConfig(*flags, "worker", extra);
    auto options = ToWorkerOptions(config);
    if (!options.ok()) Fail(2, StrCat("config: ", options.status().message()));
    const sigset_t signals = BlockTerminationSignals();
    worker::WorkerServer server(*std::move(options));
    if (absl::Status st = server.Start(); !st.ok()) Fail(1, StrCat("worker: ", st.message()));
    ServeUntilSignal(server, signals, *ready_file,
                     StrCat("grpc=", server.grpc_port(), " http=", server.http_port()), "worker");
  });
}

}  // namespace strata::cli
