#include "cli/up/process_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/strings.h"

namespace strata::cli {
namespace {

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return StrCat("was killed by signal ", sig, " (", sigabbrev_np(sig) ? sigabbrev_np(sig) : "?",
                  ")");
  }
  return "stopped";
}

bool FileNonEmpty(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && st.st_size > 0;
}

}  // namespace

ProcessSupervisor::ProcessSupervisor(Options options) : options_(std::move(options)) {}

ProcessSupervisor::~ProcessSupervisor() {
  for (Child& child : children_) {
    if (child.pid > 0) {
      ::kill(child.pid, SIGKILL);
      Reap(child, /*blocking=*/true);
    }
  }
}

void ProcessSupervisor::Event(const std::string& text) const {
  if (options_.on_event) options_.on_event(text);
}

ProcessSupervisor::Child* ProcessSupervisor::Find(const std::string& name) {
  for (Child& child : children_) {
    if (child.spec.name == name) return &child;
  }
  return nullptr;
}

const ProcessSupervisor::Child* ProcessSupervisor::Find(const std::string& name) const {
  return const_cast<ProcessSupervisor*>(this)->Find(name);
}

absl::Status ProcessSupervisor::Start(ProcessSpec spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError(StrCat(spec.name, ": empty argv"));
  if (Find(spec.name) != nullptr) {
    return absl::AlreadyExistsError(StrCat("a process named ", spec.name, " exists"));
  }
  Child child;
  child.spec = std::move(spec);
  children_.push_back(std::move(child));
  absl::Status st = Spawn(children_.back());
  if (!st.ok()) children_.pop_back();
  return st;
}

absl::Status ProcessSupervisor::Spawn(Child& child) {
  const ProcessSpec& spec = child.spec;
  if (!spec.ready_file.empty()) ::unlink(spec.ready_file.c_str());
  const int log = ::open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InternalError(
        StrCat(spec.name, ": cannot open log ", spec.log_file, ": ", std::strerror(errno)));
  }
  const std::string banner = StrCat(
      "=== strata up: ", child.restarts == 0 ? "starting " : "restarting ", spec.name, " at ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone()), " ===\n");
  (void)!::write(log, banner.data(), banner.size());

  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  sigset_t none;
  sigemptyset(&none);

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    return absl::InternalError(StrCat(spec.name, ": fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the supervisor died before prctl took effect
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    static const char kMsg[] = "strata up: exec failed\n";
    (void)!::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  ::close(log);
  child.pid = pid;
  child.started = absl::Now();
  child.restart_at = absl::InfiniteFuture();
  Event(StrCat(child.restarts == 0 ? "started " : "restarted ", spec.name, " (pid ", pid, ")"));
  return absl::OkStatus();
}

bool ProcessSupervisor::Reap(Child& child, bool blocking) {
  if (child.pid <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(child.pid, &status, blocking ? 0 : WNOHANG);
  if (r == 0 || (r < 0 && errno == EINTR)) return false;
  child.pid = -1;
  if (r < 0) status = 0;  // already reaped elsewhere (ECHILD): treat as gone
  if (stopping_) {
    Event(StrCat("stopped ", child.spec.name));
    return true;
  }
  const absl::Time now = absl::Now();
  // The first restart, and one after a long healthy run, waits min_backoff; each quick crash
  // after that doubles the wait.
  child.backoff =
      now - child.started >= options_.stable_after || child.backoff == absl::ZeroDuration()
          ? options_.min_backoff
          : std::min(child.backoff * 2, options_.max_backoff);
  child.restart_at = now + child.backoff;
  Event(StrCat(child.spec.name, " ", DescribeExit(status), " after ",
               absl::FormatDuration(absl::Trunc(now - child.started, absl::Milliseconds(100))),
               "; restarting in ", absl::FormatDuration(child.backoff),
               " (log: ", child.spec.log_file, ")"));
  return true;
}

void ProcessSupervisor::Poll() {
  const absl::Time now = absl::Now();
  for (Child& child : children_) {
    Reap(child, /*blocking=*/false);
    if (!stopping_ && child.pid <= 0 && child.restart_at <= now) {
      ++child.restarts;
      if (absl::Status st = Spawn(child); !st.ok()) {
        child.restart_at = now + options_.max_backoff;
        Event(StrCat("cannot restart ", child.spec.name, ": ", st.message()));
      }
    }
  }
}

absl::Status ProcessSupervisor::WaitReady(const std::string& name, absl::Duration timeout) {
  Child* child = Find(name);
  if (child == nullptr) return absl::NotFoundError(StrCat("no process named ", name));
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (child->pid > 0 && FileNonEmpty(child->spec.ready_file)) return absl::OkStatus();
    if (child->pid <= 0 || Reap(*child, /*blocking=*/false)) {
      return absl::UnavailableError(StrCat(name, " stopped before it was ready; the end of ",
                                           child->spec.log_file, ":\n", LogTail(name, 15)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(StrCat(name, " was not ready after ",
                                                absl::FormatDuration(timeout), "; the end of ",
                                                child->spec.log_file, ":\n", LogTail(name, 15)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ProcessSupervisor::StopAll(absl::Duration timeout) {
  stopping_ = true;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    Child& child = *it;
    child.restart_at = absl::InfiniteFuture();
    if (child.pid <= 0) continue;
    ::kill(child.pid, SIGTERM);
    const absl::Time deadline = absl::Now() + timeout;
    while (!Reap(child, /*blocking=*/false)) {
      if (absl::Now() > deadline) {
        Event(StrCat(child.spec.name, " did not stop within ", absl::FormatDuration(timeout),
                     "; killing it"));
        ::kill(child.pid, SIGKILL);
        Reap(child, /*blocking=*/true);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

pid_t ProcessSupervisor::Pid(const std::string& name) const {
  const Child* child = Find(name);
  return child == nullptr ? -1 : child->pid;
}

int ProcessSupervisor::Restarts(const std::string& name) const {
  const Child* child = Find(name);
  return child == nullptr ? 0 : child->restarts;
}

std::string ProcessSupervisor::LogTail(const std::string& name, int lines) const {
  const Child* child = Find(name);
  if (child == nullptr) return "";
  std::ifstream in(child->spec.log_file);
  std::vector<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(std::move(line));
    if (static_cast<int>(tail.size()) > lines) tail.erase(tail.begin());
  }
  return StrJoin(tail, "\n");
}

}  // namespace strata::cli
