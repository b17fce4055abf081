// CudaEngine (bf16 on the GPU) against CpuEngine (fp32, bf16 KV pages) on the tiny, small-v3 and
// small-v2 presets: prefill logits at every position, decode steps (absorbed form through MLA
// decode), a mixed prefill + decode batch, a multi-token absorbed chunk, and cached-prefix imports
// (CUDA → CUDA and CPU → CUDA pages as bf16 block payloads), batched decode replayed from a CUDA
// graph (bit-identical to eager steps) and the two MoE paths. Label gpu: skipped without a GPU.
//
// Pass, for models without a discrete routing choice ("<preset>/dense", "<preset>/all-experts"):
// ‖Δ‖/‖cpu‖ of every logits row < 3e-2 (bf16 activations vs fp32; ~1e-2 measured) and argmax equal
// on >= 95% of rows. The routed presets (top-k of 8–16 experts) only need argmax equal on >= 80%
// of rows: bf16 rounding flips some tokens' top-k choice against the fp32 reference, and such a row
// can differ by 0.1–0.8 (docs/numerics.md; transformers' own bf16 run agrees with its fp32 run on
// 88% of argmaxes on v2-lite-shape). Worst rows are printed either way.
#include "compute_nodes/backend/cuda/cuda_engine.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <random>

#include "common/status.h"
#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/backend/cuda/step_util.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"
#include "kernels/moe_experts/moe_grouped.h"
#include "tests/compute_nodes/kv_pool_checks.h"
#include "tests/compute_nodes/test_util.h"

namespace strata {
namespace {

using runtime::AttentionForm;
using runtime::PageTable;
using runtime::SequenceInput;
using runtime::SequenceOutput;

constexpr double kRelTol = 3e-2;
constexpr double kArgmaxAgree = 0.95;
constexpr double kRoutedArgmaxAgree = 0.80;

// Whether the model has a discrete top-k routing choice (a MoE preset not forced to all experts).
bool Routed(const std::string& name) { return name.find('/') == std::string::npos; }

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<int32_t> Ids(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 7919 + salt * 104729 + 17) % 129280;
  return ids;
}

int Argmax(const float* v, int64_t n) { return static_cast<int>(std::max_element(v, v + n) - v); }

// Compares [rows][vocab] logits row by row; returns the worst relative error.
struct Compare {
  double worst = 0;
  int64_t rows = 0, agree = 0;
  void Add(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t vocab) {
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t r = 0; r * vocab < cpu.size(); ++r) {
      const float* g = gpu.data() + r * vocab;
      const float* c = cpu.data() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i) ASSERT_TRUE(std::isfinite(g[i])) << "row " << r;
      worst = std::max(worst, testutil::RelError(g, c, vocab));
      ++rows;
      agree += Argmax(g, vocab) == Argmax(c, vocab) ? 1 : 0;
    }
  }
  void Check(const std::string& what, bool routed = false) const {
    std::printf("%-40s rows %4ld  worst rel %.3e  argmax agree %.1f%%\n", what.c_str(),
                static_cast<long>(rows), worst, 100.0 * agree / std::max<int64_t>(rows, 1));
    if (!routed) {
      EXPECT_LT(worst, kRelTol) << what;
    }
    EXPECT_GE(agree, (routed ? kRoutedArgmaxAgree : kArgmaxAgree) * rows) << what;
  }
};

struct Engines {
  std::unique_ptr<cpu::CpuEngine> cpu;
  std::unique_ptr<cuda::CudaEngine> gpu;
  std::string dir;
};

// "<preset>", "<preset>/dense" (no MoE layers), "<preset>/all-experts" (every token routed to
// every expert: no discrete routing choice that bf16 rounding could flip) or "<preset>/full-heads"
// (all-experts with qk_nope and v head dims of 128).
model::ModelConfig Config(const std::string& name) {
  const size_t slash = name.find('/');
  model::ModelConfig c = *model::PresetConfig(name.substr(0, slash));
  const std::string variant = slash == std::string::npos ? "" : name.substr(slash + 1);
  if (variant == "dense") {
    c.n_routed_experts = 0;
    c.n_shared_experts = 0;
    c.num_experts_per_tok = 0;
  } else if (variant == "full-heads") {
    // The real models' head dims (the prefill kernel reads Q and writes its output in place),
    // every token on every expert as in all-experts.
    c.qk_nope_head_dim = 128;
    c.v_head_dim = 128;
    c.num_experts_per_tok = c.n_routed_experts;
    c.n_group = 1;
    c.topk_group = 1;
  } else if (variant == "all-experts") {
    c.num_experts_per_tok = c.n_routed_experts;
    c.n_group = 1;
    c.topk_group = 1;
  }
  return c;
}

