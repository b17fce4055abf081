// strata bench kernels: times the CUDA kernels on the local GPU and compares them with the
// FlashMLA figures measured on an H200 of this workplace (issue #9).
//
//   strata bench kernels [--json PATH] [--iters N]
//                        [--only mla_decode,prefill,kv_pages,sample,barrier]
//                        [--mla-heads 16,32,64,128] [--mla-batch 128] [--mla-seqs 4096,...]
//
// MLA decode: batch 128 (--mla-batch; FlashMLA figures exist for 128 only, other batches are
// timed without a ratio and their JSON keys end in _b<batch>: the few-row steps of a decode), bf16,
// every sequence s_k tokens long, pages in random order; the whole call (split kernel + combine)
// timed with CUDA events, median of --iters after warm-up; the variants of a point (split counts
// of the kernel kAuto runs at that length, "auto=" in the sweep, and each kernel by name) run in
// turns, one launch each per round, so that clock changes under sustained load hit them alike, and
// each launch is queued before the GPU reaches it (the events time device work, not the
// launcher's host work).
// TB/s counts KV bytes + q + out; TFLOPS counts 2 * b * h_q * s_k * (576 + 512).
//
// Prefill attention: 4K-token prompts (and others), bf16, qk 192 / v 128, causal or one
// non-causal prefix chunk; TFLOPS counts 2 * (192 + 128) per visible (query, key) pair and head;
// MFU against 790 TFLOPS (the bf16 rate measured on an H200 of this workplace).
//
// KV pages: 64 blocks of a 61-layer DeepSeek-V3 payload (B = 64) moved between pinned host (or
// device) payloads and random pages of a per-layer pool by the gather/scatter kernels; GB/s counts
// payload bytes. cudaMemcpyAsync of the same bytes from/to pinned memory is the PCIe reference.
//
// Sampling (--only sample; bench_kernels_sample.h): the greedy and temperature/top-k/top-p token
// pickers by batch, vocab and logit spread.
//
// Grid barrier (--only barrier; bench_kernels_barrier.h): a persistent kernel's grid-wide barrier
// against the kernel boundary it would replace.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli/bench_kernels_barrier.h"
#include "cli/bench_kernels_sample.h"
#include "cli/bench_kernels_timing.h"
#include "cli/commands.h"
#include "common/cuda/cuda_status.h"
#include "common/status.h"
#include "common/strings.h"
#include "kernels/kv_pages/kv_pages.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/prefill_attention/prefill_attention.h"

