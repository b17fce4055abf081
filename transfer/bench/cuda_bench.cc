// The cuda part of `strata bench transfer`: DRAM segment -> GPU and device segment -> host
// through the engine's cuda transport, against pinned cudaMemcpy measured in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "common/status.h"
#include "common/strings.h"
#include "transfer/bench/transfer_bench.h"
#include "transfer/cuda/cuda_transport.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

// Synchronous cudaMemcpy of `block`-sized pieces between 16 pinned host blocks and 16 device
// blocks (the footprint of a batch of 16): the physical baseline.
absl::StatusOr<double> PinnedMemcpyGbps(uint64_t block, bool h2d, double seconds) {
  constexpr int kBlocks = 16;
  void* host = nullptr;
  void* dev = nullptr;
  if (cudaMallocHost(&host, block * kBlocks) != cudaSuccess ||
      cudaMalloc(&dev, block * kBlocks) != cudaSuccess) {
    cudaFreeHost(host);
    return absl::ResourceExhaustedError("cuda bench: cannot allocate the baseline buffers");
  }
  std::memset(host, 1, block * kBlocks);
  uint64_t total = 0, i = 0;
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  cudaError_t e = cudaSuccess;
  while (absl::Now() < stop && e == cudaSuccess) {
    for (int k = 0; k < 8 && e == cudaSuccess; ++k, ++i) {
      char* h = static_cast<char*>(host) + (i % kBlocks) * block;
      char* d = static_cast<char*>(dev) + (i % kBlocks) * block;
      e = h2d ? cudaMemcpy(d, h, block, cudaMemcpyHostToDevice)
              : cudaMemcpy(h, d, block, cudaMemcpyDeviceToHost);
      total += block;
    }
  }
  const double gbps = static_cast<double>(total) / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  cudaFree(dev);
  cudaFreeHost(host);
  if (e != cudaSuccess) return absl::InternalError(StrCat("cudaMemcpy: ", cudaGetErrorString(e)));
  return gbps;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunCudaBench(const TransferBenchOptions& o) {
  if (CudaDeviceCount() == 0) return absl::UnavailableError("cuda: no GPU on this machine");
  const ClusterSecret secret("strata-bench-cuda");
  ASSIGN_OR_RETURN(auto engine,
                   TransferEngine::Create({.host_id = "bench-host", .secret = secret}));
  // The source: a memfd DRAM segment like the cache server's arena (pageable; the transport
  // pins it once), pre-faulted.
  ASSIGN_OR_RETURN(Segment dram, CreateSharedHostSegment("dram", o.segment_bytes));
  std::memset(dram.base, 3, dram.size);
  RETURN_IF_ERROR(engine->segments().Register(dram));
  ASSIGN_OR_RETURN(Segment gpu, AllocateDeviceSegment("gpu", o.segment_bytes, 0));
  RETURN_IF_ERROR(engine->segments().Register(gpu));
  ASSIGN_OR_RETURN(auto peer, engine->OpenPeer(engine->LocalPeerSpec()));
  auto cap = [&](const char* seg) {
    return IssueCapability(secret, {.segment = seg,
                                    .offset = 0,
                                    .length = o.segment_bytes,
                                    .access = Access::kRead,
                                    .expires = absl::Now() + absl::Hours(1)});
  };
  ASSIGN_OR_RETURN(std::string dram_cap, cap("dram"));
  ASSIGN_OR_RETURN(std::string gpu_cap, cap("gpu"));
  const uint64_t max_block = *std::max_element(o.block_sizes.begin(), o.block_sizes.end());
  const int max_batch = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
  const int max_conc = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  ASSIGN_OR_RETURN(Segment dst, AllocateDeviceSegment("dst", max_block * max_batch * max_conc, 0));
  char* dst_base = static_cast<char*>(dst.base);
  // D2H destinations: a registered host segment (pinned once), as a DRAM arena would be.
  ASSIGN_OR_RETURN(Segment host_dst,
                   CreateSharedHostSegment("host_dst", max_block * max_batch * max_conc));
  std::memset(host_dst.base, 0, host_dst.size);
  RETURN_IF_ERROR(engine->segments().Register(host_dst));

  nlohmann::json out;
  out["cases"] = nlohmann::json::array();
  std::map<std::string, std::map<uint64_t, double>> best, single;
  // Warm-up: pins the DRAM segment (cudaHostRegister), creates the streams.
  RETURN_IF_ERROR(
      RunCase(*engine, *peer, dram_cap, o.segment_bytes, 1 << 20, 16, 1, 0.05, "dram", dst_base)
          .status());
  for (const char* dir : {"h2d", "d2h"}) {
    const bool h2d = std::string(dir) == "h2d";
    for (uint64_t block : o.block_sizes) {
      for (int batch : o.batch_sizes) {
        for (int conc : o.concurrency) {
          ASSIGN_OR_RETURN_WITH(
              Measured m,
              RunCase(*engine, *peer, h2d ? dram_cap : gpu_cap, o.segment_bytes, block, batch, conc,
                      o.seconds_per_case, h2d ? "dram" : "gpu",
                      h2d ? dst_base : static_cast<char*>(host_dst.base)),
              "cuda ", dir, " ", SizeName(block));
          const std::string name = StrCat("cuda_", dir);
          out["cases"].push_back({{"transport", name},
                                  {"block_bytes", block},
                                  {"batch", batch},
                                  {"concurrency", conc},
                                  {"gbps", m.gbps},
                                  {"batch_latency_p50_us", m.p50_us},
                                  {"batch_latency_p99_us", m.p99_us},
                                  {"requests", m.requests}});
          best[name][block] = std::max(best[name][block], m.gbps);
          if (conc == 1) single[name][block] = std::max(single[name][block], m.gbps);
        }
      }
    }
  }
  nlohmann::json h2d_base = nlohmann::json::array(), d2h_base = nlohmann::json::array();
  std::map<uint64_t, double> h2d_gbps, d2h_gbps;
  for (uint64_t block : o.block_sizes) {
    ASSIGN_OR_RETURN(h2d_gbps[block], PinnedMemcpyGbps(block, true, o.seconds_per_case));
    ASSIGN_OR_RETURN(d2h_gbps[block], PinnedMemcpyGbps(block, false, o.seconds_per_case));
    h2d_base.push_back({{"block_bytes", block}, {"gbps", h2d_gbps[block]}});
    d2h_base.push_back({{"block_bytes", block}, {"gbps", d2h_gbps[block]}});
  }
  out["baselines"] = {{"h2d", h2d_base}, {"d2h", d2h_base}};
  constexpr uint64_t kMiB = 1 << 20;
  out["ratios"] = nlohmann::json::object();
  if (single["cuda_h2d"].count(kMiB) && h2d_gbps[kMiB] > 0) {
    out["ratios"]["cuda_h2d_vs_memcpy_1MiB"] = single["cuda_h2d"][kMiB] / h2d_gbps[kMiB];
  }
  if (single["cuda_d2h"].count(kMiB) && d2h_gbps[kMiB] > 0) {
    out["ratios"]["cuda_d2h_vs_memcpy_1MiB"] = single["cuda_d2h"][kMiB] / d2h_gbps[kMiB];
  }
  out["best_gbps"] = nlohmann::json::object();
  for (auto& [name, by_block] : best) {
    for (auto& [block, g] : by_block) out["best_gbps"][name][SizeName(block)] = g;
  }
  // Tear down in order: the engine (and its channel) before the segments' memory.
  peer.reset();
  engine.reset();
  return out;
}

}  // namespace strata::transfer