Engines Open(const std::string& preset, cuda::CudaEngineOptions options = {}) {
  Engines e;
  std::string tag = preset;
  std::replace(tag.begin(), tag.end(), '/', '_');
  e.dir = testing::TempDir() + "/cuda_engine_test_" + tag;
  model::MakeRandomOptions o;
  o.seed = 5;
  const auto st = model::MakeRandomCheckpoint(Config(preset), o, e.dir);
  EXPECT_TRUE(st.ok()) << st;
  auto w = model::LoadModel(e.dir);
  EXPECT_TRUE(w.ok()) << w.status();
  e.cpu =
      std::make_unique<cpu::CpuEngine>(std::shared_ptr<const model::ModelWeights>(std::move(*w)),
                                       64, 64, runtime::KvPrecision::kBf16);
  options.num_pages = 64;
  auto g = cuda::CudaEngine::FromCheckpoint(e.dir, options);
  EXPECT_TRUE(g.ok()) << g.status();
  if (g.ok()) e.gpu = std::move(*g);
  return e;
}

absl::StatusOr<std::vector<SequenceOutput>> Fwd(runtime::Engine& e,
                                                std::vector<SequenceInput> batch) {
  std::vector<SequenceOutput> out;
  RETURN_IF_ERROR(e.Forward(batch, &out));
  return out;
}

class CudaEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

// Prefill (MHA) of a 70-token prompt in chunks of 48 (the second chunk has a cached prefix in
// pages), every position's logits; then 6 decode steps (absorbed) fed the CPU's greedy tokens.
TEST_P(CudaEngineTest, PrefillThenDecodeMatchesCpu) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  const int64_t vocab = e.cpu->config().vocab_size;
  const std::vector<int32_t> ids = Ids(70, 1);
  PageTable pc, pg;
  ASSERT_TRUE(runtime::EnsureCapacity(e.cpu->kv_pool(), pc, 80).ok());
  ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), pg, 80).ok());
  Compare prefill, decode;
  std::vector<int32_t> seq = ids;
  for (int64_t pos = 0; pos < 70; pos += 48) {
    const int64_t n = std::min<int64_t>(48, 70 - pos);
    std::span<const int32_t> chunk(ids.data() + pos, n);
    auto c = Fwd(*e.cpu, {SequenceInput{chunk, pos, &pc, true, AttentionForm::kMha}});
    auto g = Fwd(*e.gpu, {SequenceInput{chunk, pos, &pg, true, AttentionForm::kMha}});
    ASSERT_TRUE(c.ok() && g.ok()) << c.status() << g.status();
    prefill.Add((*g)[0].logits, (*c)[0].logits, vocab);
    if (pos + n == 70) seq.push_back(Argmax((*c)[0].logits.data() + (n - 1) * vocab, vocab));
  }
  for (int step = 0; step < 6; ++step) {
    const int64_t pos = static_cast<int64_t>(seq.size()) - 1;
    std::span<const int32_t> tok(&seq.back(), 1);
    auto c = Fwd(*e.cpu, {SequenceInput{tok, pos, &pc, false, AttentionForm::kAbsorbed}});
    auto g = Fwd(*e.gpu, {SequenceInput{tok, pos, &pg, false, AttentionForm::kAbsorbed}});
    ASSERT_TRUE(c.ok() && g.ok()) << c.status() << g.status();
    decode.Add((*g)[0].logits, (*c)[0].logits, vocab);
    seq.push_back(Argmax((*c)[0].logits.data(), vocab));
  }
  prefill.Check(GetParam() + " prefill (2 chunks)", Routed(GetParam()));
  decode.Check(GetParam() + " decode (6 steps)", Routed(GetParam()));
  // Step stats: weights and KV were counted.
  EXPECT_GT(e.gpu->last_step().weight_bytes, 0);
  EXPECT_EQ(e.gpu->last_step().kv_bytes,
            e.cpu->config().num_hidden_layers * static_cast<int64_t>(seq.size() - 1) * 576 * 2);
}

