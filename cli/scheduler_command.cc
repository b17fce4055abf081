// strata scheduler [--config FILE] [--set key=value]... [--model DIR] [--ready-file PATH]
//
// The global scheduler and the cluster's front door: workers register with its Scheduler gRPC
// service, it follows their cache servers' KV events, and it serves the OpenAI-compatible HTTP
// API, placing each request on the workers; until SIGINT or SIGTERM.
#include <memory>

#include "cli/commands.h"
#include "cli/daemon.h"
#include "cli/strata_config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "scheduler/server/scheduler_server.h"

namespace strata::cli {
namespace {

absl::StatusOr<scheduler::SchedulerServerOptions> ToSchedulerOptions(const StrataConfig& config) {
  const SchedulerSection& s = config.scheduler;
  if (s.model.empty()) {
    return absl::InvalidArgumentError(
        "scheduler.model (or --model) names no model directory (needed for the tokenizer)");
  }
  scheduler::SchedulerServerOptions o;
  o.listen = s.listen;
  o.http_listen = s.http_listen;
  o.model_dir = s.model;
  o.scheduler.policy = s.policy;
  o.scheduler.heartbeat_interval = s.heartbeat_interval;
  o.scheduler.missed_heartbeats_limit = static_cast<int>(s.missed_heartbeats);
  o.http_threads = static_cast<int>(s.http_threads);
  o.request_timeout = s.request_timeout;
  if (!config.cluster.admin_token_file.empty()) {
    auto token = ReadSecretFile(config.cluster.admin_token_file, "admin token");
    if (!token.ok()) return token.status();
    o.admin_token = *token;
  }
  if (!s.api_keys_file.empty()) {
    auto keys = ReadSecretFile(s.api_keys_file, "API keys");
    if (!keys.ok()) return keys.status();
    for (std::string_view line : StrSplit(*keys, '\n', /*skip_empty=*/true)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
      if (!line.empty()) o.api_keys.emplace_back(line);
    }
    if (o.api_keys.empty()) return absl::InvalidArgumentError("the API keys file has no key");
  }
  return o;
}

}  // namespace

void RegisterSchedulerServeCommand(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("scheduler", "Run the global scheduler and the OpenAI-compatible API");
  auto flags = std::make_shared<ConfigFlags>();
  auto ready_file = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>();
  cmd->add_option("--config,-c", flags->file, "YAML config file")->check(CLI::ExistingFile);
  cmd->add_option("--set", flags->overrides, "Override one key: key=value (repeatable)");
  cmd->add_option("--model", *model, "Model directory (scheduler.model)");
  cmd->add_option("--ready-file", *ready_file,
                  "Write 'grpc=PORT http=PORT' here once serving (for scripts and tests)");
  cmd->callback([flags, ready_file, model] {
    std::vector<std::string> extra;
    if (!model->empty()) extra.push_back("scheduler.model=" + *model);
    const StrataConfig config = LoadDaemonConfig(*flags, "scheduler", extra);
    auto options = ToSchedulerOptions(config);
    if (!options.ok()) Fail(2, StrCat("config: ", options.status().message()));
    const sigset_t signals = BlockTerminationSignals();
    scheduler::SchedulerServer server(*std::move(options));
    if (absl::Status st = server.Start(); !st.ok()) Fail(1, StrCat("scheduler: ", st.message()));
    ServeUntilSignal(server, signals, *ready_file,
                     StrCat("grpc=", server.grpc_port(), " http=", server.http_port()),
                     "scheduler");
  });
}

}  // namespace strata::cli
