// strata up [--config cluster.yaml] [--set key=value]... [--ready-file PATH]
//
// Starts a whole Strata cluster on this machine — a cache server, the scheduler with its OpenAI
// API, prefill and decode workers — from one YAML file (default deploy/local/cluster.yaml when it
// exists), makes a random model on first run, prints the endpoints, restarts a daemon that dies,
// and stops everything in order on Ctrl-C or SIGTERM. Logs, data and the effective config live in
// `up.run_dir`.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/strata_config.h"
#include "cli/up/local_cluster.h"
#include "cli/up/process_supervisor.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"
#include "strata/v1/scheduler.grpc.pb.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kDefaultClusterFile[] = "deploy/local/cluster.yaml";

std::string Stamp() { return absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()); }

void Say(const std::string& text) { std::cout << "[" << Stamp() << "] " << text << std::endl; }

std::string SelfExe() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) Fail(1, StrCat("cannot find the strata binary: ", ec.message()));
  return exe.string();
}

// Waits until the scheduler lists every worker as alive (they register after they start).
absl::Status WaitForWorkers(const LocalCluster& cluster, const std::string& token_file,
                            absl::Duration timeout, ProcessSupervisor& supervisor) {
  ASSIGN_OR_RETURN(std::string token, ReadSecretFile(token_file, "admin token"));
  auto stub = v1::SchedulerAdmin::NewStub(
      grpc::CreateChannel(cluster.scheduler_address, grpc::InsecureChannelCredentials()));
  const absl::Time deadline = absl::Now() + timeout;
  std::string missing;
  while (absl::Now() < deadline) {
    supervisor.Poll();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::ListNodesResponse nodes;
    if (stub->ListNodes(&ctx, v1::ListNodesRequest(), &nodes).ok()) {
      missing.clear();
      for (const std::string& name : cluster.worker_names) {
        bool alive = false;
        for (const v1::NodeState& node : nodes.nodes()) {
          alive |= node.node().node_id() == name && node.alive();
        }
        if (!alive) StrAppend(&missing, missing.empty() ? "" : ", ", name);
      }
      if (missing.empty()) return absl::OkStatus();
    }
    usleep(100 * 1000);
  }
  return absl::DeadlineExceededError(
      StrCat("the scheduler did not see every worker registered (missing: ",
             missing.empty() ? "all; the scheduler did not answer" : missing, ")"));
}

void PrintEndpoints(const LocalCluster& cluster) {
  const std::string rel = fs::proximate(cluster.config_file).string();
  std::cout << "\nStrata is up.\n"
            << "  OpenAI API   " << cluster.gateway_url << "/v1   (model \"" << cluster.model_id
            << "\")\n"
            << "  try          curl " << cluster.gateway_url
            << "/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": \""
            << cluster.model_id
            << "\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n"
            << "  scheduler    " << cluster.scheduler_address
            << "   strata admin scheduler --config " << rel << " nodes\n"
            << "  cache        " << cluster.cache_address << "   strata admin cache --config "
            << rel << " stats\n"
            << "  metrics     ";
  for (const auto& [name, address] : cluster.metrics) {
    std::cout << " http://" << address << "/metrics (" << name << ")";
  }
  std::cout << "\n  logs         " << fs::proximate(cluster.run_dir + "/logs").string() << "/\n"
            << "Ctrl-C stops the cluster." << std::endl;
}

struct UpArgs {
  ConfigFlags config;
  std::string ready_file;
};

int RunUp(const UpArgs& args) {
  // Termination signals are taken with sigtimedwait in the supervision loop; blocked before any
  // thread exists so that every thread inherits the mask (children get a clean one).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ConfigFlags flags = args.config;
  if (flags.file.empty() && fs::exists(kDefaultClusterFile)) flags.file = kDefaultClusterFile;
  StrataConfig config;
  ConfigSchema schema;
  config.Register(schema);
  ConfigSources sources;
  sources.file = flags.file;
  sources.overrides = flags.overrides;
  if (absl::Status st = schema.Load(sources); !st.ok()) {
    Fail(2, StrCat("config: ", st.message()));
  }
  Say(StrCat("cluster config: ", flags.file.empty() ? "(built-in defaults)" : flags.file));
  const absl::Time plan_start = absl::Now();
  absl::StatusOr<LocalCluster> planned = PlanLocalCluster(config, schema, SelfExe());
  if (!planned.ok()) Fail(2, std::string(planned.status().message()));
  const LocalCluster& cluster = *planned;
  if (cluster.model_made) {
    Say(StrCat("made a random-weight ", config.up.model, " checkpoint in ",
               fs::proximate(cluster.model_dir).string(), " (first run, ",
               absl::FormatDuration(absl::Trunc(absl::Now() - plan_start, absl::Milliseconds(100))),
               ")"));
  }

  ProcessSupervisor supervisor({.max_backoff = config.up.max_backoff, .on_event = Say});
  auto fail = [&](const absl::Status& st) {
    std::cerr << "strata up: " << st.message() << std::endl;
    Say("stopping what was started");
    supervisor.StopAll(config.up.stop_timeout);
    return 1;
  };
  // The cache first (workers connect to it), then the scheduler (workers register with it).
  for (const ProcessSpec& spec : cluster.daemons) {
    if (absl::Status st = supervisor.Start(spec); !st.ok()) return fail(st);
    if (spec.name == "cache" || spec.name == "scheduler") {
      if (absl::Status st = supervisor.WaitReady(spec.name, config.up.start_timeout); !st.ok()) {
        return fail(st);
      }
    }
  }
  for (const std::string& name : cluster.worker_names) {
    if (absl::Status st = supervisor.WaitReady(name, config.up.start_timeout); !st.ok()) {
      return fail(st);
    }
  }
  if (absl::Status st = WaitForWorkers(cluster, config.cluster.admin_token_file,
                                       config.up.start_timeout, supervisor);
      !st.ok()) {
    return fail(st);
  }
  PrintEndpoints(cluster);
  if (!args.ready_file.empty()) {
    const std::string tmp = args.ready_file + ".tmp";
    std::ofstream(tmp) << "url=" << cluster.gateway_url << " config=" << cluster.config_file
                       << " model=" << cluster.model_id << "\n";
    std::rename(tmp.c_str(), args.ready_file.c_str());
  }

  const timespec tick{.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
  while (true) {
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      Say(StrCat("signal ", sig, ": stopping the cluster (workers, scheduler, then the cache)"));
      break;
    }
    supervisor.Poll();
  }
  supervisor.StopAll(config.up.stop_timeout);
  if (!args.ready_file.empty()) ::unlink(args.ready_file.c_str());
  Say("stopped");
  return 0;
}

}  // namespace

void RegisterUpCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "up", "Start and supervise a local cluster: cache server, scheduler (OpenAI API), workers");
  auto args = std::make_shared<UpArgs>();
  cmd->add_option("--config,-c", args->config.file,
                  StrCat("Cluster YAML (default: ", kDefaultClusterFile, " if present)"))
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args->config.overrides, "Override one key: key=value (repeatable)");
  cmd->add_option("--ready-file", args->ready_file,
                  "Write 'url=… config=… model=…' here once every worker has registered");
  cmd->callback([args] { std::exit(RunUp(*args)); });
}

}  // namespace strata::cli