// The MoE paths for prefill-sized token counts, forced for every step (moe_device_max_tokens 0):
// the grouped wgmma GEMMs (sm_90) and the host path (one cuBLAS GEMM pair per expert), each
// against the CPU on a 150-token prefill (every position's logits) and 3 decode steps.
TEST_P(CudaEngineTest, PrefillMoePathsMatchCpu) {
  for (const bool grouped : {true, false}) {
    if (grouped && !kernels::MoeGroupedApplies()) continue;
    cuda::CudaEngineOptions options;
    options.moe_device_max_tokens = 0;
    options.moe_grouped = grouped;
    Engines e = Open(GetParam(), options);
    ASSERT_NE(e.gpu, nullptr);
    const int64_t vocab = e.cpu->config().vocab_size;
    std::vector<int32_t> seq = Ids(150, 4);
    PageTable pc, pg;
    ASSERT_TRUE(runtime::EnsureCapacity(e.cpu->kv_pool(), pc, 160).ok());
    ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), pg, 160).ok());
    Compare prefill, decode;
    for (int step = 0; step <= 3; ++step) {
      const int64_t pos = step == 0 ? 0 : static_cast<int64_t>(seq.size()) - 1;
      std::span<const int32_t> toks(seq.data() + pos, seq.size() - pos);
      const AttentionForm form = step == 0 ? AttentionForm::kMha : AttentionForm::kAbsorbed;
      auto c = Fwd(*e.cpu, {SequenceInput{toks, pos, &pc, step == 0, form}});
      auto g = Fwd(*e.gpu, {SequenceInput{toks, pos, &pg, step == 0, form}});
      ASSERT_TRUE(c.ok() && g.ok()) << c.status() << g.status();
      (step == 0 ? prefill : decode).Add((*g)[0].logits, (*c)[0].logits, vocab);
      const std::vector<float>& last = (*c)[0].logits;
      seq.push_back(Argmax(last.data() + last.size() - vocab, vocab));
    }
    const std::string what = GetParam() + (grouped ? " grouped MoE" : " host MoE");
    prefill.Check(what + " prefill", Routed(GetParam()));
    decode.Check(what + " decode", Routed(GetParam()));
    EXPECT_GT(e.gpu->last_step().weight_bytes, 0);
  }
}

// One batch holding a prefill chunk (MHA) and two decode rows of other sequences, plus a 5-token
// absorbed chunk: the gathers/scatters between the two attention forms.
TEST_P(CudaEngineTest, MixedBatchMatchesCpu) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  const int64_t vocab = e.cpu->config().vocab_size;
  const std::vector<int32_t> a = Ids(20, 2), b = Ids(67, 3), c = Ids(30, 4);
  PageTable pa[2], pb[2], pc[2];
  runtime::Engine* engines[2] = {e.cpu.get(), e.gpu.get()};
  std::vector<SequenceOutput> out[2];
  for (int k = 0; k < 2; ++k) {
    runtime::Engine& en = *engines[k];
    ASSERT_TRUE(runtime::EnsureCapacity(en.kv_pool(), pa[k], 40).ok());
    ASSERT_TRUE(runtime::EnsureCapacity(en.kv_pool(), pb[k], 80).ok());
    ASSERT_TRUE(runtime::EnsureCapacity(en.kv_pool(), pc[k], 40).ok());
    // Contexts of b and c first (b: 66 tokens, c: 25).
    ASSERT_TRUE(Fwd(en, {SequenceInput{std::span<const int32_t>(b).first(66), 0, &pb[k], false,
                                       AttentionForm::kMha},
                         SequenceInput{std::span<const int32_t>(c).first(25), 0, &pc[k], false,
                                       AttentionForm::kMha}})
                    .ok());
    auto r = Fwd(en, {SequenceInput{std::span<const int32_t>(b).subspan(66, 1), 66, &pb[k], false,
                                    AttentionForm::kAuto},
                      SequenceInput{a, 0, &pa[k], true, AttentionForm::kMha},
                      SequenceInput{std::span<const int32_t>(c).subspan(25, 5), 25, &pc[k], true,
                                    AttentionForm::kAbsorbed}});
    ASSERT_TRUE(r.ok()) << r.status();
    out[k] = *r;
  }
  Compare cmp;
  for (int s = 0; s < 3; ++s) cmp.Add(out[1][s].logits, out[0][s].logits, vocab);
  cmp.Check(GetParam() + " mixed batch", Routed(GetParam()));
}

