#include "transfer/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>

#include "common/status.h"
#include "common/strings.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "transfer/transfer_server.h"

extern char** environ;

namespace strata::transfer {

absl::StatusOr<PeerProcessOptions> ParsePeerProcessArgs(const std::vector<std::string>& args) {
  PeerProcessOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(StrCat(flag, " needs a value"));
    const std::string& value = args[++i];
    if (flag == "--secret") {
      o.secret = value;
    } else if (flag == "--host-id") {
      o.host_id = value;
    } else if (flag == "--shm-socket") {
      o.shm_socket_path = value;
    } else if (flag == "--seed") {
      auto v = ParseUint64(value);
      if (!v) return absl::InvalidArgumentError("--seed: not a number");
      o.seed = *v;
    } else if (flag == "--segment") {
      auto parts = StrSplit(value, ':');
      auto size = parts.size() == 2 ? ParseUint64(parts[1]) : std::nullopt;
      if (!size) return absl::InvalidArgumentError("--segment wants name:bytes");
      o.segments.emplace_back(std::string(parts[0]), *size);
    } else {
      return absl::InvalidArgumentError(StrCat("unknown flag ", flag));
    }
  }
  return o;
}

std::vector<std::string> PeerProcessArgs(const PeerProcessOptions& o) {
  std::vector<std::string> args = {"--secret", o.secret, "--host-id",
                                   o.host_id,  "--seed", StrCat(o.seed)};
  if (!o.shm_socket_path.empty()) {
    args.push_back("--shm-socket");
    args.push_back(o.shm_socket_path);
  }
  for (const auto& [name, size] : o.segments) {
    args.push_back("--segment");
    args.push_back(StrCat(name, ":", size));
  }
  return args;
}

int RunPeerProcess(const PeerProcessOptions& options) {
  // stdout carries only the READY line (the parent stops reading it): log to stderr, and never
  // die of a write to a closed pipe.
  spdlog::set_default_logger(spdlog::stderr_color_mt("peer"));
  signal(SIGPIPE, SIG_IGN);
  SegmentRegistry registry;
  for (const auto& [name, size] : options.segments) {
    auto segment = CreateSharedHostSegment(name, size);
    if (!segment.ok()) {
      std::cerr << "peer: " << segment.status() << "\n";
      return 1;
    }
    auto* bytes = static_cast<uint8_t*>(segment->base);
    for (uint64_t i = 0; i < size; ++i) bytes[i] = PatternByte(options.seed, i);
    if (auto st = registry.Register(*std::move(segment)); !st.ok()) {
      std::cerr << "peer: " << st << "\n";
      return 1;
    }
  }
  auto server = TransferServer::Start(&registry, {.host_id = options.host_id,
                                                  .secret = ClusterSecret(options.secret),
                                                  .tcp_listen = "127.0.0.1:0",
                                                  .shm_socket_path = options.shm_socket_path});
  if (!server.ok()) {
    std::cerr << "peer: " << server.status() << "\n";
    return 1;
  }
  std::string tcp, shm;
  for (const Endpoint& e : (*server)->endpoints()) {
    (e.kind == TransportKind::kTcp ? tcp : shm) = e.address;
  }
  std::cout << "READY tcp=" << tcp << " shm=" << (shm.empty() ? "-" : shm)
            << " host=" << options.host_id << std::endl;
  char buf[256];
  while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  (*server)->Stop();
  return 0;
}

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Spawn(std::vector<std::string> argv,
                                                                absl::Duration timeout) {
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) {
    return ErrnoToStatus(errno, "pipe");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  std::unique_ptr<PeerProcess> p(new PeerProcess());
  p->stdin_fd_ = in_pipe[1];
  if (rc != 0) {
    close(out_pipe[0]);
    return ErrnoToStatus(rc, StrCat("spawning ", argv[0]));
  }
  p->pid_ = pid;
  // Read the READY line.
  std::string line;
  const absl::Time deadline = absl::Now() + timeout;
  while (line.find('\n') == std::string::npos) {
    pollfd pfd{out_pipe[0], POLLIN, 0};
    const int ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    if (poll(&pfd, 1, ms) <= 0) break;
    char buf[512];
    const ssize_t n = read(out_pipe[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(out_pipe[0]);
  if (line.rfind("READY ", 0) != 0) {
    return absl::UnavailableError(StrCat("peer ", argv[0], " did not start: '", line, "'"));
  }
  line = line.substr(0, line.find('\n'));
  p->spec_.name = StrCat("peer-", pid);
  for (std::string_view field : StrSplit(line, ' ', true)) {
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "host") p->spec_.host_id = std::string(value);
  }
  for (std::string_view field : StrSplit(line, ' ', true)) {
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "tcp") {
      p->spec_.endpoints.push_back({.kind = TransportKind::kTcp,
                                    .address = std::string(value),
                                    .host_id = p->spec_.host_id});
    } else if (key == "shm" && value != "-") {
      p->spec_.endpoints.push_back({.kind = TransportKind::kShm,
                                    .address = std::string(value),
                                    .host_id = p->spec_.host_id});
    }
  }
  return p;
}

void PeerProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

PeerProcess::~PeerProcess() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (pid_ <= 0) return;
  kill(pid_, SIGCONT);             // a stopped child cannot see EOF
  for (int i = 0; i < 200; ++i) {  // up to 2 s for a clean exit
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    usleep(10000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

}  // namespace strata::transfer
