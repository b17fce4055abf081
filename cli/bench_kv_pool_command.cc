// strata bench kv-pool: moving cache blocks between host payloads and the CUDA backend's KV pages.
//
//   strata bench kv-pool [--preset v2-lite-shape] [--pages 64] [--repeats 5] [--json PATH]
//                        [--through-cache 1] [--run-mib 32] [--pool cuda|host]
//                        [--register-arena 1] [--codec bf16|fp8]
//
// The pool has the preset's layout (every layer of a page: a block payload of layers x 64 tokens x
// 576 bf16, 2.0 MB for v2-lite-shape, 4.5 MB for v3 with 61 layers). Side by side, in one run:
//   - per page (KvPool::ImportPage / ExportPage) and batched (ImportPages / ExportPages), with
//     the payloads in ordinary (pageable) host vectors: the kernels read pinned staging slots
//     that the host fills;
//   - batched with the payloads in the pool's pinned host buffer (AllocateHostBuffer): the copy
//     engine moves them as they are and the kernels convert them on the device; in turns with a
//     second device pool whose kernels read and write them over PCIe in place (zero copy);
//   - through the cache (--through-cache): an in-process cache server (DRAM tier, shm on this
//     host) holds the pages as blocks; a load is CacheClient::Fetch (lookup, read, verify) plus
//     ImportPages, first into a fresh heap buffer per fetch, then into one reused pinned buffer,
//     each time importing after the whole fetch; then into the pinned buffer in runs of
//     --run-mib, each run imported while the next one is read; then (what the worker's loader
//     does) the same with the blocks read in place from the server's arena when the pool takes
//     them from there (KvPool::ReadsInPlace: the host pool does; the device pool registers the
//     arena with CUDA unless --register-arena 0; here before the first load, the worker in the
//     background), once without reading ahead and once as the client decides. The imports'
//     own share of the last two kinds of load is reported too. With --pool cuda all of it runs
//     into the zero-copy pool first, then into the default one.
// --pool host times the CPU backend's HostKvPool instead (its "pinned" buffer is heap memory):
// the same code path without a GPU, for CI. GB/s = payload bytes / wall time of the call(s) that
// move all --pages (median of --repeats). JSON ratios: kv_pool_{import,export}_batched_vs_per_page,
// kv_pool_{import,export}_pinned_vs_batched, kv_pool_{import,export}_copy_engine_vs_zero_copy
// and kv_load_through_cache_{runs,in_place}_copy_engine_vs_zero_copy (--pool cuda),
// kv_load_through_cache_pinned_vs_heap,
// kv_load_through_cache_runs_vs_whole, kv_load_through_cache_in_place_vs_runs.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "cache_service/cache_server.h"
#include "cli/commands.h"
#include "common/block_format.h"
#include "common/block_key.h"
#include "common/scratch_dir.h"
#include "common/strings.h"
#if STRATA_WITH_CUDA
#include "compute_nodes/backend/cuda/device_kv_pool.h"
#endif
#include "compute_nodes/cache_client/cache_client.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/runtime/kv_pool.h"

namespace strata::cli {
namespace {

struct Args {
  std::string preset = "v2-lite-shape", json, pool = "cuda";
  int64_t pages = 64, repeats = 5, run_mib = 32;
  bool through_cache = true;
  bool register_arena = true;  // --pool cuda: register the server's arena for reads in place
  std::string codec = "bf16";  // of the block payloads: bf16 | fp8

