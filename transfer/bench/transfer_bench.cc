#include "transfer/bench/transfer_bench.h"

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "common/status.h"
#include "common/strings.h"
#include "transfer/capability.h"
#include "transfer/peer_process.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

constexpr char kBenchSecret[] = "strata-bench-transfer";

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

// `concurrency` threads, each submitting batches of `batch` reads of `block` bytes back to back.
// Destinations: a host buffer per thread, or (dst_base set, for the cuda cases: device memory, or a
// registered host segment) dst_base + t * batch * block.
absl::StatusOr<Measured> RunCase(TransferEngine& engine, Peer& peer, const std::string& cap,
                                 uint64_t segment_bytes, uint64_t block, int batch, int concurrency,
                                 double seconds, const std::string& segment, char* dst_base) {
  std::vector<std::vector<double>> latencies(concurrency);
  std::vector<int64_t> bytes(concurrency, 0);
  std::vector<absl::Status> errors(concurrency);
  const uint64_t slots = segment_bytes / block;
  // Destinations are allocated and faulted in before the clock (and the fault count) starts.
  std::vector<std::vector<char>> hosts(concurrency);
  for (auto& h : hosts) {
    h.resize(dst_base == nullptr ? block * batch : 0);
    std::memset(h.data(), 0, h.size());
  }
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      char* local = dst_base == nullptr ? hosts[t].data() : dst_base + t * batch * block;
      uint64_t next = static_cast<uint64_t>(t) * 7919;
      int iterations = 0;
      while (absl::Now() < stop || iterations < 3) {
        std::vector<TransferOp> ops;
        for (int k = 0; k < batch; ++k) {
          ops.push_back({.op = OpKind::kRead,
                         .local = local + k * block,
                         .segment = segment,
                         .offset = (next++ % slots) * block,
                         .length = block,
                         .capability = cap});
        }
        const absl::Time t0 = absl::Now();
        auto b = engine.Submit(peer, std::move(ops), {.timeout = absl::Seconds(30)});
        b->Wait(absl::Seconds(60));
        const absl::Status st = b->FirstError();
        if (!st.ok()) {
          errors[t] = st;
          return;
        }
        latencies[t].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
        bytes[t] += static_cast<int64_t>(block) * batch;
        ++iterations;
      }
    });
  }
  for (auto& th : threads) th.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  for (const auto& e : errors) RETURN_IF_ERROR(e);
  Measured m;
  std::vector<double> all;
  int64_t total = 0;
  for (int t = 0; t < concurrency; ++t) {
    all.insert(all.end(), latencies[t].begin(), latencies[t].end());
    total += bytes[t];
  }
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  m.gbps = static_cast<double>(total) / elapsed / 1e9;
  // Page faults taken by this process while the case ran (destination first touches would show
  // here; the shm source mapping is MAP_POPULATE'd).
  m.minor_faults_per_mib = static_cast<double>(after.ru_minflt - before.ru_minflt) /
                           std::max(1.0, static_cast<double>(total) / (1 << 20));
  m.requests = total / static_cast<int64_t>(block);
  m.p50_us = Percentile(all, 0.5);
  m.p99_us = Percentile(all, 0.99);
  return m;
}

namespace {

// Plain memcpy of `block`-sized pieces from a large, pre-faulted source into a destination of
// 16 blocks (the footprint of a batch of 16): the ceiling for shm.
double MemcpyGbps(uint64_t block, uint64_t source_bytes, double seconds) {
  constexpr int kDstBlocks = 16;
  std::vector<char> src(source_bytes, 1), dst(block * kDstBlocks, 0);
  const uint64_t slots = source_bytes / block;
  uint64_t i = 0, total = 0;
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  while (absl::Now() < stop) {
    for (int k = 0; k < 8; ++k) {
      std::memcpy(dst.data() + (i % kDstBlocks) * block, src.data() + (i % slots) * block, block);
      ++i;
      total += block;
    }
  }
  asm volatile("" : : "r"(dst.data()) : "memory");
  return static_cast<double>(total) / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
}

// One TCP connection over loopback: a sender thread writes as fast as it can, the receiver
// reads `block`-sized pieces. The ceiling for the tcp transport on this machine.
absl::StatusOr<double> SocketBlastGbps(uint64_t block, double seconds) {
  std::string bound;
  ASSIGN_OR_RETURN(int listen_fd, wire::ListenTcp("127.0.0.1:0", &bound));
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    const int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    wire::SetSocketBuffers(fd, 4 << 20);
    std::vector<char> buf(block, 2);
    while (!stop.load()) {
      if (send(fd, buf.data(), buf.size(), MSG_NOSIGNAL) <= 0) break;
    }
    close(fd);
  });
  auto fd = wire::DialTcp(bound, absl::Seconds(5));
  if (!fd.ok()) {
    stop = true;
    shutdown(listen_fd, SHUT_RDWR);
    sender.join();
    close(listen_fd);
    return fd.status();
  }
  wire::SetSocketBuffers(*fd, 4 << 20);
  // Receive into 16 blocks in turn: the footprint of a batch of 16, as in the memcpy baseline.
  constexpr int kDstBlocks = 16;
  std::vector<char> buf(block * kDstBlocks, 0);
  uint64_t total = 0, i = 0;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  while (absl::Now() < end) {
    if (!wire::RecvAll(*fd, buf.data() + (i++ % kDstBlocks) * block, block).ok()) break;
    total += block;
  }
  const double gbps = static_cast<double>(total) / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  stop = true;
  close(*fd);
  sender.join();
  close(listen_fd);
  return gbps;
}

}  // namespace