// A cached prefix restored from block payloads: 64 tokens computed on the GPU (or on the CPU),
// exported as a bf16 payload, imported into a fresh page of the GPU engine; the suffix computed
// on top must give the logits of the uninterrupted GPU run.
// The device pool's batched moves (batches of 8 through two staging sets: 19 pages = 8 + 8 + 3)
// against its per-page ones, fp32 payloads and refused bad input included.
TEST_P(CudaEngineTest, BatchedPageMovesEqualPerPageMoves) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  testutil::CheckBatchedPageMoves(e.gpu->kv_pool(), 19, 11);
  testutil::CheckBatchedPageMoves(e.gpu->kv_pool(), 3, 12);
  // Pinned payloads, read and written by the kernels in place (and mixed with staged ones).
  testutil::CheckHostBufferPageMoves(e.gpu->kv_pool(), 19, 13);
  testutil::CheckHostBufferPageMoves(e.gpu->kv_pool(), 1, 14);
}

TEST_P(CudaEngineTest, CachedPrefixImport) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  const int64_t vocab = e.cpu->config().vocab_size;
  // The suffix has more rows than cuda::kSkinnyMaxRows, so its projections run on the same GEMM
  // kernels as the uninterrupted run's (few-row steps use other kernels, other roundings).
  constexpr int64_t kSuffix = 20;
  static_assert(kSuffix > cuda::kSkinnyMaxRows);
  const std::vector<int32_t> ids = Ids(64 + kSuffix, 5);
  std::span<const int32_t> prefix(ids.data(), 64), suffix(ids.data() + 64, kSuffix);
  // Uninterrupted GPU run.
  PageTable full;
  ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), full, 64 + kSuffix).ok());
  auto ref = Fwd(*e.gpu, {SequenceInput{ids, 0, &full, true, AttentionForm::kMha}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<float> ref_suffix(ref->at(0).logits.end() - kSuffix * vocab, ref->at(0).logits.end());
  for (int source = 0; source < 2; ++source) {
    runtime::Engine& from = source == 0 ? static_cast<runtime::Engine&>(*e.gpu) : *e.cpu;
    PageTable pre;
    ASSERT_TRUE(runtime::EnsureCapacity(from.kv_pool(), pre, 64).ok());
    ASSERT_TRUE(Fwd(from, {SequenceInput{prefix, 0, &pre, false, AttentionForm::kMha}}).ok());
    std::vector<uint8_t> block;
    ASSERT_TRUE(from.kv_pool().ExportPage(pre.pages[0], runtime::PayloadDtype::kBf16, &block).ok());
    if (source == 0) {
      // GPU export of the uninterrupted run's first page is the same bytes (deterministic).
      std::vector<uint8_t> again;
      ASSERT_TRUE(
          e.gpu->kv_pool().ExportPage(full.pages[0], runtime::PayloadDtype::kBf16, &again).ok());
      EXPECT_EQ(block, again);
    }
    PageTable warm;
    ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), warm, 64 + kSuffix).ok());
    ASSERT_TRUE(
        e.gpu->kv_pool().ImportPage(warm.pages[0], runtime::PayloadDtype::kBf16, block).ok());
    std::vector<uint8_t> back;
    ASSERT_TRUE(
        e.gpu->kv_pool().ExportPage(warm.pages[0], runtime::PayloadDtype::kBf16, &back).ok());
    EXPECT_EQ(back, block) << "bf16 import/export must be lossless";
    auto got = Fwd(*e.gpu, {SequenceInput{suffix, 64, &warm, true, AttentionForm::kMha}});
    ASSERT_TRUE(got.ok()) << got.status();
    Compare cmp;
    cmp.Add(got->at(0).logits, ref_suffix, vocab);
    cmp.Check(GetParam() + (source == 0 ? " prefix from gpu" : " prefix from cpu"),
              Routed(GetParam()));
    if (source == 0) {
      EXPECT_LT(cmp.worst, 1e-6) << "same pages, same kernels: identical";
    }
    runtime::ReleasePages(e.gpu->kv_pool(), warm);
    runtime::ReleasePages(from.kv_pool(), pre);
  }
  // fp32 payloads round-trip through bf16 pages; bad ids and sizes are statuses.
  std::vector<uint8_t> f32;
  ASSERT_TRUE(e.gpu->kv_pool().ExportPage(full.pages[0], runtime::PayloadDtype::kF32, &f32).ok());
  EXPECT_EQ(f32.size(), e.gpu->kv_pool().PayloadBytes(runtime::PayloadDtype::kF32));
  EXPECT_FALSE(e.gpu->kv_pool().ImportPage(-1, runtime::PayloadDtype::kF32, f32).ok());
  EXPECT_FALSE(e.gpu->kv_pool()
                   .ImportPage(full.pages[0], runtime::PayloadDtype::kBf16,
                               std::span<const uint8_t>(f32).first(10))
                   .ok());
}

