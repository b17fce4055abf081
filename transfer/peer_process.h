// A segment-owning peer in another process, for tests and `strata bench transfer`.
//
// RunPeerProcess() is the body of the child: it creates memfd-backed segments filled with a
// known pattern (PatternByte), starts a TransferServer, prints one line
//   READY tcp=<host:port> shm=<socket path> host=<host id>
// on stdout and serves until its stdin reaches EOF (the parent closed it or died).
// PeerProcess::Spawn() starts such a child (posix_spawn of a binary that calls RunPeerProcess),
// waits for the READY line and gives the PeerSpec to reach it; the destructor ends the child
// (closes its stdin, then SIGKILL after a grace period) and reaps it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/transport.h"

namespace strata::transfer {

struct PeerProcessOptions {
  std::vector<std::pair<std::string, uint64_t>> segments;  // name, bytes
  std::string secret;
  std::string host_id = "local";
  std::string shm_socket_path;  // empty: no shm listener
  uint64_t seed = 1;
};

// The initial byte at `offset` of every segment of a peer started with `seed`.
inline uint8_t PatternByte(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>((offset * 131 + (offset >> 8) * 7 + seed * 29) & 0xff);
}

// Child side. Returns the process exit code.
int RunPeerProcess(const PeerProcessOptions& options);

// Parses the child's flags: --secret S --host-id H --shm-socket P --seed N --segment name:bytes
// (repeatable). InvalidArgument on anything else.
absl::StatusOr<PeerProcessOptions> ParsePeerProcessArgs(const std::vector<std::string>& args);
// The reverse, for Spawn().
std::vector<std::string> PeerProcessArgs(const PeerProcessOptions& options);

class PeerProcess {
 public:
  // Runs `argv` (argv[0] is the binary path) and waits up to `timeout` for READY.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Spawn(std::vector<std::string> argv,
                                                            absl::Duration timeout);
  ~PeerProcess();

  const PeerSpec& spec() const { return spec_; }
  pid_t pid() const { return pid_; }
  // Sends a signal (SIGKILL: peer death; SIGSTOP/SIGCONT: a frozen, then recovered, peer).
  void Signal(int sig);

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  PeerSpec spec_;
};

}  // namespace strata::transfer
