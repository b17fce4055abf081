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

#include "spdlog/spdlog.h"

namespace strata::cli {

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
