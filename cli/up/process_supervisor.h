// Starts daemons as child processes and keeps them running: the process manager behind
// `strata up`.
//
// Each child runs `argv` with stdout and stderr appended to its log file, in its own process
// group (a terminal's Ctrl-C reaches only the supervisor, which then stops the children in order)
// and with PR_SET_PDEATHSIG, so a supervisor killed outright does not leave daemons behind.
// A child that exits while it is supposed to run is restarted with the same arguments after an
// exponential backoff (reset once it has stayed up for `stable_after`).
//
// Not thread-safe: one thread (the supervisor's) calls every method. Events (start, exit, restart)
// are reported through `Options::on_event`.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace strata::cli {

struct ProcessSpec {
  std::string name;               // unique, e.g. "decode-0"
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::string log_file;           // appended to; created if missing
  std::string ready_file;         // the daemon writes it once serving; removed before each start
};

class ProcessSupervisor {
 public:
  struct Options {
    absl::Duration min_backoff = absl::Milliseconds(500);
    absl::Duration max_backoff = absl::Seconds(30);
    absl::Duration stable_after = absl::Seconds(30);
    std::function<void(const std::string&)> on_event;  // null: events are dropped
  };

  explicit ProcessSupervisor(Options options);
  ~ProcessSupervisor();  // kills (SIGKILL) whatever still runs
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Starts a new child; it is supervised from now on.
  absl::Status Start(ProcessSpec spec);

  // Waits until `name`'s ready file exists; the child exiting first or the timeout is an error
  // that quotes the end of its log.
  absl::Status WaitReady(const std::string& name, absl::Duration timeout);

  // Reaps children that exited and restarts those whose backoff has passed. Call it often
  // (every ~100 ms); it never blocks.
  void Poll();

  // Stops every child, newest first: SIGTERM, then SIGKILL after `timeout`. No restarts after.
  void StopAll(absl::Duration timeout);

  // The child's pid, or -1 while it is not running.
  pid_t Pid(const std::string& name) const;
  // How often `name` was restarted.
  int Restarts(const std::string& name) const;
  // The last lines of a child's log (for error messages).
  std::string LogTail(const std::string& name, int lines) const;

 private:
  struct Child {
    ProcessSpec spec;
    pid_t pid = -1;
    int restarts = 0;
    absl::Time started;
    absl::Time restart_at = absl::InfiniteFuture();  // while waiting to restart
    absl::Duration backoff;  // the last wait before a restart; zero before the first
  };

  absl::Status Spawn(Child& child);
  // Reaps `child` if it exited; returns true when it did. `blocking` waits for it.
  bool Reap(Child& child, bool blocking);
  Child* Find(const std::string& name);
  const Child* Find(const std::string& name) const;
  void Event(const std::string& text) const;

  Options options_;
  std::vector<Child> children_;
  bool stopping_ = false;
};

}  // namespace strata::cli