std::string SizeName(uint64_t b) {
  return b >= (1 << 20) ? StrCat(b >> 20, "MiB") : StrCat(b >> 10, "KiB");
}

absl::StatusOr<nlohmann::json> RunTransferBench(const TransferBenchOptions& o) {
  nlohmann::json out;
  out["cases"] = nlohmann::json::array();
  PeerProcessOptions peer_options{
      .segments = {{"bench", o.segment_bytes}},
      .secret = kBenchSecret,
      .host_id = "bench-host",
      .shm_socket_path = StrCat("/tmp/strata-bench-", getpid(), ".sock"),
      .seed = 5};
  std::vector<std::string> argv = {o.peer_binary};
  for (const auto& a : o.peer_args_prefix) argv.push_back(a);
  for (const auto& a : PeerProcessArgs(peer_options)) argv.push_back(a);
  ASSIGN_OR_RETURN(auto proc, PeerProcess::Spawn(std::move(argv), absl::Seconds(30)));
  const ClusterSecret secret(kBenchSecret);
  ASSIGN_OR_RETURN(std::string cap,
                   IssueCapability(secret, {.segment = "bench",
                                            .offset = 0,
                                            .length = o.segment_bytes,
                                            .access = Access::kRead,
                                            .expires = absl::Now() + absl::Hours(1)}));
  // best[transport][block]: the best throughput over batch sizes and concurrency.
  std::map<std::string, std::map<uint64_t, double>> best;
  bool want_cuda = false;
  std::map<TransportKind, std::unique_ptr<TransferEngine>> engines;
  std::map<TransportKind, std::shared_ptr<Peer>> peers;
  for (TransportKind kind : o.transports) {
    if (kind == TransportKind::kCuda) {
      want_cuda = true;
      continue;
    }
    if (kind != TransportKind::kShm && kind != TransportKind::kTcp) {
      return absl::InvalidArgumentError(StrCat("bench transfer: transport ",
                                               TransportKindName(kind),
                                               " is not benchmarkable here (shm, tcp, cuda)"));
    }
    ASSIGN_OR_RETURN(engines[kind],
                     TransferEngine::Create({.host_id = "bench-host",
                                             .secret = secret,
                                             .force_transport = kind,
                                             .tcp_connections_per_peer = o.tcp_connections}));
    auto& engine = engines[kind];
    ASSIGN_OR_RETURN(peers[kind], engine->OpenPeer(proc->spec()));
    auto& peer = peers[kind];
    const std::string name(TransportKindName(kind));
    // Warm up (untimed): connections, the shm mapping, the peer's page cache.
    RETURN_IF_ERROR_WITH(
        RunCase(*engine, *peer, cap, o.segment_bytes, 1 << 20, 16, 1, 0.05, "bench", nullptr)
            .status(),
        name, " warm-up");
    for (uint64_t block : o.block_sizes) {
      for (int batch : o.batch_sizes) {
        for (int conc : o.concurrency) {
          ASSIGN_OR_RETURN_WITH(Measured m,
                                RunCase(*engine, *peer, cap, o.segment_bytes, block, batch, conc,
                                        o.seconds_per_case, "bench", nullptr),
                                name, " ", SizeName(block));
          out["cases"].push_back({{"transport", name},
                                  {"block_bytes", block},
                                  {"batch", batch},
                                  {"concurrency", conc},
                                  {"gbps", m.gbps},
                                  {"batch_latency_p50_us", m.p50_us},
                                  {"batch_latency_p99_us", m.p99_us},
                                  {"requests", m.requests},
                                  {"minor_faults_per_mib", m.minor_faults_per_mib}});
          best[name][block] = std::max(best[name][block], m.gbps);
        }
      }
    }
  }
  nlohmann::json memcpy_results = nlohmann::json::array(), socket_results = nlohmann::json::array();
  std::map<uint64_t, double> memcpy_gbps, socket_gbps;
  for (uint64_t block : o.block_sizes) {
    memcpy_gbps[block] = MemcpyGbps(block, o.segment_bytes, o.seconds_per_case);
    ASSIGN_OR_RETURN(socket_gbps[block], SocketBlastGbps(block, o.seconds_per_case));
    memcpy_results.push_back({{"block_bytes", block}, {"gbps", memcpy_gbps[block]}});
    socket_results.push_back({{"block_bytes", block}, {"gbps", socket_gbps[block]}});
  }
  out["baselines"] = {{"memcpy", memcpy_results}, {"socket_loopback", socket_results}};
  nlohmann::json ratios = nlohmann::json::object();
  constexpr uint64_t kMiB = 1 << 20;
  // The ratios: 1 MiB, one submitting thread vs the single-thread baseline, measured in
  // `ratio_rounds` interleaved rounds (baseline, then the transport at each batch size) and
  // compared best against best. Other processes' load only ever lowers a figure, so the best of
  // interleaved rounds is the fairest estimate on a shared machine.
  nlohmann::json rounds = nlohmann::json::array();
  for (auto& [kind, engine] : engines) {
    const std::string name(TransportKindName(kind));
    double base_best = 0, transport_best = 0;
    for (int r = 0; r < std::max(1, o.ratio_rounds); ++r) {
      double base = 0;
      if (kind == TransportKind::kShm) {
        base = MemcpyGbps(kMiB, o.segment_bytes, o.seconds_per_case);
      } else {
        ASSIGN_OR_RETURN(base, SocketBlastGbps(kMiB, o.seconds_per_case));
      }
      base_best = std::max(base_best, base);
      for (int batch : o.batch_sizes) {
        ASSIGN_OR_RETURN(Measured m, RunCase(*engine, *peers[kind], cap, o.segment_bytes, kMiB,
                                             batch, 1, o.seconds_per_case, "bench", nullptr));
        transport_best = std::max(transport_best, m.gbps);
        rounds.push_back({{"transport", name},
                          {"round", r},
                          {"batch", batch},
                          {"gbps", m.gbps},
                          {"baseline_gbps", base}});
      }
    }
    if (base_best > 0) {
      ratios[kind == TransportKind::kShm ? "shm_vs_memcpy_1MiB" : "tcp_vs_socket_1MiB"] =
          transport_best / base_best;
    }
  }
  out["ratio_rounds"] = rounds;
  if (want_cuda) {
    auto cuda = RunCudaBench(o);
    if (cuda.ok()) {
      for (auto& c : (*cuda)["cases"]) out["cases"].push_back(c);
      out["baselines"]["cuda_memcpy_pinned"] = (*cuda)["baselines"];
      for (auto& [k, v] : (*cuda)["ratios"].items()) ratios[k] = v;
      out["best_gbps"]["cuda"] = (*cuda)["best_gbps"];
    } else {
      out["cuda_skipped"] = std::string(ToStd(cuda.status().message()));
    }
  }
  out["ratios"] = ratios;
  out["tcp_connections_per_peer"] = o.tcp_connections;
  if (!out.contains("best_gbps")) out["best_gbps"] = nlohmann::json::object();
  for (auto& [name, by_block] : best) {
    for (auto& [block, g] : by_block) out["best_gbps"][name][SizeName(block)] = g;
  }
  out["notes"] =
      "cases: reads from a peer process's 256 MiB memfd segment; batch latency = submit to last "
      "completion; ratios: 1 MiB, best concurrency-1 transport run (over batch sizes and "
      "interleaved rounds, see ratio_rounds) vs the best single-thread baseline of the same "
      "rounds; baselines cycle through a 16-block destination";
  return out;
}

}  // namespace strata::transfer
