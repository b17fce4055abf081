// `strata bench transfer`: throughput and latency of the transports between two processes on
// this machine, with the physical baselines measured in the same run (plain memcpy, a plain
// TCP socket blast over loopback) and their ratios.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "transfer/transport.h"

namespace strata::transfer {

struct TransferBenchOptions {
  std::vector<TransportKind> transports = {TransportKind::kShm, TransportKind::kTcp};
  std::vector<uint64_t> block_sizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  std::vector<int> batch_sizes = {1, 16};
  std::vector<int> concurrency = {1, 4};
  double seconds_per_case = 0.4;
  int tcp_connections = 4;                    // EngineOptions::tcp_connections_per_peer
  uint64_t segment_bytes = 256ull << 20;      // the peer's segment, read round-robin
  std::string peer_binary;                    // the binary that serves as the peer (strata itself)
  std::vector<std::string> peer_args_prefix;  // e.g. {"bench", "transfer-peer"}
};

// Runs the benchmark; the JSON has "cases", "baselines" and "ratios" (see docs/benchmarks.md).
absl::StatusOr<nlohmann::json> RunTransferBench(const TransferBenchOptions& options);

}  // namespace strata::transfer
