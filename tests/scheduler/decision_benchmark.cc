// Scheduling decision latency: Scheduler::Decide (prefix match + load snapshot + policy) with
// 64 nodes and 1 M indexed blocks. Reports the p50/p99 of single decisions as counters
// (target: p99 <= 100 us).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "common/strings.h"
#include "scheduler/scheduler.h"

namespace strata::scheduler {
namespace {

constexpr uint32_t kNodes = 64;
constexpr uint32_t kChains = 4096;
constexpr uint32_t kChainBlocks = 256;  // 4096 × 256 = 1,048,576 indexed blocks
constexpr uint32_t kBlockTokens = 64;

BlockKey ChainKey(uint32_t chain, uint32_t block) {
  BlockKey key;
  const uint64_t id = (uint64_t(chain) << 32) | block;
  for (int i = 0; i < 8; ++i) key.bytes[i] = uint8_t(id >> (8 * i));
  key.bytes[15] = 0x77;
  return key;
}

struct World {
  std::unique_ptr<Scheduler> scheduler;
  std::vector<std::vector<BlockKey>> requests;

  explicit World(const std::string& policy) {
    SchedulerOptions options;
    options.policy = policy;
    options.index_capacity_blocks = 2 << 20;
    scheduler = *Scheduler::Create(options);
    const absl::Time t0 = absl::Now();
    for (uint32_t n = 0; n < kNodes; ++n) {
      scheduler->load().Register(StrCat("node-", n), StrCat("host-", n / 8),
                                 n % 4 == 3 ? NodeRoleKind::kDecode : NodeRoleKind::kPrefill, t0);
    }
    std::mt19937_64 rng(42);
    std::vector<BlockKey> chain(kChainBlocks);
    for (uint32_t c = 0; c < kChains; ++c) {
      for (uint32_t b = 0; b < kChainBlocks; ++b) chain[b] = ChainKey(c, b);
      // Each chain cached on two nodes, at different depths and tiers.
      for (int copy = 0; copy < 2; ++copy) {
        const NodeIndex node = NodeIndex(rng() % kNodes);
        const uint32_t depth = kChainBlocks / (copy + 1);
        scheduler->index().Stored(node, static_cast<CacheTier>(rng() % kNumTiers),
                                  std::span<const BlockKey>(chain.data(), depth));
      }
    }
    // Requests: a cached chain's prefix of random length plus a fresh suffix (16K tokens).
    for (int r = 0; r < 4096; ++r) {
      const uint32_t c = uint32_t(rng() % kChains);
      const uint32_t shared = uint32_t(rng() % kChainBlocks);
      std::vector<BlockKey> keys;
      for (uint32_t b = 0; b < kChainBlocks; ++b) {
        keys.push_back(b < shared ? ChainKey(c, b) : ChainKey(kChains + r, b));
      }
      requests.push_back(std::move(keys));
    }
  }
};

void BM_Decide(benchmark::State& state, const std::string& policy) {
  static std::map<std::string, std::unique_ptr<World>> worlds;
  auto& world = worlds[policy];
  if (!world) world = std::make_unique<World>(policy);
  std::vector<double> latencies_us;
  size_t i = 0;
  for (auto _ : state) {
    PlacementRequest request;
    request.keys = world->requests[i++ % world->requests.size()];
    request.block_tokens = kBlockTokens;
    request.prompt_tokens = kChainBlocks * kBlockTokens;
    request.max_output_tokens = 256;
    const auto start = std::chrono::steady_clock::now();
    auto placement = world->scheduler->Decide(request);
    const auto end = std::chrono::steady_clock::now();
    latencies_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    if (!placement.ok()) {
      state.SkipWithError("decision failed");
      break;
    }
    state.PauseTiming();
    world->scheduler->ReportPrefillDone(*placement, placement->new_tokens, placement->cached_tokens,
                                        0.5);
    world->scheduler->ReportDecodeDone(*placement, request.prompt_tokens + 256);
    state.ResumeTiming();
  }
  std::sort(latencies_us.begin(), latencies_us.end());
  if (!latencies_us.empty()) {
    state.counters["p50_us"] = latencies_us[latencies_us.size() / 2];
    state.counters["p99_us"] =
        latencies_us[std::min(latencies_us.size() - 1, latencies_us.size() * 99 / 100)];
  }
  state.counters["indexed_blocks"] = double(world->scheduler->index().Stats().indexed_blocks);
  state.counters["nodes"] = kNodes;
}

BENCHMARK_CAPTURE(BM_Decide, strata, std::string("strata"))->Iterations(20000);
BENCHMARK_CAPTURE(BM_Decide, cache_aware_local, std::string("cache_aware_local"))
    ->Iterations(20000);
BENCHMARK_CAPTURE(BM_Decide, least_loaded, std::string("least_loaded"))->Iterations(20000);

}  // namespace
}  // namespace strata::scheduler

BENCHMARK_MAIN();