// Resident blocks (compute_nodes/worker/resident_blocks.h) share a full page between sequences:
// a second sequence whose table starts with the first one's page, prefilled from there and then
// decoded in one batch with the first, gives bit for bit what it gives reading a private copy of
// that page, and the shared page is never written.
TEST_P(CudaEngineTest, SequencesSharingAPageMatchAPrivateCopy) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  runtime::KvPool& pool = e.gpu->kv_pool();
  const int64_t vocab = e.cpu->config().vocab_size;
  const std::vector<int32_t> a_ids = Ids(64 + 20, 11), tail = Ids(30, 12);
  PageTable a, shared, copy;
  ASSERT_TRUE(runtime::EnsureCapacity(pool, a, 64 + 20 + 4).ok());
  ASSERT_TRUE(Fwd(*e.gpu, {SequenceInput{a_ids, 0, &a, false, AttentionForm::kMha}}).ok());
  std::vector<uint8_t> block;
  ASSERT_TRUE(pool.ExportPage(a.pages[0], runtime::PayloadDtype::kBf16, &block).ok());
  shared.pages.push_back(a.pages[0]);
  ASSERT_TRUE(runtime::EnsureCapacity(pool, shared, 64 + 30 + 4).ok());
  ASSERT_TRUE(runtime::EnsureCapacity(pool, copy, 64 + 30 + 4).ok());
  ASSERT_TRUE(pool.ImportPage(copy.pages[0], runtime::PayloadDtype::kBf16, block).ok());
  auto ps = Fwd(*e.gpu, {SequenceInput{tail, 64, &shared, false, AttentionForm::kMha}});
  auto pc = Fwd(*e.gpu, {SequenceInput{tail, 64, &copy, false, AttentionForm::kMha}});
  ASSERT_TRUE(ps.ok() && pc.ok());
  EXPECT_EQ(ps->at(0).logits, pc->at(0).logits);
  // Decode steps of {a, shared} and of {a, copy}: the same batch shape and kernels, so the
  // same bits (a's new rows are written twice with equal values).
  int32_t ta = Argmax(ps->at(0).logits.data(), vocab), tb = ta;
  for (int step = 0; step < 3; ++step) {
    auto with_shared =
        Fwd(*e.gpu, {SequenceInput{{&ta, 1}, 84 + step, &a, false, AttentionForm::kAbsorbed},
                     SequenceInput{{&tb, 1}, 94 + step, &shared, false, AttentionForm::kAbsorbed}});
    auto with_copy =
        Fwd(*e.gpu, {SequenceInput{{&ta, 1}, 84 + step, &a, false, AttentionForm::kAbsorbed},
                     SequenceInput{{&tb, 1}, 94 + step, &copy, false, AttentionForm::kAbsorbed}});
    ASSERT_TRUE(with_shared.ok()) << with_shared.status();
    ASSERT_TRUE(with_copy.ok()) << with_copy.status();
    EXPECT_EQ(with_shared->at(0).logits, with_copy->at(0).logits) << "step " << step;
    EXPECT_EQ(with_shared->at(1).logits, with_copy->at(1).logits) << "step " << step;
    ta = Argmax(with_shared->at(0).logits.data(), vocab);
    tb = Argmax(with_shared->at(1).logits.data(), vocab);
  }
  std::vector<uint8_t> after;
  ASSERT_TRUE(pool.ExportPage(a.pages[0], runtime::PayloadDtype::kBf16, &after).ok());
  EXPECT_EQ(after, block) << "the shared page was written";
  shared.pages.erase(shared.pages.begin());  // a's page is freed once, with a
  runtime::ReleasePages(pool, shared);
  runtime::ReleasePages(pool, copy);
  runtime::ReleasePages(pool, a);
}

