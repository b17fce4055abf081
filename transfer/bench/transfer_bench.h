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
  // cuda runs only where there is a GPU (else the JSON says why in "cuda_skipped").
  std::vector<TransportKind> transports = {TransportKind::kShm, TransportKind::kTcp,
                                           TransportKind::kCuda};
  std::vector<uint64_t> block_sizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  std::vector<int> batch_sizes = {1, 16};
  std::vector<int> concurrency = {1, 4};
  double seconds_per_case = 0.4;
  int ratio_rounds = 3;                   // interleaved baseline/transport rounds for the ratios
  int tcp_connections = 4;                // EngineOptions::tcp_connections_per_peer
  uint64_t segment_bytes = 256ull << 20;  // the peer's segment, read round-robin
  std::string peer_binary;                // the binary that serves as the peer (strata itself)
  std::vector<std::string> peer_args_prefix;  // e.g. {"bench", "transfer-peer"}
};

// Runs the benchmark; the JSON has "cases", "baselines" and "ratios" (see docs/benchmarks.md).
absl::StatusOr<nlohmann::json> RunTransferBench(const TransferBenchOptions& options);

// The cuda cases (CUDA builds with a GPU; Unavailable otherwise): DRAM segment -> GPU (H2D) and
// device segment -> host (D2H) through the engine's cuda transport, against pinned cudaMemcpy in
// the same run. JSON: "cases", "baselines" (h2d/d2h by block), "ratios"
// (cuda_h2d_vs_memcpy_1MiB, cuda_d2h_vs_memcpy_1MiB), "best_gbps".
absl::StatusOr<nlohmann::json> RunCudaBench(const TransferBenchOptions& options);

class TransferEngine;
class Peer;
struct Measured {
  double gbps = 0;
  double p50_us = 0;
  double p99_us = 0;
  int64_t requests = 0;
  double minor_faults_per_mib = 0;
};
// One timed case (shared by the host and cuda benches); see transfer_bench.cc.
absl::StatusOr<Measured> RunCase(TransferEngine& engine, Peer& peer, const std::string& cap,
                                 uint64_t segment_bytes, uint64_t block, int batch, int concurrency,
                                 double seconds, const std::string& segment, char* dst_base);
std::string SizeName(uint64_t bytes);

}  // namespace strata::transfer
