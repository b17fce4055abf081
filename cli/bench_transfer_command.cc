// strata bench transfer: transport throughput/latency between two processes, with baselines.
// strata bench transfer-peer: (hidden) the peer process the benchmark spawns.
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "common/strings.h"
#include "transfer/bench/transfer_bench.h"
#include "transfer/peer_process.h"

namespace strata::cli {
namespace {

template <typename T>
std::vector<T> ParseList(const std::string& flag, const std::string& value) {
  std::vector<T> out;
  for (std::string_view piece : StrSplit(value, ',', true)) {
    std::string p = AsciiToLower(StripWhitespace(piece));
    uint64_t scale = 1;
    if (p.size() > 3 && p.substr(p.size() - 3) == "kib")
      scale = 1 << 10, p.resize(p.size() - 3);
    else if (p.size() > 3 && p.substr(p.size() - 3) == "mib")
      scale = 1 << 20, p.resize(p.size() - 3);
    else if (!p.empty() && p.back() == 'k')
      scale = 1 << 10, p.pop_back();
    else if (!p.empty() && p.back() == 'm')
      scale = 1 << 20, p.pop_back();
    auto v = ParseUint64(p);
    if (!v || *v == 0) Fail(2, StrCat(flag, ": '", piece, "' is not a positive number"));
    out.push_back(static_cast<T>(*v * scale));
  }
  if (out.empty()) Fail(2, StrCat(flag, " is empty"));
  return out;
}

}  // namespace

void RegisterBenchTransferCommand(CLI::App& app) {
  CLI::App& bench = BenchGroup(app);
  CLI::App* cmd = bench.add_subcommand(
      "transfer",
      "Transfer engine throughput (GB/s) and latency per transport, block size, batch "
      "size and concurrency, against memcpy and a loopback socket blast");
  struct Flags {
    std::string transports = "shm,tcp,cuda";
    std::string sizes = "64KiB,256KiB,1MiB,4MiB";
    std::string batches = "1,16";
    std::string concurrency = "1,4";
    double seconds = 0.4;
    int tcp_connections = 4;
    std::string json;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--transports", f->transports,
                  "Comma-separated: shm, tcp, cuda (cuda: only where there is a GPU)");
  cmd->add_option("--sizes", f->sizes, "Block sizes (e.g. 64KiB,1MiB)");
  cmd->add_option("--batch", f->batches, "Batch sizes");
  cmd->add_option("--concurrency", f->concurrency, "Submitting threads");
  cmd->add_option("--seconds", f->seconds, "Seconds per case");
  cmd->add_option("--tcp-connections", f->tcp_connections, "tcp connections per peer");
  cmd->add_option("--json", f->json, "Write the results (with a `ratios` object) to this file");
  cmd->callback([f] {
    transfer::TransferBenchOptions o;
    o.transports.clear();
    for (std::string_view t : StrSplit(f->transports, ',', true)) {
      auto kind = transfer::ParseTransportKind(StripWhitespace(t));
      if (!kind.ok()) Fail(2, std::string(ToStd(kind.status().message())));
      o.transports.push_back(*kind);
    }
    o.block_sizes = ParseList<uint64_t>("--sizes", f->sizes);
    o.batch_sizes = ParseList<int>("--batch", f->batches);
    o.concurrency = ParseList<int>("--concurrency", f->concurrency);
    o.seconds_per_case = f->seconds;
    o.tcp_connections = f->tcp_connections;
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) Fail(1, "cannot find /proc/self/exe");
    o.peer_binary = std::string(self, static_cast<size_t>(n));
    o.peer_args_prefix = {"bench", "transfer-peer"};
    auto result = transfer::RunTransferBench(o);
    if (!result.ok()) Fail(1, result.status().ToString());
    std::cout << "transport  block     batch conc    GB/s   p50(us)   p99(us)\n";
    for (const auto& c : (*result)["cases"]) {
      std::printf("%-9s %6lluKiB %6d %4d %8.2f %9.0f %9.0f\n",
                  c["transport"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(c["block_bytes"].get<uint64_t>() >> 10),
                  c["batch"].get<int>(), c["concurrency"].get<int>(), c["gbps"].get<double>(),
                  c["batch_latency_p50_us"].get<double>(), c["batch_latency_p99_us"].get<double>());
    }
    std::cout << "baselines: " << (*result)["baselines"].dump() << "\n";
    std::cout << "ratios: " << (*result)["ratios"].dump() << "\n";
    if (!f->json.empty()) {
      std::ofstream out(f->json);
      out << result->dump(2) << "\n";
      if (!out) Fail(1, StrCat("cannot write ", f->json));
    }
  });

  CLI::App* peer = bench.add_subcommand("transfer-peer", "");  // hidden: spawned by the bench
  peer->group("");
  peer->prefix_command();  // everything after is the peer's own flags
  peer->fallthrough(false);
  peer->callback([peer] {
    auto options = transfer::ParsePeerProcessArgs(peer->remaining());
    if (!options.ok()) Fail(2, options.status().ToString());
    const int rc = transfer::RunPeerProcess(*options);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::cli
