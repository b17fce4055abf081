#include "cli/up/local_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/model/make_random.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// `count` distinct free ports on 127.0.0.1. The sockets stay bound until all are picked, so the
// ports differ; another process could still take one before its daemon binds it (then that daemon
// fails to start and says so).
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::UnavailableError(StrCat("no free loopback port: ", std::strerror(errno)));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  RETURN_IF_ERROR(status);
  return ports;
}

absl::Status WriteFile(const std::string& path, const std::string& text, fs::perms perms) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) return absl::InternalError(StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  fs::permissions(tmp, perms, ec);
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("cannot write ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomToken() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[24];
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    return absl::InternalError("cannot read /dev/urandom");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

model::MakeRandomOptions MakeOptions(const UpSection& up) {
  model::MakeRandomOptions options;
  options.seed = static_cast<uint64_t>(up.model_seed);
  return options;
}

std::string Loopback(int port) { return StrCat("127.0.0.1:", port); }

}  // namespace

absl::StatusOr<std::string> EnsureLocalModel(const UpSection& up, const std::string& run_dir,
                                             bool* made) {
  *made = false;
  std::error_code ec;
  if (fs::exists(fs::path(up.model) / "config.json", ec)) return fs::absolute(up.model).string();
  const std::vector<std::string> presets = model::PresetNames();
  if (std::find(presets.begin(), presets.end(), up.model) == presets.end()) {
    return absl::InvalidArgumentError(
        StrCat("up.model '", up.model,
               "' is neither a model directory (with config.json) nor a "
               "preset (",
               StrJoin(presets, ", "), ")"));
  }
  const std::string dir = (fs::path(run_dir) / "models" / up.model).string();
  if (fs::exists(fs::path(dir) / "config.json", ec)) return dir;
  ASSIGN_OR_RETURN(model::ModelConfig preset, model::PresetConfig(up.model));
  // Made in a side directory and renamed, so an interrupted first run leaves no half model.
  const std::string tmp = dir + ".partial";
  fs::remove_all(tmp, ec);
  RETURN_IF_ERROR_WITH(model::MakeRandomCheckpoint(preset, MakeOptions(up), tmp),
                       StrCat("making the ", up.model, " model"));
  fs::rename(tmp, dir, ec);
  if (ec) return absl::InternalError(StrCat("cannot move the model to ", dir, ": ", ec.message()));
  *made = true;
  return dir;
}

absl::StatusOr<LocalCluster> PlanLocalCluster(StrataConfig& config, const ConfigSchema& schema,
                                              const std::string& exe) {
  const UpSection& up = config.up;
  const int workers = static_cast<int>(up.prefill_workers + up.decode_workers + up.workers);
  if (workers == 0) return absl::InvalidArgumentError("the cluster has no workers (up.*workers)");
  if ((up.prefill_workers == 0) != (up.decode_workers == 0)) {
    return absl::InvalidArgumentError(
        "up.prefill_workers and up.decode_workers must both be 0 or both be at least 1");
  }
  LocalCluster cluster;
  std::error_code ec;
  cluster.run_dir = fs::absolute(up.run_dir).lexically_normal().string();
  config.up.run_dir = cluster.run_dir;
  for (const char* sub : {"", "logs", "cache", "models", "ready"}) {
    fs::create_directories(fs::path(cluster.run_dir) / sub, ec);
    if (ec)
      return absl::InternalError(StrCat("cannot create ", cluster.run_dir, ": ", ec.message()));
  }
  bool made = false;
  ASSIGN_OR_RETURN(cluster.model_dir, EnsureLocalModel(up, cluster.run_dir, &made));
  cluster.model_made = made;
  cluster.model_id = fs::path(cluster.model_dir).filename().string();

  if (config.cluster.admin_token_file.empty()) {
    config.cluster.admin_token_file = cluster.run_dir + "/admin.token";
    if (!fs::exists(config.cluster.admin_token_file, ec)) {
      ASSIGN_OR_RETURN(std::string token, RandomToken());
      RETURN_IF_ERROR(WriteFile(config.cluster.admin_token_file, token + "\n",
                                fs::perms::owner_read | fs::perms::owner_write));
    }
  }

  // Ports: cache grpc/http/transfer, scheduler grpc, then grpc + http per worker.
  ASSIGN_OR_RETURN(std::vector<int> ports, FreeLoopbackPorts(4 + 2 * workers + 1));
  int next = 0;
  auto port = [&] { return ports[next++]; };
  const int http_port = up.http_port != 0 ? static_cast<int>(up.http_port) : port();

  config.log.file.clear();  // daemons log to stderr, which `up` appends to logs/<name>.log
  config.cache.listen = Loopback(port());
  config.cache.http_listen = Loopback(port());
  config.cache.transfer_listen = Loopback(port());
  config.cache.shm_socket = cluster.run_dir + "/cache/shm.sock";
  config.cache.data_dir = cluster.run_dir + "/cache";
  config.scheduler.listen = Loopback(port());
  config.scheduler.http_listen = Loopback(http_port);
  config.scheduler.model = cluster.model_dir;
  config.worker.model = cluster.model_dir;
  config.worker.cache_address = config.cache.listen;
  config.worker.scheduler_address = config.scheduler.listen;
  cluster.config_file = cluster.run_dir + "/cluster.yaml";
  RETURN_IF_ERROR(WriteFile(cluster.config_file,
                            StrCat("# Written by `strata up`: the effective configuration of the "
                                   "local cluster.\n",
                                   schema.Render(/*annotate=*/false)),
                            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                fs::perms::others_read));
  cluster.gateway_url = StrCat("http://", config.scheduler.http_listen);
  cluster.scheduler_address = config.scheduler.listen;
  cluster.cache_address = config.cache.listen;

  auto daemon = [&](const std::string& name, const std::string& command,
                    std::vector<std::string> extra) {
    ProcessSpec spec{.name = name,
                     .argv = {exe, command, "--config", cluster.config_file},
                     .log_file = StrCat(cluster.run_dir, "/logs/", name, ".log"),
                     .ready_file = StrCat(cluster.run_dir, "/ready/", name)};
    spec.argv.push_back("--ready-file");
    spec.argv.push_back(spec.ready_file);
    for (std::string& arg : extra) {
      spec.argv.push_back("--set");
      spec.argv.push_back(std::move(arg));
    }
    cluster.daemons.push_back(std::move(spec));
  };
  daemon("cache", "cache", {});
  daemon("scheduler", "scheduler", {});
  cluster.metrics.emplace_back("cache", config.cache.http_listen);
  cluster.metrics.emplace_back("scheduler", config.scheduler.http_listen);
  auto add_workers = [&](const std::string& role, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      const std::string name = StrCat(role == "both" ? "worker" : role, "-", i);
      const std::string http = Loopback(port());
      daemon(name, "worker",
             {StrCat("worker.role=", role), StrCat("worker.node_id=", name),
              StrCat("worker.listen=", Loopback(port())), StrCat("worker.http_listen=", http)});
      cluster.worker_names.push_back(name);
      cluster.metrics.emplace_back(name, http);
    }
  };
  add_workers("prefill", up.prefill_workers);
  add_workers("decode", up.decode_workers);
  add_workers("both", up.workers);
  return cluster;
}

}  // namespace strata::cli