namespace strata::cli {
namespace {

using bench_kernels::DeviceBuffer;
using bench_kernels::FillRandomBf16;
using bench_kernels::MedianMs;
using bench_kernels::MedianMsInTurns;
using kernels::MlaDecodeParams;

// FlashMLA on an H200 of this workplace (issue #9): TB/s for h_q 16/64, TFLOPS for h_q 128.
// 0 where the issue gives no figure (h_q 32): such points are timed but get no ratio.
double FlashMlaFigure(int h_q, int s_k) {
  static const std::map<std::pair<int, int>, double> kFigures = {
      {{64, 4096}, 3.60}, {{64, 8192}, 3.81}, {{64, 16384}, 3.83}, {{64, 32768}, 3.82},
      {{16, 4096}, 3.49}, {{16, 8192}, 4.16}, {{16, 16384}, 4.21}, {{16, 32768}, 4.18},
      {{128, 4096}, 633}, {{128, 8192}, 623}, {{128, 16384}, 596}, {{128, 32768}, 588}};
  const auto it = kFigures.find({h_q, s_k});
  return it == kFigures.end() ? 0.0 : it->second;
}

struct MlaPoints {
  std::vector<int> heads_q = {16, 64, 128};
  int batch = 128;
  std::vector<int> seqs = {4096, 8192, 16384, 32768};
};

absl::Status BenchMlaDecode(int iters, const MlaPoints& points_wanted, nlohmann::json& report) {
  const int batch = points_wanted.batch;
  const std::vector<int>& seqs = points_wanted.seqs;
  const std::vector<int>& heads_q = points_wanted.heads_q;
  const int max_seq = (*std::max_element(seqs.begin(), seqs.end()) + kernels::kMlaPageSize - 1) /
                      kernels::kMlaPageSize * kernels::kMlaPageSize;
  // Ratio keys name the batch unless it is the 128.
  auto key = [&](std::string_view what, int h_q, int s_k) {
    return fmt::format("{}_h{}_s{}{}", what, h_q, s_k,
                       batch == 128 ? "" : fmt::format("_b{}", batch));
  };
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const int pages_per_seq = max_seq / kernels::kMlaPageSize;
  const int num_pages = batch * pages_per_seq;
  const size_t kv_bytes =
      static_cast<size_t>(num_pages) * kernels::kMlaPageSize * kernels::kMlaQkHeadDim * 2;
  DeviceBuffer kv, q, out, lse, table, lens, ws;
  RETURN_IF_ERROR(kv.Allocate(kv_bytes));
  RETURN_IF_ERROR(FillRandomBf16(kv.ptr, kv_bytes, 1));
  const size_t q_bytes = static_cast<size_t>(batch) * 128 * kernels::kMlaQkHeadDim * 2;
  RETURN_IF_ERROR(q.Allocate(q_bytes));
  RETURN_IF_ERROR(FillRandomBf16(q.ptr, q_bytes, 2));
  RETURN_IF_ERROR(out.Allocate(static_cast<size_t>(batch) * 128 * kernels::kMlaValueDim * 2));
  RETURN_IF_ERROR(lse.Allocate(static_cast<size_t>(batch) * 128 * 4));
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(3));
  RETURN_IF_ERROR(table.Allocate(pages.size() * 4));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(table.ptr, pages.data(), pages.size() * 4, cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(lens.Allocate(batch * 4));
  RETURN_IF_ERROR(
      ws.Allocate(kernels::MlaDecodeWorkspaceBytes(batch, 128, kernels::kMlaMaxSplits)));

  // Everything but the cache and the splits.
  auto params_for = [&](int h_q) {
    MlaDecodeParams p;
    p.batch = batch;
    p.num_heads_q = h_q;
    p.num_pages = num_pages;
    p.max_pages_per_seq = pages_per_seq;
    p.softmax_scale = 0.0721688f;  // 1/sqrt(192)
    p.q = static_cast<const __nv_bfloat16*>(q.ptr);
    p.block_table = static_cast<const int32_t*>(table.ptr);
    p.seqlens = static_cast<const int32_t*>(lens.ptr);
    p.out = static_cast<__nv_bfloat16*>(out.ptr);
    p.lse = static_cast<float*>(lse.ptr);
    return p;
  };
  nlohmann::json points = nlohmann::json::array();
  double min_ratio = 1e30;
  nlohmann::json ratios = nlohmann::json::object();
  std::cout << fmt::format("{:>4} {:>6} {:>6} {:>9} {:>7} {:>8} {:>9} {:>7}  sweep(splits:ms)\n",
                           "h_q", "s_k", "splits", "ms", "TB/s", "TFLOPS", "FlashMLA", "ratio");
  for (int h_q : heads_q) {
    for (int s_k : seqs) {
      std::vector<int32_t> seqlens(batch, s_k);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(lens.ptr, seqlens.data(), batch * 4, cudaMemcpyHostToDevice));
      MlaDecodeParams p = params_for(h_q);
      p.kv_cache = static_cast<const __nv_bfloat16*>(kv.ptr);
      const int chosen = kernels::MlaDecodeNumSplits(batch, h_q, s_k, num_sms);
      // The kernel kAuto runs for a block table sized to s_k (this one is sized to the longest
      // point), named, so that each point times what a launch at its length gets.
      const kernels::MlaDecodeImpl auto_impl = kernels::MlaDecodeAutoImpl(
          batch, h_q, (s_k + kernels::kMlaPageSize - 1) / kernels::kMlaPageSize, num_sms,
          kernels::MlaKvDtype::kBf16);
      std::vector<int> candidates = {chosen, 1, 2, 3, 4, 6, 8};
      if (batch < 128) candidates.insert(candidates.end(), {12, 16, 24, 32});
      const int max_splits = std::min(kernels::kMlaMaxSplits,
                                      (s_k + kernels::kMlaPageSize - 1) / kernels::kMlaPageSize);
      std::erase_if(candidates, [&](int c) { return c != chosen && c > max_splits; });
      std::sort(candidates.begin(), candidates.end());
      candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
      // Every variant of the point, timed in turns: kAuto at each split count, and where kAuto
      // takes a Hopper kernel, the mma.sync kernel at its own split choice and both Hopper
      // kernels by name at the chosen splits.
      std::vector<std::string> names;
      std::vector<std::function<absl::Status()>> launches;
      auto add = [&](std::string name, int splits, kernels::MlaDecodeImpl impl) {
        MlaDecodeParams v = p;
        v.num_splits = splits;
        v.impl = impl;
        v.o_accum = nullptr;
        v.lse_accum = nullptr;
        kernels::MlaDecodeSetWorkspace(v, ws.ptr);
        names.push_back(std::move(name));
        launches.push_back([v] { return kernels::LaunchMlaDecode(v, nullptr); });
      };
      for (int splits : candidates) add(std::to_string(splits), splits, auto_impl);
      const bool hopper = kernels::MlaDecodeSm90Applies(p.kv_dtype);
      if (hopper) {
        add("mma.sync",
            kernels::MlaDecodeNumSplits(batch, h_q, s_k, num_sms, kernels::MlaKvDtype::kBf16,
                                        kernels::MlaDecodeImpl::kMmaSync),
            kernels::MlaDecodeImpl::kMmaSync);
        add("sm90", chosen, kernels::MlaDecodeImpl::kSm90);
        add("seesaw", chosen, kernels::MlaDecodeImpl::kSm90Seesaw);
      }
      const bool transposed = kernels::MlaDecodeSm90TransposedApplies(h_q, p.kv_dtype);
      if (transposed) add("transposed", chosen, kernels::MlaDecodeImpl::kSm90Transposed);
      ASSIGN_OR_RETURN(const std::vector<double> ms, MedianMsInTurns(launches, 3, iters));
      nlohmann::json sweep = nlohmann::json::object();
      double chosen_ms = 0, best_ms = 1e30;
      int best_splits = chosen;
      const char* auto_name = auto_impl == kernels::MlaDecodeImpl::kMmaSync          ? "mma.sync"
                              : auto_impl == kernels::MlaDecodeImpl::kSm90Transposed ? "transposed"
                              : auto_impl == kernels::MlaDecodeImpl::kSm90Seesaw     ? "seesaw"
                                                                                     : "sm90";
      std::string sweep_text = fmt::format(" auto={}", auto_name);
      for (size_t k = 0; k < candidates.size(); ++k) {
        sweep[names[k]] = ms[k];
        sweep_text += fmt::format(" {}:{:.3f}", names[k], ms[k]);
        if (candidates[k] == chosen) chosen_ms = ms[k];
        if (ms[k] < best_ms) {
          best_ms = ms[k];
          best_splits = candidates[k];
        }
      }
      double mma_sync_ms = 0, sm90_ms = 0, seesaw_ms = 0, transposed_ms = 0;
      if (hopper) {
        const size_t at = candidates.size();
        mma_sync_ms = ms[at];
        sm90_ms = ms[at + 1];
        seesaw_ms = ms[at + 2];
        ratios[key("mla_decode_auto_vs_mma_sync", h_q, s_k)] = mma_sync_ms / chosen_ms;
        ratios[key("mla_decode_seesaw_vs_sm90", h_q, s_k)] = sm90_ms / seesaw_ms;
        sweep_text += fmt::format(" mma.sync:{:.3f} sm90:{:.3f} seesaw:{:.3f}", mma_sync_ms,
                                  sm90_ms, seesaw_ms);
      }
      if (transposed) {
        transposed_ms = ms.back();
        ratios[key("mla_decode_transposed_vs_sm90", h_q, s_k)] = sm90_ms / transposed_ms;
        sweep_text += fmt::format(" transposed:{:.3f}", transposed_ms);
      }
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      const double bytes =
          static_cast<double>(batch) * s_k * kernels::kMlaQkHeadDim * 2 +
          static_cast<double>(batch) * h_q * (kernels::kMlaQkHeadDim + kernels::kMlaValueDim) * 2;
      const double flops =
          2.0 * batch * h_q * s_k * (kernels::kMlaQkHeadDim + kernels::kMlaValueDim);
      const double tbps = bytes / (chosen_ms * 1e-3) / 1e12;
      const double tflops = flops / (chosen_ms * 1e-3) / 1e12;
      const double reference = batch == 128 ? FlashMlaFigure(h_q, s_k) : 0.0;
      const double ratio = reference > 0 ? (h_q == 128 ? tflops : tbps) / reference : 0.0;
      if (reference > 0) {
        min_ratio = std::min(min_ratio, ratio);
        ratios[fmt::format("mla_decode_h{}_s{}", h_q, s_k)] = ratio;
      }
      points.push_back({{"h_q", h_q},
                        {"s_k", s_k},
                        {"batch", batch},
                        {"splits", chosen},
                        {"auto_kernel", auto_name},
                        {"ms", chosen_ms},
                        {"tbps", tbps},
                        {"tflops", tflops},
                        {"flashmla", reference},
                        {"flashmla_unit", h_q == 128 ? "TFLOPS" : "TB/s"},
                        {"ratio", ratio},
                        {"best_splits", best_splits},
                        {"best_ms", best_ms},
                        {"mma_sync_ms", mma_sync_ms},
                        {"sm90_ms", sm90_ms},
                        {"seesaw_ms", seesaw_ms},
                        {"transposed_ms", transposed_ms},
                        {"sweep_ms", sweep}});
      std::cout << fmt::format(
          "{:>4} {:>6} {:>6} {:>9.3f} {:>7.2f} {:>8.1f} {:>9.2f} {:>7.3f} {}\n", h_q, s_k, chosen,
          chosen_ms, tbps, tflops, reference, ratio, sweep_text);
    }
  }
  if (min_ratio < 1e30) ratios["mla_decode_vs_flashmla_min"] = min_ratio;