// Batched decode steps of three sequences (contexts 70, 33, 5) replayed from one CUDA graph give
// the same logits, bit for bit, as the same steps run eagerly (graphs off); and the MoE path for
// larger token counts (routing on the host, one cuBLAS GEMM per expert) agrees with the device
// path on the same prefill.
TEST_P(CudaEngineTest, DecodeGraphAndMoePathsMatchEager) {
  cuda::CudaEngineOptions eager_options;
  eager_options.cuda_graphs = false;
  eager_options.moe_device_max_tokens = 0;  // prefill and decode alike through the host path
  Engines graphed = Open(GetParam());
  Engines eager = Open(GetParam(), eager_options);
  ASSERT_NE(graphed.gpu, nullptr);
  ASSERT_NE(eager.gpu, nullptr);
  const int64_t vocab = graphed.cpu->config().vocab_size;
  const int64_t ctx[3] = {70, 33, 5};
  cuda::CudaEngine* engines[2] = {graphed.gpu.get(), eager.gpu.get()};
  PageTable pages[2][3];
  std::vector<int32_t> ids[3];
  for (int k = 0; k < 2; ++k) {
    std::vector<SequenceInput> batch;
    for (int i = 0; i < 3; ++i) {
      ids[i] = Ids(static_cast<int>(ctx[i]) + 8, 10 + i);
      ASSERT_TRUE(runtime::EnsureCapacity(engines[k]->kv_pool(), pages[k][i], ctx[i] + 8).ok());
      batch.push_back({std::span<const int32_t>(ids[i]).first(ctx[i]), 0, &pages[k][i], false,
                       AttentionForm::kMha});
    }
    ASSERT_TRUE(Fwd(*engines[k], batch).ok());
  }
  std::vector<std::vector<float>> logits[2];
  for (int k = 0; k < 2; ++k) {
    for (int step = 0; step < 5; ++step) {
      std::vector<SequenceInput> batch;
      for (int i = 0; i < 3; ++i) {
        batch.push_back({std::span<const int32_t>(ids[i]).subspan(ctx[i] + step, 1), ctx[i] + step,
                         &pages[k][i], false, AttentionForm::kAbsorbed});
      }
      auto out = Fwd(*engines[k], batch);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(engines[k]->last_step().graphed, k == 0);
      EXPECT_GT(engines[k]->last_step().weight_bytes, 0);
      for (auto& o : *out) logits[k].push_back(o.logits);
    }
  }
  EXPECT_EQ(graphed.gpu->graph_captures(), 1);
  EXPECT_EQ(graphed.gpu->graph_replays(), 4);
  // The eager engine ran the MoE on the host path: same choices up to rounding, so compare as
  // the CPU comparison does; the graphed engine's own eager step (first capture) is checked by
  // the replays matching it below.
  Compare paths;
  for (size_t r = 0; r < logits[0].size(); ++r) paths.Add(logits[0][r], logits[1][r], vocab);
  paths.Check(GetParam() + " graph+device MoE vs eager+host MoE", Routed(GetParam()));
  // Same engine, same inputs, graphs off: bit-identical to the graph replays.
  cuda::CudaEngineOptions no_graphs;
  no_graphs.cuda_graphs = false;
  Engines plain = Open(GetParam(), no_graphs);
  ASSERT_NE(plain.gpu, nullptr);
  PageTable p3[3];
  std::vector<SequenceInput> batch;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(runtime::EnsureCapacity(plain.gpu->kv_pool(), p3[i], ctx[i] + 8).ok());
    batch.push_back(
        {std::span<const int32_t>(ids[i]).first(ctx[i]), 0, &p3[i], false, AttentionForm::kMha});
  }
  ASSERT_TRUE(Fwd(*plain.gpu, batch).ok());
  size_t row = 0;
  for (int step = 0; step < 5; ++step) {
    batch.clear();
    for (int i = 0; i < 3; ++i) {
      batch.push_back({std::span<const int32_t>(ids[i]).subspan(ctx[i] + step, 1), ctx[i] + step,
                       &p3[i], false, AttentionForm::kAbsorbed});
    }
    auto out = Fwd(*plain.gpu, batch);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_FALSE(plain.gpu->last_step().graphed);
    for (auto& o : *out) EXPECT_EQ(o.logits, logits[0][row++]) << "step " << step;
  }
}