  runtime::PayloadDtype dtype() const {
    return codec == "fp8" ? runtime::PayloadDtype::kFp8E4M3 : runtime::PayloadDtype::kBf16;
  }
};

// Whether payload `b` holds the values of payload `a`: for bf16 the same bytes; for fp8 the same
// k_pe bytes and latent values within one e4m3 step at the top of each group (an fp8 payload read
// into bf16 pages and quantized again may land on a scale a bf16 rounding away).
bool SamePayload(runtime::PayloadDtype dtype, const runtime::KvLayout& l,
                 std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  if (dtype != runtime::PayloadDtype::kFp8E4M3) return std::equal(a.begin(), a.end(), b.begin());
  const int64_t codes = l.block_tokens * l.latent_dim, groups = codes / kFp8GroupSize;
  const int64_t kpe_bytes = 2 * l.block_tokens * l.rope_dim;
  const int64_t layer = codes + 4 * groups + kpe_bytes;
  for (int64_t at = 0; at < l.num_layers * layer; at += layer) {
    for (int64_t g = 0; g < groups; ++g) {
      float sa, sb;
      std::memcpy(&sa, a.data() + at + codes + 4 * g, 4);
      std::memcpy(&sb, b.data() + at + codes + 4 * g, 4);
      const float step = 32.5f * std::max(sa, sb);  // e4m3's step below 448, and a little
      for (int64_t k = g * kFp8GroupSize; k < (g + 1) * kFp8GroupSize; ++k) {
        const float va = Fp8E4M3ToFp32(a[at + k]) * sa, vb = Fp8E4M3ToFp32(b[at + k]) * sb;
        if (!(std::fabs(va - vb) <= step)) return false;
      }
    }
    const int64_t kpe = at + codes + 4 * groups;
    if (!std::equal(a.begin() + kpe, a.begin() + kpe + kpe_bytes, b.begin() + kpe)) return false;
  }
  return true;
}

void Check(const absl::Status& st) {
  if (!st.ok()) Fail(1, StrCat("bench kv-pool: ", st.ToString()));
}

// Median seconds of fn(k) for each k < ways over `repeats` rounds after one warm-up round; a
// round calls every k once, in turns, so drift in clocks or the link hits them alike.
template <typename Fn>
std::vector<double> MedianSecondsInTurns(int64_t repeats, int ways, const Fn& fn) {
  std::vector<std::vector<double>> s(ways);
  for (int64_t r = 0; r <= repeats; ++r) {
    for (int k = 0; k < ways; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fn(k);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) s[k].push_back(t);
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& v : s) {
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

template <typename Fn>
double MedianSeconds(int64_t repeats, const Fn& fn) {
  return MedianSecondsInTurns(repeats, 1, [&](int) { fn(); })[0];
}

// Seconds (medians) of a whole cached-prefix load through an in-process cache server: the fetch
// then one ImportPages (into a heap or the pinned buffer), or each run imported as it arrives.
struct ThroughCache {
  double fetch_heap = 0, load_heap = 0, fetch_pinned = 0, load_pinned = 0, load_runs = 0;
  double load_in_place = 0, load_in_place_serial = 0;
  // The ImportPages calls' own share (mean seconds per load) of the runs and in-place loads.
  double import_runs = 0, import_in_place = 0;
  bool in_place = false;  // the pool took the blocks from the server's arena (else: copies)
};

ThroughCache LoadThroughCache(const Args& a, runtime::KvPool& p, std::span<const int32_t> pages,
                              const std::vector<std::vector<uint8_t>>& payloads) {
  const runtime::KvLayout& l = p.layout();
  KvFormat format;
  format.codec = a.codec == "fp8" ? KvCodec::kFp8E4M3 : KvCodec::kBf16;
  format.block_tokens = static_cast<uint32_t>(l.block_tokens);
  const BlockLayout layout =
      MakeBlockLayout(format, static_cast<uint32_t>(l.num_layers),
                      static_cast<uint32_t>(l.latent_dim), static_cast<uint32_t>(l.rope_dim));
  absl::StatusOr<ScratchDir> scratch = ScratchDir::Create("strata-bench-kv-pool-");
  Check(scratch.status());
  const std::string& work = scratch->path();
  const uint64_t slot = (layout.TotalBytes() + 4095) / 4096 * 4096;
  cache::CacheServerOptions so;
  so.store.data_dir = work + "/cache";
  so.store.slot_bytes = slot;
  so.store.dram_capacity_bytes = (a.pages + 8) * slot;
  so.host_id = "bench-kv-pool";
  so.http_listen = "";
  so.cluster_secret = "bench";
  so.transfer_listen = "127.0.0.1:0";
  so.shm_socket_path = work + "/shm.sock";
  cache::CacheServer server(so);
  Check(server.Start());
  auto client =
      cache_client::CacheClient::Connect({.address = StrCat("127.0.0.1:", server.grpc_port()),
                                          .client_id = "bench-kv-pool",
                                          .host_id = "bench-kv-pool",
                                          .cluster_secret = "bench",
                                          .force_transport = transfer::TransportKind::kShm});
  if (!client.ok()) Fail(1, StrCat("bench kv-pool: ", client.status().ToString()));

  Namespace ns;
  ns.bytes.fill(0x5a);
  std::vector<uint32_t> tokens(a.pages * l.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 3);
  const std::vector<BlockKey> keys = ComputeBlockKeys(ns, tokens, format.block_tokens);
  std::vector<cache_client::BlockToSave> blocks;
  for (int64_t i = 0; i < a.pages; ++i) {
    blocks.push_back({.key = keys[i],
                      .parent = i > 0 ? keys[i - 1] : BlockKey{},
                      .tokens = std::vector<uint32_t>(tokens.begin() + i * l.block_tokens,
                                                      tokens.begin() + (i + 1) * l.block_tokens),
                      .payload = payloads[i]});  // alive until Save returns
  }
  auto saved = (*client)->Save(ns, "bench", layout, std::move(blocks), "bench-save");
  if (!saved.ok() || saved->stored != a.pages) {
    Fail(1, StrCat("bench kv-pool: saving the blocks: ",
                   saved.ok() ? saved->first_error.ToString() : saved.status().ToString()));
  }
  std::shared_ptr<HostBuffer> reused;
  const cache_client::FetchBuffer pinned = [&](size_t bytes) {
    if (reused == nullptr || reused.use_count() > 1 || reused->size() < bytes) {
      auto b = p.AllocateHostBuffer(bytes);
      if (!b.ok()) return b;
      reused = *b;
    }
    return absl::StatusOr<std::shared_ptr<HostBuffer>>(reused);
  };
  double import_s = 0;  // the import calls' seconds, summed over the loads
  auto import = [&](size_t first, std::span<const cache_client::FetchedBlock> blocks) {
    std::vector<std::span<const uint8_t>> in;
    for (const cache_client::FetchedBlock& b : blocks) in.push_back(b.payload);
    int64_t done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    Check(p.ImportPages(pages.subspan(first, in.size()), a.dtype(), in, &done));
    import_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
  };
  // One load; `fetch_s` (when set) gets the fetch's share: the import follows it.
  auto load = [&](const cache_client::FetchOptions& options, double* load_s,
                  double* fetch_s = nullptr) {
    std::vector<double> fetch;
    *load_s = MedianSeconds(a.repeats, [&] {
      const auto t0 = std::chrono::steady_clock::now();
      cache_client::FetchResult r = (*client)->Fetch(ns, keys, tokens, layout, "bench", options);
      fetch.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (static_cast<int64_t>(r.blocks.size()) != a.pages) {
        Fail(1, StrCat("bench kv-pool: fetched ", r.blocks.size(), " of ", a.pages,
                       " blocks: ", r.first_failure.ToString()));
      }
      if (!options.on_blocks) import(0, r.blocks);
    });
    if (fetch_s == nullptr) return;
    fetch.erase(fetch.begin());  // the warm-up
    std::sort(fetch.begin(), fetch.end());
    *fetch_s = fetch[fetch.size() / 2];
  };
  constexpr uint64_t kWhole = std::numeric_limits<uint64_t>::max();  // one run
  ThroughCache t;
  load({.run_bytes = kWhole}, &t.load_heap, &t.fetch_heap);
  load({.buffer = pinned, .run_bytes = kWhole}, &t.load_pinned, &t.fetch_pinned);
  const uint64_t run_bytes = uint64_t(a.run_mib) << 20;
  const double loads = static_cast<double>(a.repeats + 1);  // with the warm-up
  import_s = 0;
  load({.buffer = pinned, .on_blocks = import, .run_bytes = run_bytes}, &t.load_runs);
  t.import_runs = import_s / loads;
  cache_client::FetchOptions in_place{
      .buffer = pinned,
      .on_blocks = import,
      .in_place =
          [&](std::span<const uint8_t> region, const std::shared_ptr<const void>& owner) {
            t.in_place = p.ReadsInPlace(region, owner);
            return t.in_place;
          },
      .run_bytes = run_bytes,
      .read_ahead = false};
  load(in_place, &t.load_in_place_serial);
  // Last, so that the pages checked below hold what it loaded.
  in_place.read_ahead.reset();  // the client's default, as the worker runs it
  import_s = 0;
  load(in_place, &t.load_in_place);
  t.import_in_place = import_s / loads;
  std::vector<std::vector<uint8_t>> back;
  int64_t done = 0;
  Check(p.ExportPages(pages, a.dtype(), &back, &done));
  for (int64_t i = 0; i < a.pages; ++i) {
    if (!SamePayload(a.dtype(), l, back[i], payloads[i])) {
      Fail(1, StrCat("bench kv-pool: page ", i, " loaded wrong"));
    }
  }
  return t;
}

void Run(const Args& a) {
  if (a.pages <= 0 || a.repeats <= 0) Fail(2, "bench kv-pool: --pages and --repeats must be > 0");
  auto config = model::PresetConfig(a.preset);
  if (!config.ok()) Fail(2, StrCat("bench kv-pool: ", config.status().message()));
  const runtime::KvLayout layout{config->num_hidden_layers, 64, config->kv_lora_rank,
                                 config->qk_rope_head_dim};
  std::unique_ptr<runtime::KvPool> pool;
  if (a.pool == "host") {
    pool = std::make_unique<runtime::HostKvPool>(layout, a.pages, runtime::KvPrecision::kBf16);
  } else if (a.pool == "cuda") {
#if STRATA_WITH_CUDA
    auto made =
        cuda::DeviceKvPool::Create(layout, a.pages,
                                   {.register_shared_regions = a.register_arena,
                                    .register_in_background = false});  // in place from the start
    if (!made.ok()) Fail(1, StrCat("bench kv-pool: ", made.status().ToString()));
    pool = *std::move(made);
#else
    Fail(2, "bench kv-pool: this build has no CUDA; use --pool host");
#endif
  } else {
    Fail(2, StrCat("bench kv-pool: --pool is cuda or host, not ", a.pool));
  }
  runtime::KvPool& p = *pool;
  std::vector<int32_t> pages;
  for (int64_t i = 0; i < a.pages; ++i) pages.push_back(*p.Allocate());
  std::shuffle(pages.begin(), pages.end(), std::mt19937(1));
  const size_t bytes = p.PayloadBytes(a.dtype());
  std::vector<std::vector<uint8_t>> payloads(a.pages);
  {
    const size_t bf16_bytes = p.PayloadBytes(runtime::PayloadDtype::kBf16);
    std::vector<std::vector<uint8_t>> bf16(a.pages, std::vector<uint8_t>(bf16_bytes));
    std::mt19937 rng(2);
    for (auto& v : bf16) {  // finite normal values of both signs, magnitudes 2^-8 to 2^2
      for (size_t i = 0; i < bf16_bytes; i += 2) {
        v[i] = static_cast<uint8_t>(rng());
        v[i + 1] = static_cast<uint8_t>((0x3b + rng() % 5) | (rng() & 0x80));
      }
    }
    if (a.dtype() == runtime::PayloadDtype::kBf16) {
      payloads = std::move(bf16);
    } else {  // fp8 payloads: bf16 pages quantized by the pool
      const std::vector<std::span<const uint8_t>> in(bf16.begin(), bf16.end());
      int64_t done = 0;
      Check(p.ImportPages(pages, runtime::PayloadDtype::kBf16, in, &done));
      Check(p.ExportPages(pages, a.dtype(), &payloads, &done));
    }
  }
  std::vector<std::span<const uint8_t>> spans(payloads.begin(), payloads.end());
  const double total = static_cast<double>(bytes) * a.pages;
  const double import_one = MedianSeconds(a.repeats, [&] {
    for (int64_t i = 0; i < a.pages; ++i) {
      Check(p.ImportPage(pages[i], a.dtype(), spans[i]));
    }
  });
  const double import_batched = MedianSeconds(a.repeats, [&] {
    int64_t done = 0;
    Check(p.ImportPages(pages, a.dtype(), spans, &done));
  });
  std::vector<std::vector<uint8_t>> out(a.pages);
  const double export_one = MedianSeconds(a.repeats, [&] {
    for (int64_t i = 0; i < a.pages; ++i) {
      Check(p.ExportPage(pages[i], a.dtype(), &out[i]));
    }
  });
  const double export_batched = MedianSeconds(a.repeats, [&] {
    int64_t done = 0;
    Check(p.ExportPages(pages, a.dtype(), &out, &done));
  });
  for (int64_t i = 0; i < a.pages; ++i) {
    if (!SamePayload(a.dtype(), layout, out[i], payloads[i])) {
      Fail(1, StrCat("bench kv-pool: page ", i, " did not round-trip"));
    }
  }

  // The same payloads in the pool's pinned buffer. A device pool moves them by the copy engine;
  // a second one, whose kernels read and write them over PCIe in place (zero copy), takes turns
  // with it (pool k = 1; the host pool is timed alone).
  std::unique_ptr<runtime::KvPool> zero_copy;
#if STRATA_WITH_CUDA
  if (a.pool == "cuda") {
    auto made = cuda::DeviceKvPool::Create(layout, a.pages,
                                           {.register_shared_regions = a.register_arena,
                                            .register_in_background = false,
                                            .copy_engine = false});
    if (!made.ok()) Fail(1, StrCat("bench kv-pool: ", made.status().ToString()));
    zero_copy = *std::move(made);
  }
#endif
  runtime::KvPool* pools[2] = {&p, zero_copy != nullptr ? zero_copy.get() : &p};
  std::vector<int32_t> other_pages = pages;
  if (zero_copy != nullptr) {
    for (int32_t& page : other_pages) page = *zero_copy->Allocate();
    std::shuffle(other_pages.begin(), other_pages.end(), std::mt19937(3));
  }
  const std::span<const int32_t> pool_pages[2] = {pages, other_pages};
  auto pinned = p.AllocateHostBuffer(bytes * a.pages);
  if (!pinned.ok()) Fail(1, StrCat("bench kv-pool: ", pinned.status().ToString()));
  std::vector<std::span<const uint8_t>> pinned_in;
  std::vector<std::span<uint8_t>> pinned_out;
  for (int64_t i = 0; i < a.pages; ++i) {
    uint8_t* at = (*pinned)->data() + i * bytes;
    std::memcpy(at, payloads[i].data(), bytes);
    pinned_in.emplace_back(at, bytes);
    pinned_out.emplace_back(at, bytes);
  }
  const int ways = zero_copy != nullptr ? 2 : 1;
  const std::vector<double> imports = MedianSecondsInTurns(a.repeats, ways, [&](int k) {
    int64_t done = 0;
    Check(pools[k]->ImportPages(pool_pages[k], a.dtype(), pinned_in, &done));
  });
  for (int k = ways - 1; k >= 0; --k) {  // the default pool's export last: its bytes are checked
    std::memset((*pinned)->data(), 0, (*pinned)->size());
    int64_t done = 0;
    Check(pools[k]->ExportPagesInto(pool_pages[k], a.dtype(), pinned_out, &done));
    for (int64_t i = 0; i < a.pages; ++i) {
      if (!SamePayload(a.dtype(), layout, payloads[i], pinned_out[i])) {
        Fail(1, StrCat("bench kv-pool: page ", i, " did not round-trip through the pinned buffer",
                       k == 1 ? " (zero copy)" : ""));
      }
    }
  }
  const std::vector<double> exports = MedianSecondsInTurns(a.repeats, ways, [&](int k) {
    int64_t done = 0;
    Check(pools[k]->ExportPagesInto(pool_pages[k], a.dtype(), pinned_out, &done));
  });
  // [1]: the zero-copy pool's, read only when there is one.
  const double import_pinned = imports[0], import_zero_copy = imports.back();
  const double export_pinned = exports[0], export_zero_copy = exports.back();
  // Through the cache, the zero-copy pool first, then the default one.
  const ThroughCache cached_zero_copy = a.through_cache && zero_copy != nullptr
                                            ? LoadThroughCache(a, *zero_copy, other_pages, payloads)
                                            : ThroughCache{};
  const ThroughCache cached =
      a.through_cache ? LoadThroughCache(a, p, pages, payloads) : ThroughCache{};
  const bool cached_both = a.through_cache && zero_copy != nullptr;

  std::cout << fmt::format(
      "bench kv-pool: {} pool, {} ({} layers), {} pages of {:.2f} MB ({} payloads)\n"
      "  import: per page {:.2f} GB/s, batched {:.2f} GB/s ({:.2f}x), pinned {:.2f} GB/s "
      "({:.2f}x)\n"
      "  export: per page {:.2f} GB/s, batched {:.2f} GB/s ({:.2f}x), pinned {:.2f} GB/s "
      "({:.2f}x)\n",
      a.pool, a.preset, layout.num_layers, a.pages, bytes / 1e6, a.codec, total / import_one / 1e9,
      total / import_batched / 1e9, import_one / import_batched, total / import_pinned / 1e9,
      import_batched / import_pinned, total / export_one / 1e9, total / export_batched / 1e9,
      export_one / export_batched, total / export_pinned / 1e9, export_batched / export_pinned);
  if (zero_copy != nullptr) {
    std::cout << fmt::format(
        "  pinned, zero copy (the kernels over PCIe, in turns with the above): import {:.2f} "
        "GB/s, export {:.2f} GB/s; copy engine / zero copy {:.3f}x import, {:.3f}x export\n",
        total / import_zero_copy / 1e9, total / export_zero_copy / 1e9,
        import_zero_copy / import_pinned, export_zero_copy / export_pinned);
  }
  if (a.through_cache) {
    std::cout << fmt::format(
        "  load through the cache (shm, fetch + verify + import): heap buffer {:.2f} GB/s "
        "(fetch alone {:.2f}), pinned buffer {:.2f} GB/s (fetch alone {:.2f}): {:.2f}x; "
        "{} MiB runs imported as they arrive {:.2f} GB/s: {:.2f}x; the same {} {:.2f} GB/s: "
        "{:.2f}x\n",
        total / cached.load_heap / 1e9, total / cached.fetch_heap / 1e9,
        total / cached.load_pinned / 1e9, total / cached.fetch_pinned / 1e9,
        cached.load_heap / cached.load_pinned, a.run_mib, total / cached.load_runs / 1e9,
        cached.load_pinned / cached.load_runs,
        cached.in_place ? "read in place from the arena" : "with reads in place declined (copies)",
        total / cached.load_in_place / 1e9, cached.load_runs / cached.load_in_place);
    std::cout << fmt::format(
        "  of which the imports: {:.2f} GB/s in runs, {:.2f} GB/s in place; in place without "
        "reading ahead {:.2f} GB/s\n",
        total / cached.import_runs / 1e9, total / cached.import_in_place / 1e9,
        total / cached.load_in_place_serial / 1e9);
  }
  if (cached_both) {
    std::cout << fmt::format(
        "  the same loads into the zero-copy pool (before the above): runs {:.2f} GB/s, in place "
        "{:.2f} GB/s (imports {:.2f} / {:.2f} GB/s); copy engine / zero copy {:.3f}x runs, "
        "{:.3f}x in place\n",
        total / cached_zero_copy.load_runs / 1e9, total / cached_zero_copy.load_in_place / 1e9,
        total / cached_zero_copy.import_runs / 1e9, total / cached_zero_copy.import_in_place / 1e9,
        cached_zero_copy.load_runs / cached.load_runs,
        cached_zero_copy.load_in_place / cached.load_in_place);
  }
  if (!a.json.empty()) {
    nlohmann::json gbps = {{"import_per_page", total / import_one / 1e9},
                           {"import_batched", total / import_batched / 1e9},
                           {"import_pinned", total / import_pinned / 1e9},
                           {"export_per_page", total / export_one / 1e9},
                           {"export_batched", total / export_batched / 1e9},
                           {"export_pinned", total / export_pinned / 1e9}};
    nlohmann::json ratios = {{"kv_pool_import_batched_vs_per_page", import_one / import_batched},
                             {"kv_pool_export_batched_vs_per_page", export_one / export_batched},
                             {"kv_pool_import_pinned_vs_batched", import_batched / import_pinned},
                             {"kv_pool_export_pinned_vs_batched", export_batched / export_pinned}};
    if (zero_copy != nullptr) {
      gbps["import_pinned_zero_copy"] = total / import_zero_copy / 1e9;
      gbps["export_pinned_zero_copy"] = total / export_zero_copy / 1e9;
      ratios["kv_pool_import_copy_engine_vs_zero_copy"] = import_zero_copy / import_pinned;
      ratios["kv_pool_export_copy_engine_vs_zero_copy"] = export_zero_copy / export_pinned;
    }
    if (a.through_cache) {
      gbps["load_through_cache_heap"] = total / cached.load_heap / 1e9;
      gbps["load_through_cache_pinned"] = total / cached.load_pinned / 1e9;
      gbps["fetch_heap"] = total / cached.fetch_heap / 1e9;
      gbps["fetch_pinned"] = total / cached.fetch_pinned / 1e9;
      gbps["load_through_cache_runs"] = total / cached.load_runs / 1e9;
      gbps["load_through_cache_in_place"] = total / cached.load_in_place / 1e9;
      gbps["load_through_cache_in_place_serial"] = total / cached.load_in_place_serial / 1e9;
      gbps["import_in_runs"] = total / cached.import_runs / 1e9;
      gbps["import_in_place"] = total / cached.import_in_place / 1e9;
      ratios["kv_load_through_cache_pinned_vs_heap"] = cached.load_heap / cached.load_pinned;
      ratios["kv_load_through_cache_runs_vs_whole"] = cached.load_pinned / cached.load_runs;
      ratios["kv_load_through_cache_in_place_vs_runs"] = cached.load_runs / cached.load_in_place;
      if (cached_both) {
        gbps["load_through_cache_runs_zero_copy"] = total / cached_zero_copy.load_runs / 1e9;
        gbps["load_through_cache_in_place_zero_copy"] =
            total / cached_zero_copy.load_in_place / 1e9;
        ratios["kv_load_through_cache_runs_copy_engine_vs_zero_copy"] =
            cached_zero_copy.load_runs / cached.load_runs;
        ratios["kv_load_through_cache_in_place_copy_engine_vs_zero_copy"] =
            cached_zero_copy.load_in_place / cached.load_in_place;
      }
    }
    nlohmann::json report = {{"pool", a.pool},   {"preset", a.preset},  {"pages", a.pages},
                             {"codec", a.codec}, {"page_bytes", bytes}, {"gbps", gbps},
                             {"ratios", ratios}};
    std::ofstream f(a.json);
    f << report.dump(2) << "\n";
    if (!f) Fail(1, StrCat("bench kv-pool: cannot write ", a.json));
  }
}

}  // namespace

void RegisterBenchKvPoolCommand(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "kv-pool",
      "Time block payloads into / out of KV pages: per page, batched, pinned, through the cache");
  cmd->add_option("--preset", a->preset, "Model preset whose KV layout the pool takes")
      ->default_val("v2-lite-shape");
  cmd->add_option("--pages", a->pages, "Pages moved per call")->default_val(64);
  cmd->add_option("--repeats", a->repeats, "Timed calls (median)")->default_val(5);
  cmd->add_option("--json", a->json, "Write the figures as JSON to this file");
  cmd->add_option("--pool", a->pool, "cuda: the CUDA backend's pool; host: the CPU backend's")
      ->default_val("cuda");
  cmd->add_option("--through-cache", a->through_cache,
                  "Also time loads through an in-process cache server (shm)")
      ->default_val(true);
  cmd->add_option("--register-arena", a->register_arena,
                  "--pool cuda: register the cache server's arena with CUDA so the kernels read "
                  "blocks in place (0: the device pool declines, blocks are copied)")
      ->default_val(true);
  cmd->add_option("--codec", a->codec, "Codec of the block payloads moved")
      ->default_val("bf16")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--run-mib", a->run_mib, "Run size of the pipelined load through the cache")
      ->default_val(32)
      ->check(CLI::Range(1, 4096));
  cmd->callback([a] { Run(*a); });
}

}  // namespace strata::cli