  // The same points with the cache in fp8 pages (656 B per token instead of 1,152), at the
  // splits the bf16 run chose: speed against bf16, and the bytes it saves.
  {
    const size_t fp8_bytes = static_cast<size_t>(num_pages) * kernels::kMlaFp8PageBytes;
    DeviceBuffer kv8;
    RETURN_IF_ERROR(kv8.Allocate(fp8_bytes));
    RETURN_IF_ERROR(FillRandomBf16(kv8.ptr, fp8_bytes, 4));  // timing does not depend on values
    nlohmann::json fp8_points = nlohmann::json::array();
    std::cout << fmt::format("fp8 KV pages:\n{:>4} {:>6} {:>6} {:>9} {:>7} {:>12}\n", "h_q", "s_k",
                             "splits", "ms", "TB/s", "bf16 best / best");
    for (const auto& point : points) {
      const int h_q = point["h_q"].get<int>(), s_k = point["s_k"].get<int>();
      std::vector<int32_t> seqlens(batch, s_k);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(lens.ptr, seqlens.data(), batch * 4, cudaMemcpyHostToDevice));
      MlaDecodeParams p = params_for(h_q);
      p.kv_dtype = kernels::MlaKvDtype::kFp8E4M3;
      p.kv_cache_fp8 = static_cast<const uint8_t*>(kv8.ptr);
      // The bf16 run's splits, and a few more (16-head fp8 blocks run two to an SM).
      const int bf16_splits = point["splits"].get<int>();
      double ms = 1e30;
      int splits_used = bf16_splits;
      nlohmann::json sweep = nlohmann::json::object();
      for (int splits : {bf16_splits, 2, 3, 4}) {
        if (sweep.contains(std::to_string(splits))) continue;
        p.num_splits = splits;
        p.o_accum = nullptr;
        p.lse_accum = nullptr;
        kernels::MlaDecodeSetWorkspace(p, ws.ptr);
        ASSIGN_OR_RETURN(const double t,
                         MedianMs([&] { return kernels::LaunchMlaDecode(p, nullptr); }, 3, iters));
        sweep[std::to_string(splits)] = t;
        if (t < ms) ms = t, splits_used = splits;
      }
      p.num_splits = splits_used;
      const double bytes =
          static_cast<double>(batch) * s_k * (kernels::kMlaFp8PageBytes / kernels::kMlaPageSize) +
          static_cast<double>(batch) * h_q * (kernels::kMlaQkHeadDim + kernels::kMlaValueDim) * 2;
      // Best split count against best split count.
      const double speedup = point["best_ms"].get<double>() / ms;
      ratios[key("mla_decode_fp8_vs_bf16", h_q, s_k)] = speedup;
      fp8_points.push_back({{"h_q", h_q},
                            {"s_k", s_k},
                            {"splits", p.num_splits},
                            {"sweep_ms", sweep},
                            {"ms", ms},
                            {"tbps", bytes / (ms * 1e-3) / 1e12},
                            {"bf16_ms", point["ms"]}});
      std::cout << fmt::format("{:>4} {:>6} {:>6} {:>9.3f} {:>7.2f} {:>12.3f}\n", h_q, s_k,
                               p.num_splits, ms, bytes / (ms * 1e-3) / 1e12, speedup);
    }
    report["mla_decode_fp8"] = fp8_points;
  }
  report["mla_decode"] = points;
  report["ratios"].update(ratios);

