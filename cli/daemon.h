// How the daemon commands (`strata cache`, `strata worker`) run: termination signals are blocked
// before any server thread starts and taken by one thread with sigwait, so a server shuts down
// cleanly on SIGINT or SIGTERM; a ready file tells scripts and tests the bound ports.
//
//   const sigset_t signals = BlockTerminationSignals();
//   Server server(options);  RETURN_IF_ERROR(server.Start());
//   ServeUntilSignal(server, signals, ready_file, "grpc=1 http=2", "cache server");
#pragma once

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/strata_config.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace strata::cli {

// Loads the configuration (file, environment, --set flags, then `extra` overrides that a
// command's own flags stand for) and starts logging as `component`. Exits with code 2 when the
// configuration is bad.
inline StrataConfig LoadDaemonConfig(const ConfigFlags& flags, const std::string& component,
                                     const std::vector<std::string>& extra = {}) {
  StrataConfig config;
  ConfigSchema schema;
  config.Register(schema);
  std::vector<std::string> overrides = flags.overrides;
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  if (absl::Status st = schema.Load({.file = flags.file, .overrides = overrides}); !st.ok()) {
    Fail(2, StrCat("config: ", st.message()));
  }
  if (absl::Status st = InitLogging(config.log.ToOptions(component)); !st.ok()) {
    Fail(2, StrCat("logging: ", st.message()));
  }
  return config;
}

inline sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Writes `ready_line` to `ready_file` (atomically, when not empty), then serves until a signal
// arrives (Shutdown) or the server stops on its own.
template <typename Server>
void ServeUntilSignal(Server& server, sigset_t signals, const std::string& ready_file,
                      const std::string& ready_line, const std::string& name) {
  if (!ready_file.empty()) {
    const std::string tmp = ready_file + ".tmp";
    std::ofstream(tmp) << ready_line << "\n";
    std::rename(tmp.c_str(), ready_file.c_str());
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("{}: signal {}, shutting down", name, sig);
    server.Shutdown();
  });
  server.Wait();
  // Wake the waiter if the server stopped on its own.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

}  // namespace strata::cli