// One-row steps with norms formed inside the projections after them (fold_norms, the default:
// the q|kv_a projection, the router logits, the shared experts then reading the router logits'
// xn) give bit-identically the logits of the same steps with norm kernels, graphed or not;
// a two-row step in between (never folded) reads the residual stream the folded steps left.
// So do the steps with the side stream at the main stream's priority (low_priority_side_rows 0).
TEST_P(CudaEngineTest, FoldedNormsAreBitIdentical) {
  struct Variant {
    bool fold, graphs;
    int64_t low_priority_side_rows;
  };
  std::vector<std::vector<float>> first;  // folded, graphed
  for (const Variant v : {Variant{true, true, 1}, Variant{true, false, 1}, Variant{false, true, 1},
                          Variant{false, false, 1}, Variant{true, true, 0}}) {
    cuda::CudaEngineOptions options;
    options.fold_norms = v.fold;
    options.cuda_graphs = v.graphs;
    options.low_priority_side_rows = v.low_priority_side_rows;
    Engines e = Open(GetParam(), options);
    ASSERT_NE(e.gpu, nullptr);
    const std::vector<int32_t> a = Ids(48, 3), b = Ids(40, 4);
    PageTable pa, pb;
    ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), pa, 48).ok());
    ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), pb, 48).ok());
    ASSERT_TRUE(
        Fwd(*e.gpu, {{std::span<const int32_t>(a).first(40), 0, &pa, false, AttentionForm::kMha},
                     {std::span<const int32_t>(b).first(32), 0, &pb, false, AttentionForm::kMha}})
            .ok());
    std::vector<std::vector<float>> got;
    for (int step = 0; step < 6; ++step) {
      std::vector<SequenceInput> batch = {{std::span<const int32_t>(a).subspan(40 + step, 1),
                                           40 + step, &pa, false, AttentionForm::kAbsorbed}};
      if (step == 3) {
        batch.push_back(
            {std::span<const int32_t>(b).subspan(32, 1), 32, &pb, false, AttentionForm::kAbsorbed});
      }
      auto out = Fwd(*e.gpu, batch);
      ASSERT_TRUE(out.ok()) << out.status();
      for (auto& o : *out) got.push_back(o.logits);
    }
    if (first.empty()) {
      first = std::move(got);
      continue;
    }
    ASSERT_EQ(got.size(), first.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r], first[r]) << "fold " << v.fold << ", graphs " << v.graphs
                                  << ", low-priority side rows " << v.low_priority_side_rows
                                  << ", row " << r;
    }
  }
}

// The side stream runs at the main stream's priority until BelowMain(true) drops it to the
// device's lowest, and BelowMain(false) brings it back.
TEST(SideStreamTest, BelowMainSetsThePriority) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  int lowest = 0, highest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&lowest, &highest), cudaSuccess);
  ASSERT_LT(highest, lowest) << "the device has one stream priority";
  cudaStream_t main = nullptr;
  ASSERT_EQ(cudaStreamCreateWithPriority(&main, cudaStreamNonBlocking, highest), cudaSuccess);
  {
    auto side = cuda::SideStream::Create(main, highest);
    ASSERT_TRUE(side.ok()) << side.status();
    const auto priority = [&] {
      int p = 0;
      EXPECT_EQ(cudaStreamGetPriority((*side)->stream(), &p), cudaSuccess);
      return p;
    };
    EXPECT_EQ(priority(), highest);
    ASSERT_TRUE((*side)->BelowMain(true).ok());
    EXPECT_EQ(priority(), lowest);
    ASSERT_TRUE((*side)->BelowMain(false).ok());
    EXPECT_EQ(priority(), highest);
  }
  ASSERT_EQ(cudaStreamDestroy(main), cudaSuccess);
}