  // Device-to-device copy bandwidth (read + write), the memory ceiling of this run (in the cache
  // buffer when it holds both halves).
  const size_t copy_bytes = size_t{2} << 30;
  DeviceBuffer copy_buffer;
  if (kv_bytes < 2 * copy_bytes) RETURN_IF_ERROR(copy_buffer.Allocate(2 * copy_bytes));
  char* base = static_cast<char*>(kv_bytes < 2 * copy_bytes ? copy_buffer.ptr : kv.ptr);
  ASSIGN_OR_RETURN(const double copy_ms,
                   MedianMs(
                       [&]() -> absl::Status {
                         CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + copy_bytes, base, copy_bytes,
                                                              cudaMemcpyDeviceToDevice, nullptr));
                         return absl::OkStatus();
                       },
                       3, 10));
  report["copy_tbps"] = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e12;
  std::cout << fmt::format("d2d copy: {:.2f} TB/s (read + write)\n",
                           report["copy_tbps"].get<double>());
  return absl::OkStatus();
}

constexpr double kBf16PeakTflops = 790.0;

struct PrefillCase {
  const char* name;
  int batch, heads, q_len, k_len;
  bool causal;
};

absl::Status BenchPrefill(int iters, nlohmann::json& report) {
  const std::vector<PrefillCase> cases = {
      {"v3_h128_4k_causal", 4, 128, 4096, 4096, true},
      {"v3_h128_4k_prefix_chunk4k", 4, 128, 4096, 4096, false},
      {"v3_h128_1k_causal", 16, 128, 1024, 1024, true},
      {"v2lite_h16_4k_causal", 4, 16, 4096, 4096, true},
      {"v3_h128_16k_causal", 1, 128, 16384, 16384, true},
  };
  size_t max_q_rows = 0, max_k_rows = 0;
  for (const PrefillCase& c : cases) {
    max_q_rows = std::max<size_t>(max_q_rows, static_cast<size_t>(c.batch) * c.q_len * c.heads);
    max_k_rows = std::max<size_t>(max_k_rows, static_cast<size_t>(c.batch) * c.k_len * c.heads);
  }
  DeviceBuffer q, k, v, out, lse, cu_q, cu_k;
  RETURN_IF_ERROR(q.Allocate(max_q_rows * kernels::kPrefillQkDim * 2));
  RETURN_IF_ERROR(FillRandomBf16(q.ptr, max_q_rows * kernels::kPrefillQkDim * 2, 11));
  RETURN_IF_ERROR(k.Allocate(max_k_rows * kernels::kPrefillQkDim * 2));
  RETURN_IF_ERROR(FillRandomBf16(k.ptr, max_k_rows * kernels::kPrefillQkDim * 2, 12));
  RETURN_IF_ERROR(v.Allocate(max_k_rows * kernels::kPrefillVDim * 2));
  RETURN_IF_ERROR(FillRandomBf16(v.ptr, max_k_rows * kernels::kPrefillVDim * 2, 13));
  RETURN_IF_ERROR(out.Allocate(max_q_rows * kernels::kPrefillVDim * 2));
  RETURN_IF_ERROR(lse.Allocate(max_q_rows * 4));
  RETURN_IF_ERROR(cu_q.Allocate(65 * 4));
  RETURN_IF_ERROR(cu_k.Allocate(65 * 4));
  nlohmann::json points = nlohmann::json::array();
  std::cout << fmt::format("{:<28} {:>5} {:>5} {:>6} {:>6} {:>9} {:>8} {:>6}\n", "prefill", "b",
                           "heads", "q", "k", "ms", "TFLOPS", "MFU  variants(ms)");
  for (const PrefillCase& c : cases) {
    std::vector<int32_t> cq(c.batch + 1), ck(c.batch + 1);
    for (int i = 0; i <= c.batch; ++i) {
      cq[i] = i * c.q_len;
      ck[i] = i * c.k_len;
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpy(cu_q.ptr, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(cu_k.ptr, ck.data(), ck.size() * 4, cudaMemcpyHostToDevice));
    kernels::PrefillAttentionParams p;
    p.batch = c.batch;
    p.num_heads = c.heads;
    p.max_seqlen_q = c.q_len;
    p.causal = c.causal;
    p.softmax_scale = 0.0721688f;
    p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.ptr);
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.ptr);
    p.total_k = ck.back();
    p.q = static_cast<const __nv_bfloat16*>(q.ptr);
    p.q_token_stride = static_cast<int64_t>(c.heads) * kernels::kPrefillQkDim;
    p.q_head_stride = kernels::kPrefillQkDim;
    p.k = static_cast<const __nv_bfloat16*>(k.ptr);
    p.k_token_stride = static_cast<int64_t>(c.heads) * kernels::kPrefillQkDim;
    p.k_head_stride = kernels::kPrefillQkDim;
    p.v = static_cast<const __nv_bfloat16*>(v.ptr);
    p.v_token_stride = static_cast<int64_t>(c.heads) * kernels::kPrefillVDim;
    p.v_head_stride = kernels::kPrefillVDim;
    p.out = static_cast<__nv_bfloat16*>(out.ptr);
    p.out_token_stride = static_cast<int64_t>(c.heads) * kernels::kPrefillVDim;
    p.out_head_stride = kernels::kPrefillVDim;
    p.lse = static_cast<float*>(lse.ptr);
    // Every kernel variant; the one LaunchPrefillAttention takes is the reported figure, the
    // sweep goes to JSON.
    const int default_variant = kernels::PrefillAttentionVariantFor(p);
    double ms = 0, best_ms = 1e30;
    int best_variant = 0;
    nlohmann::json sweep = nlohmann::json::object();
    std::string sweep_text;
    for (int variant = 0; variant < kernels::kPrefillAttentionVariants; ++variant) {
      ASSIGN_OR_RETURN(
          const double vms,
          MedianMs([&] { return kernels::LaunchPrefillAttentionVariant(p, variant, nullptr); }, 3,
                   iters));
      sweep[std::to_string(variant)] = vms;
      sweep_text += fmt::format(" v{}:{:.3f}", variant, vms);
      if (variant == default_variant) ms = vms;
      if (vms < best_ms) {
        best_ms = vms;
        best_variant = variant;
      }
    }
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    // Visible (query, key) pairs per (sequence, head); causal is bottom-right aligned.
    double pairs = 0;
    for (int i = 0; i < c.q_len; ++i) {
      pairs += c.causal ? std::clamp(i + c.k_len - c.q_len + 1, 0, c.k_len) : c.k_len;
    }
    const double flops =
        2.0 * (kernels::kPrefillQkDim + kernels::kPrefillVDim) * pairs * c.heads * c.batch;
    const double tflops = flops / (ms * 1e-3) / 1e12;
    const double mfu = tflops / kBf16PeakTflops;
    points.push_back({{"name", c.name},
                      {"batch", c.batch},
                      {"heads", c.heads},
                      {"q_len", c.q_len},
                      {"k_len", c.k_len},
                      {"causal", c.causal},
                      {"ms", ms},
                      {"tflops", tflops},
                      {"mfu", mfu},
                      {"variant", default_variant},
                      {"best_variant", best_variant},
                      {"best_ms", best_ms},
                      {"variant_ms", sweep}});
    report["ratios"][fmt::format("prefill_{}_mfu", c.name)] = mfu;
    std::cout << fmt::format("{:<28} {:>5} {:>5} {:>6} {:>6} {:>9.3f} {:>8.1f} {:>6.3f} {}\n",
                             c.name, c.batch, c.heads, c.q_len, c.k_len, ms, tflops, mfu,
                             sweep_text);
  }
  report["prefill_attention"] = points;
  return absl::OkStatus();
}

