// strata bench kv-pool: moving cache blocks between host payloads and the CUDA backend's KV pages,
// one page per call (KvPool::ImportPage / ExportPage) against the batched moves (ImportPages /
// ExportPages), side by side.
//
//   strata bench kv-pool [--preset v2-lite-shape] [--pages 64] [--repeats 5] [--json PATH]
//
// The pool has the preset's layout (every layer of a page: a block payload of layers x 64 tokens x
// 576 bf16, 2.0 MB for v2-lite-shape, 4.5 MB for v3 with 61 layers); the payloads are ordinary
// (pageable) host vectors, as the cache client returns them. GB/s = payload bytes / wall time of
// the call that moves all --pages (median of --repeats). JSON ratios: kv_pool_import_batched_vs_
// per_page, kv_pool_export_batched_vs_per_page.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <vector>

#include "cli/commands.h"
#include "common/strings.h"
#include "compute_nodes/backend/cuda/device_kv_pool.h"
#include "compute_nodes/model/make_random.h"

namespace strata::cli {
namespace {

struct Args {
  std::string preset = "v2-lite-shape", json;
  int64_t pages = 64, repeats = 5;
};

template <typename Fn>
double MedianSeconds(int64_t repeats, const Fn& fn) {
  std::vector<double> s;
  for (int64_t r = 0; r <= repeats; ++r) {  // r = 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) s.push_back(t);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

void Run(const Args& a) {
  if (a.pages <= 0 || a.repeats <= 0) Fail(2, "bench kv-pool: --pages and --repeats must be > 0");
  auto config = model::PresetConfig(a.preset);
  if (!config.ok()) Fail(2, StrCat("bench kv-pool: ", config.status().message()));
  const runtime::KvLayout layout{config->num_hidden_layers, 64, config->kv_lora_rank,
                                 config->qk_rope_head_dim};
  auto pool = cuda::DeviceKvPool::Create(layout, a.pages);
  if (!pool.ok()) Fail(1, StrCat("bench kv-pool: ", pool.status().ToString()));
  runtime::KvPool& p = **pool;
  std::vector<int32_t> pages;
  for (int64_t i = 0; i < a.pages; ++i) pages.push_back(*p.Allocate());
  std::shuffle(pages.begin(), pages.end(), std::mt19937(1));
  const size_t bytes = p.PayloadBytes(runtime::PayloadDtype::kBf16);
  std::vector<std::vector<uint8_t>> payloads(a.pages, std::vector<uint8_t>(bytes));
  std::mt19937 rng(2);
  for (auto& v : payloads) {
    for (size_t i = 0; i < bytes; i += 2) v[i] = static_cast<uint8_t>(rng());  // finite bf16
  }
  std::vector<std::span<const uint8_t>> spans(payloads.begin(), payloads.end());
  auto check = [](const absl::Status& st) {
    if (!st.ok()) Fail(1, StrCat("bench kv-pool: ", st.ToString()));
  };
  const double total = static_cast<double>(bytes) * a.pages;
  const double import_one = MedianSeconds(a.repeats, [&] {
    for (int64_t i = 0; i < a.pages; ++i) {
      check(p.ImportPage(pages[i], runtime::PayloadDtype::kBf16, spans[i]));
    }
  });
  const double import_batched = MedianSeconds(a.repeats, [&] {
    int64_t done = 0;
    check(p.ImportPages(pages, runtime::PayloadDtype::kBf16, spans, &done));
  });
  std::vector<std::vector<uint8_t>> out(a.pages);
  const double export_one = MedianSeconds(a.repeats, [&] {
    for (int64_t i = 0; i < a.pages; ++i) {
      check(p.ExportPage(pages[i], runtime::PayloadDtype::kBf16, &out[i]));
    }
  });
  const double export_batched = MedianSeconds(a.repeats, [&] {
    int64_t done = 0;
    check(p.ExportPages(pages, runtime::PayloadDtype::kBf16, &out, &done));
  });
  for (int64_t i = 0; i < a.pages; ++i) {
    if (out[i] != payloads[i]) Fail(1, StrCat("bench kv-pool: page ", i, " did not round-trip"));
  }
  std::cout << fmt::format(
      "bench kv-pool: {} ({} layers), {} pages of {:.2f} MB (bf16 payloads, pageable host memory)\n"
      "  import: per page {:.2f} GB/s, batched {:.2f} GB/s ({:.2f}x)\n"
      "  export: per page {:.2f} GB/s, batched {:.2f} GB/s ({:.2f}x)\n",
      a.preset, layout.num_layers, a.pages, bytes / 1e6, total / import_one / 1e9,
      total / import_batched / 1e9, import_one / import_batched, total / export_one / 1e9,
      total / export_batched / 1e9, export_one / export_batched);
  if (!a.json.empty()) {
    nlohmann::json report = {
        {"preset", a.preset},
        {"pages", a.pages},
        {"page_bytes", bytes},
        {"gbps",
         {{"import_per_page", total / import_one / 1e9},
          {"import_batched", total / import_batched / 1e9},
          {"export_per_page", total / export_one / 1e9},
          {"export_batched", total / export_batched / 1e9}}},
        {"ratios",
         {{"kv_pool_import_batched_vs_per_page", import_one / import_batched},
          {"kv_pool_export_batched_vs_per_page", export_one / export_batched}}}};
    std::ofstream f(a.json);
    f << report.dump(2) << "\n";
    if (!f) Fail(1, StrCat("bench kv-pool: cannot write ", a.json));
  }
}

}  // namespace

void RegisterBenchKvPoolCommand(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "kv-pool", "Time block payloads into / out of the CUDA KV pages, per page and batched");
  cmd->add_option("--preset", a->preset, "Model preset whose KV layout the pool takes")
      ->default_val("v2-lite-shape");
  cmd->add_option("--pages", a->pages, "Pages moved per call")->default_val(64);
  cmd->add_option("--repeats", a->repeats, "Timed calls (median)")->default_val(5);
  cmd->add_option("--json", a->json, "Write the figures as JSON to this file");
  cmd->callback([a] { Run(*a); });
}

}  // namespace strata::cli
