// strata bench decode --concurrent-loads PAGES: what a KV load running beside decode steps costs
// them (a decode worker loads the next request's cached prefix while it decodes the others).
//
// For each batch size, greedy decode steps (as in bench decode) are timed three ways, in turns,
// --steps each per round over two rounds: alone; while a loader thread imports PAGES block
// payloads into a second device KV pool over and over with the kernels reading them over PCIe
// (zero copy); and the same with the payloads moved by the copy engine (the pool's default). The
// payloads lie in one pinned buffer 4 KiB apart, as blocks fetched from a cache server do (each
// has its header and tokens in front). Reported: median step ms per way and the loader's GB/s
// during the steps.
#include "cli/bench_decode_loads.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "common/strings.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Imports `pages` of `pool` from `payloads` in a loop on a thread of its own until stopped;
// reports the bytes it moved per second while it ran.
class Loader {
 public:
  Loader(runtime::KvPool& pool, std::span<const int32_t> pages,
         std::span<const std::span<const uint8_t>> payloads)
      : pool_(pool), pages_(pages), payloads_(payloads) {}

  void Start() {
    stop_ = false;
    bytes_ = 0;
    start_ = Clock::now();
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        int64_t done = 0;
        if (auto st = pool_.ImportPages(pages_, runtime::PayloadDtype::kBf16, payloads_, &done);
            !st.ok()) {
          Fail(1, StrCat("bench decode: concurrent load: ", st.ToString()));
        }
        bytes_ += static_cast<double>(payloads_.size() * payloads_[0].size());
      }
    });
  }
  // GB/s over the run.
  double Stop() {
    stop_ = true;
    thread_.join();
    return bytes_ / std::chrono::duration<double>(Clock::now() - start_).count() / 1e9;
  }

 private:
  runtime::KvPool& pool_;
  std::span<const int32_t> pages_;
  std::span<const std::span<const uint8_t>> payloads_;
  std::atomic<bool> stop_{false};
  double bytes_ = 0;
  Clock::time_point start_;
  std::thread thread_;
};

}  // namespace

void BenchDecodeWithLoads(cuda::CudaEngine& engine, const std::vector<int64_t>& batches,
                          int64_t context, int64_t steps, int64_t load_pages,
                          nlohmann::json& report) {
  const runtime::KvLayout layout = engine.kv_pool().layout();
  std::unique_ptr<cuda::DeviceKvPool> pools[2];
  for (int k = 0; k < 2; ++k) {  // 0: zero copy, 1: by the copy engine
    auto made = cuda::DeviceKvPool::Create(layout, load_pages, {.copy_engine = k == 1});
    if (!made.ok()) Fail(1, StrCat("bench decode: ", made.status().ToString()));
    pools[k] = *std::move(made);
  }
  const size_t bytes = pools[0]->PayloadBytes(runtime::PayloadDtype::kBf16);
  const size_t stride = bytes + 4096;
  auto buffer = pools[0]->AllocateHostBuffer(load_pages * stride);
  if (!buffer.ok()) Fail(1, StrCat("bench decode: ", buffer.status().ToString()));
  std::mt19937 rng(5);
  std::vector<int32_t> pages[2];
  std::vector<std::span<const uint8_t>> payloads;
  for (int64_t i = 0; i < load_pages; ++i) {
    uint8_t* at = (*buffer)->data() + i * stride;
    for (size_t k = 0; k < bytes; k += 2) {  // finite bf16 of both signs
      const uint16_t v = static_cast<uint16_t>((rng() & 0x3fff) | 0x3000 | ((k & 2) << 14));
      std::memcpy(at + k, &v, 2);
    }
    payloads.emplace_back(at, bytes);
    for (int k = 0; k < 2; ++k) pages[k].push_back(*pools[k]->Allocate());
  }
  Loader loaders[2] = {{*pools[0], pages[0], payloads}, {*pools[1], pages[1], payloads}};
  const char* kWays[3] = {"alone", "zero_copy", "copy_engine"};
  std::cout << fmt::format(
      "greedy steps beside a loader importing {} pages ({:.1f} MB, payloads 4 KiB apart in "
      "pinned memory) in a loop:\n{:>6} {:>12} {:>16} {:>18} {:>12} {:>12}\n",
      load_pages, load_pages * bytes / 1e6, "batch", "alone ms", "zero copy ms", "copy engine ms",
      "zc GB/s", "ce GB/s");
  std::mt19937 token_rng(1);
  for (int64_t b : batches) {
    std::vector<runtime::PageTable> tables(b);
    for (auto& t : tables) {
      if (auto st = runtime::EnsureCapacity(engine.kv_pool(), t, context + 6 * (steps + 3) + 1);
          !st.ok()) {
        Fail(1, st.ToString());
      }
    }
    std::vector<double> ms[3], gbps[3];
    std::vector<int32_t> tokens(b);
    std::vector<runtime::SequenceOutput> out;
    int64_t position = context;
    for (int round = 0; round < 2; ++round) {
      for (int way = 0; way < 3; ++way) {
        if (way > 0) loaders[way - 1].Start();
        for (int64_t step = 0; step < steps + 3; ++step, ++position) {
          std::vector<runtime::SequenceInput> batch(b);
          for (int64_t s = 0; s < b; ++s) {
            tokens[s] = static_cast<int32_t>(token_rng() % engine.config().vocab_size);
            batch[s] = {std::span<const int32_t>(&tokens[s], 1), position, &tables[s], false,
                        runtime::AttentionForm::kAbsorbed};
            batch[s].draw = runtime::TokenDraw{};
          }
          const auto s0 = Clock::now();
          if (auto st = engine.Forward(batch, &out); !st.ok()) Fail(1, st.ToString());
          if (step >= 3) {
            ms[way].push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
          }
        }
        if (way > 0) gbps[way].push_back(loaders[way - 1].Stop());
      }
    }
    for (auto& t : tables) runtime::ReleasePages(engine.kv_pool(), t);
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double alone = median(ms[0]), zc = median(ms[1]), ce = median(ms[2]);
    const double zc_gbps = (gbps[1][0] + gbps[1][1]) / 2, ce_gbps = (gbps[2][0] + gbps[2][1]) / 2;
    std::cout << fmt::format(
        "{:>6} {:>12.3f} {:>9.3f} ({:.2f}x) {:>11.3f} ({:.2f}x) {:>12.2f} "
        "{:>12.2f}\n",
        b, alone, zc, zc / alone, ce, ce / alone, zc_gbps, ce_gbps);
    for (int way = 0; way < 3; ++way) {
      report["concurrent_loads"].push_back(
          {{"batch", b},
           {"way", kWays[way]},
           {"step_ms_median", median(ms[way])},
           {"load_gbps", way == 0 ? 0.0 : (gbps[way][0] + gbps[way][1]) / 2}});
    }
    report["ratios"][StrCat("decode_step_greedy_with_loads_zero_copy_vs_alone_b", b)] = zc / alone;
    report["ratios"][StrCat("decode_step_greedy_with_loads_copy_engine_vs_alone_b", b)] =
        ce / alone;
  }
}

}  // namespace strata::cli