absl::Status BenchKvPages(int iters, nlohmann::json& report) {
  constexpr int kBlocks = 64, kLayers = 61, kPages = 2 * kBlocks;
  kernels::KvPagesParams p;
  p.num_blocks = kBlocks;
  p.num_layers = kLayers;
  p.layer_begin = 0;
  p.layer_end = kLayers;
  p.page_stride = static_cast<int64_t>(p.block_tokens) * (p.latent_dim + p.rope_dim);
  p.layer_stride = p.page_stride * kPages;
  const size_t pool_bytes = static_cast<size_t>(p.layer_stride) * kLayers * 2;
  p.codec = kernels::KvPayloadCodec::kBf16;
  const int64_t bf16_bytes = kernels::KvPayloadBytes(p);
  DeviceBuffer pool, pages, ptrs, dev_payload;
  RETURN_IF_ERROR(pool.Allocate(pool_bytes));
  RETURN_IF_ERROR(FillRandomBf16(pool.ptr, pool_bytes, 21));
  std::vector<int32_t> page_ids(kPages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(22));
  page_ids.resize(kBlocks);
  RETURN_IF_ERROR(pages.Allocate(kBlocks * 4));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(pages.ptr, page_ids.data(), kBlocks * 4, cudaMemcpyHostToDevice));
  const size_t total = static_cast<size_t>(bf16_bytes) * kBlocks;
  void* host = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, total, cudaHostAllocMapped));
  std::unique_ptr<void, void (*)(void*)> host_owner(host, [](void* h) { (void)cudaFreeHost(h); });
  std::memset(host, 0x3c, total);
  void* host_dev = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&host_dev, host, 0));
  RETURN_IF_ERROR(dev_payload.Allocate(total));
  RETURN_IF_ERROR(FillRandomBf16(dev_payload.ptr, total, 23));
  RETURN_IF_ERROR(ptrs.Allocate(kBlocks * sizeof(void*)));
  p.pool = static_cast<__nv_bfloat16*>(pool.ptr);
  p.pages = static_cast<const int32_t*>(pages.ptr);
  p.payloads = static_cast<uint8_t* const*>(ptrs.ptr);
  auto point_at = [&](void* base, int64_t block_bytes) -> absl::Status {
    std::vector<uint8_t*> v(kBlocks);
    for (int i = 0; i < kBlocks; ++i) v[i] = static_cast<uint8_t*>(base) + i * block_bytes;
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(ptrs.ptr, v.data(), v.size() * sizeof(void*), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  };
  nlohmann::json points = nlohmann::json::array();
  std::cout << fmt::format("{:<34} {:>10} {:>9} {:>8}\n", "kv pages (64 blocks x 61 layers)", "MB",
                           "ms", "GB/s");
  auto record = [&](const std::string& name, double bytes, double ms) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    points.push_back({{"name", name}, {"bytes", bytes}, {"ms", ms}, {"gbps", gbps}});
    report["ratios"][fmt::format("kv_{}_gbps", name)] = gbps;
    std::cout << fmt::format("{:<34} {:>10.1f} {:>9.3f} {:>8.1f}\n", name, bytes / 1e6, ms, gbps);
  };
  for (auto codec : {kernels::KvPayloadCodec::kBf16, kernels::KvPayloadCodec::kFp8E4M3}) {
    p.codec = codec;
    const int64_t block_bytes = kernels::KvPayloadBytes(p);
    const std::string tag = codec == kernels::KvPayloadCodec::kBf16 ? "bf16" : "fp8";
    for (bool pinned : {true, false}) {
      RETURN_IF_ERROR(point_at(pinned ? host_dev : dev_payload.ptr, block_bytes));
      if (!pinned && codec == kernels::KvPayloadCodec::kFp8E4M3) {
        // Valid codes for the load: quantize the pool once into the device payloads.
        RETURN_IF_ERROR(kernels::LaunchKvPagesToPayload(p, nullptr));
      }
      const std::string where = pinned ? "pinned_host" : "device";
      ASSIGN_OR_RETURN(
          const double save_ms,
          MedianMs([&] { return kernels::LaunchKvPagesToPayload(p, nullptr); }, 2, iters));
      ASSIGN_OR_RETURN(
          const double load_ms,
          MedianMs([&] { return kernels::LaunchKvPayloadToPages(p, nullptr); }, 2, iters));
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      record(fmt::format("save_{}_{}", tag, where), static_cast<double>(block_bytes) * kBlocks,
             save_ms);
      record(fmt::format("load_{}_{}", tag, where), static_cast<double>(block_bytes) * kBlocks,
             load_ms);
    }
  }
  // PCIe reference: one cudaMemcpyAsync of the same bf16 bytes between pinned host and device.
  ASSIGN_OR_RETURN(const double h2d_ms,
                   MedianMs(
                       [&]() -> absl::Status {
                         CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_payload.ptr, host, total,
                                                              cudaMemcpyHostToDevice, nullptr));
                         return absl::OkStatus();
                       },
                       2, iters));
  ASSIGN_OR_RETURN(const double d2h_ms,
                   MedianMs(
                       [&]() -> absl::Status {
                         CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, dev_payload.ptr, total,
                                                              cudaMemcpyDeviceToHost, nullptr));
                         return absl::OkStatus();
                       },
                       2, iters));
  record("memcpy_h2d_pinned", static_cast<double>(total), h2d_ms);
  record("memcpy_d2h_pinned", static_cast<double>(total), d2h_ms);
  report["kv_pages"] = points;
  return absl::OkStatus();
}

}  // namespace