// Draws: when every sequence brings one its token is picked on the GPU and no logits come back;
// it is what the draw picks (runtime::PickToken) from the logits the same step returns without
// draws (the same decode step run twice at one position writes the same KV, so both runs see the
// same logits). Greedy draws go through the greedy kernel, sampled ones (temperature, top-k,
// top-p) through the sampling kernel. With only some sequences bringing one, those get their
// token picked on the GPU too and the others their logits.
TEST_P(CudaEngineTest, DrawnTokensAreWhatTheDrawPicksFromTheLogits) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  const int64_t vocab = e.cpu->config().vocab_size;
  const int64_t ctx[3] = {40, 9, 65};
  PageTable pages[3];
  std::vector<int32_t> ids[3];
  std::vector<SequenceInput> prefill;
  for (int i = 0; i < 3; ++i) {
    ids[i] = Ids(static_cast<int>(ctx[i]) + 4, 30 + i);
    ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), pages[i], ctx[i] + 4).ok());
    prefill.push_back(
        {std::span<const int32_t>(ids[i]).first(ctx[i]), 0, &pages[i], false, AttentionForm::kMha});
  }
  ASSERT_TRUE(Fwd(*e.gpu, prefill).ok());
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int step = 0; step < 3; ++step) {
    using Draws = std::vector<std::optional<runtime::TokenDraw>>;
    auto batch_of = [&](const Draws& draws) {
      std::vector<SequenceInput> batch;
      for (int i = 0; i < 3; ++i) {
        batch.push_back({std::span<const int32_t>(ids[i]).subspan(ctx[i] + step, 1), ctx[i] + step,
                         &pages[i], false, AttentionForm::kAbsorbed});
        batch.back().draw = draws[i];
      }
      return batch;
    };
    const runtime::TokenDraw greedy{};
    const Draws sampled = {
        runtime::TokenDraw{.temperature = 0.8f, .uniform = unit(rng)},
        runtime::TokenDraw{.temperature = 1.3f, .top_k = 50, .top_p = 0.9f, .uniform = unit(rng)},
        greedy};
    auto with_logits = Fwd(*e.gpu, batch_of({std::nullopt, std::nullopt, std::nullopt}));
    ASSERT_TRUE(with_logits.ok()) << with_logits.status();
    auto all_greedy = Fwd(*e.gpu, batch_of({greedy, greedy, greedy}));
    ASSERT_TRUE(all_greedy.ok()) << all_greedy.status();
    auto all_sampled = Fwd(*e.gpu, batch_of(sampled));
    ASSERT_TRUE(all_sampled.ok()) << all_sampled.status();
    auto mixed = Fwd(*e.gpu, batch_of({greedy, std::nullopt, sampled[0]}));
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    for (int i = 0; i < 3; ++i) {
      const std::vector<float>& l = (*with_logits)[i].logits;
      ASSERT_EQ(l.size(), static_cast<size_t>(vocab));
      const int32_t argmax = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      EXPECT_EQ((*with_logits)[i].token, -1);
      EXPECT_TRUE((*all_greedy)[i].logits.empty());
      EXPECT_EQ((*all_greedy)[i].token, argmax) << "step " << step << " seq " << i;
      EXPECT_TRUE((*all_sampled)[i].logits.empty());
      EXPECT_EQ((*all_sampled)[i].token, runtime::PickToken(*sampled[i], l))
          << "step " << step << " seq " << i;
      if (i == 1) {
        EXPECT_EQ((*mixed)[i].logits, l) << "step " << step;
      } else {
        EXPECT_TRUE((*mixed)[i].logits.empty()) << "step " << step << " seq " << i;
      }
      const int32_t want_mixed = i == 0 ? argmax : i == 1 ? -1 : runtime::PickToken(*sampled[0], l);
      EXPECT_EQ((*mixed)[i].token, want_mixed) << "step " << step << " seq " << i;
    }
  }
}

TEST_P(CudaEngineTest, BadInputIsAStatus) {
  Engines e = Open(GetParam());
  ASSERT_NE(e.gpu, nullptr);
  PageTable p;
  ASSERT_TRUE(runtime::EnsureCapacity(e.gpu->kv_pool(), p, 10).ok());
  const std::vector<int32_t> bad = {5, 129280};
  EXPECT_FALSE(Fwd(*e.gpu, {SequenceInput{bad, 0, &p, false, AttentionForm::kAuto}}).ok());
  const std::vector<int32_t> ok = Ids(80, 6);
  EXPECT_FALSE(Fwd(*e.gpu, {SequenceInput{ok, 0, &p, false, AttentionForm::kAuto}}).ok());
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaEngineTest,
                         ::testing::Values("tiny", "small-v3", "small-v2", "tiny/dense",
                                           "small-v2/dense", "small-v3/all-experts",
                                           "small-v3/full-heads"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (ch == '-' || ch == '/') ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace strata