void RegisterBenchKernelsCommand(CLI::App& app) {
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "kernels", "Time the CUDA kernels (MLA decode, prefill attention, KV pages)");
  auto json_path = std::make_shared<std::string>();
  auto iters = std::make_shared<int>(20);
  auto only = std::make_shared<std::string>("mla_decode,prefill,kv_pages");
  cmd->add_option("--json", *json_path, "Write the figures as JSON to this file");
  cmd->add_option("--iters", *iters, "Timed runs per point (median reported)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--only", *only,
                  "Comma-separated groups: mla_decode, prefill, kv_pages, sample and barrier (the "
                  "last two not run by default)");
  auto mla = std::make_shared<MlaPoints>();
  cmd->add_option(
         "--mla-heads", mla->heads_q,
         "MLA decode: the h_q points (16, 32, 64, 128; 32 has no FlashMLA figure: timed, no ratio)")
      ->delimiter(',')
      ->check(CLI::IsMember({16, 32, 64, 128}));
  cmd->add_option("--mla-batch", mla->batch,
                  "MLA decode: sequences per call (FlashMLA figures exist for 128 only)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--mla-seqs", mla->seqs, "MLA decode: the s_k points (tokens per sequence)")
      ->delimiter(',')
      ->check(CLI::Range(1, 131072));
  cmd->callback([json_path, iters, only, mla] {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) Fail(1, "bench kernels: no CUDA device");
    nlohmann::json report;
    report["device"] = prop.name;
    report["num_sms"] = prop.multiProcessorCount;
    report["iters"] = *iters;
    report["ratios"] = nlohmann::json::object();
    const std::vector<std::string_view> parts = StrSplit(*only, ',', /*skip_empty=*/true);
    const std::vector<std::string> groups(parts.begin(), parts.end());
    auto wanted = [&](const char* g) {
      return std::find(groups.begin(), groups.end(), g) != groups.end();
    };
    if (wanted("mla_decode")) {
      if (mla->seqs.empty()) Fail(2, "bench kernels: --mla-seqs needs at least one point");
      const absl::Status st = BenchMlaDecode(*iters, *mla, report);
      if (!st.ok()) Fail(1, StrCat("bench kernels: ", st.message()));
      if (report["ratios"].contains("mla_decode_vs_flashmla_min")) {
        std::cout << fmt::format("mla_decode_vs_flashmla_min = {:.3f}\n",
                                 report["ratios"]["mla_decode_vs_flashmla_min"].get<double>());
      }
    }
    if (wanted("prefill")) {
      const absl::Status st = BenchPrefill(*iters, report);
      if (!st.ok()) Fail(1, StrCat("bench kernels (prefill): ", st.message()));
    }
    if (wanted("kv_pages")) {
      const absl::Status st = BenchKvPages(*iters, report);
      if (!st.ok()) Fail(1, StrCat("bench kernels (kv_pages): ", st.message()));
    }
    if (wanted("sample")) {
      const absl::Status st = bench_kernels::BenchSampling(*iters, report);
      if (!st.ok()) Fail(1, StrCat("bench kernels (sample): ", st.message()));
    }
    if (wanted("barrier")) {
      const absl::Status st = bench_kernels::BenchGridBarrier(*iters, report);
      if (!st.ok()) Fail(1, StrCat("bench kernels (barrier): ", st.message()));
    }
    if (!json_path->empty()) {
      std::ofstream f(*json_path);
      f << report.dump(2) << "\n";
      if (!f) Fail(1, StrCat("bench kernels: cannot write ", *json_path));
    }
  });
}

}  // namespace strata::cli
