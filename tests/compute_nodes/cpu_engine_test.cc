// CPU engine invariants: absorbed decode = MHA form, chunked prefill = one-shot prefill, batched
// decode = one sequence at a time, bad input rejected; KV pool layout and exhaustion; sampling.
#include "compute_nodes/backend/cpu/cpu_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/safetensors.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/runtime/generate.h"
#include "compute_nodes/runtime/sampler.h"
#include "tests/compute_nodes/kv_pool_checks.h"
#include "tests/compute_nodes/test_util.h"

namespace strata {
namespace {

using runtime::AttentionForm;
using runtime::PageTable;
using runtime::SequenceInput;
using runtime::SequenceOutput;
using testutil::RelError;

std::shared_ptr<const model::ModelWeights> Tiny(const std::string& preset = "tiny") {
  static std::map<std::string, std::shared_ptr<const model::ModelWeights>> cache;
  auto& w = cache[preset];
  if (w) return w;
  const std::string dir = testing::TempDir() + "/engine_test_" + preset;
  model::MakeRandomOptions o;
  o.seed = 11;
  EXPECT_TRUE(model::MakeRandomCheckpoint(*model::PresetConfig(preset), o, dir).ok());
  auto loaded = model::LoadModel(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  w = std::shared_ptr<const model::ModelWeights>(std::move(*loaded));
  return w;
}

std::vector<int32_t> Ids(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 7919 + salt * 104729) % 129280;
  return ids;
}

// Logits of every token of `ids`, fed in chunks from position `from` (the pages already hold
// the positions before it).
std::vector<float> RunAll(cpu::CpuEngine& e, const std::vector<int32_t>& ids, PageTable* pages,
                          int64_t chunk, AttentionForm form, uint64_t sequence_id = 0,
                          size_t from = 0) {
  std::vector<float> all;
  EXPECT_TRUE(runtime::EnsureCapacity(e.kv_pool(), *pages, ids.size()).ok());
  for (size_t pos = from; pos < ids.size(); pos += chunk) {
    const size_t n = std::min<size_t>(chunk, ids.size() - pos);
    SequenceInput in{std::span<const int32_t>(ids).subspan(pos, n),
                     static_cast<int64_t>(pos),
                     pages,
                     true,
                     form,
                     sequence_id};
    std::vector<SequenceOutput> out;
    EXPECT_TRUE(e.Forward({&in, 1}, &out).ok());
    all.insert(all.end(), out[0].logits.begin(), out[0].logits.end());
  }
  return all;
}

class EngineFormsTest : public testing::TestWithParam<std::string> {};

// Chunked prefill over pages (chunks of 1, 5, 64+) and the absorbed form all equal one-shot MHA.
TEST_P(EngineFormsTest, ChunkingAndAbsorptionAreExact) {
  auto w = Tiny(GetParam());
  const std::vector<int32_t> ids = Ids(80, 1);
  cpu::CpuEngine e(w, 16);
  PageTable p0, p1, p2, p3;
  const auto ref = RunAll(e, ids, &p0, 80, AttentionForm::kMha);
  EXPECT_LT(RelError(RunAll(e, ids, &p1, 5, AttentionForm::kMha).data(), ref.data(), ref.size()),
            1e-5);
  EXPECT_LT(
      RelError(RunAll(e, ids, &p2, 1, AttentionForm::kAbsorbed).data(), ref.data(), ref.size()),
      1e-5);
  EXPECT_LT(
      RelError(RunAll(e, ids, &p3, 33, AttentionForm::kAbsorbed).data(), ref.data(), ref.size()),
      1e-5);
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineFormsTest, testing::Values("tiny", "small-v2"));

// A sequence that names itself keeps its decompressed context between prefill chunks: the logits
// equal those of decompressing everything per chunk, and forgetting it frees the memory.
TEST(CpuEngineTest, KeptContextEqualsFreshDecompression) {
  auto w = Tiny("small-v3");
  const std::vector<int32_t> ids = Ids(150, 4);
  cpu::CpuEngine e(w, 16);
  PageTable p0, p1, p2;
  const auto ref = RunAll(e, ids, &p0, 150, AttentionForm::kMha);
  EXPECT_EQ(e.context_cache_bytes_used(), 0);
  for (int64_t chunk : {5, 33, 64}) {
    PageTable p;
    const uint64_t id = 100 + chunk;
    const auto got = RunAll(e, ids, &p, chunk, AttentionForm::kMha, id);
    EXPECT_LT(RelError(got.data(), ref.data(), ref.size()), 1e-5) << chunk;
    EXPECT_GT(e.context_cache_bytes_used(), 0) << chunk;
    e.ForgetSequence(id);
    EXPECT_EQ(e.context_cache_bytes_used(), 0) << chunk;
    EXPECT_GT(e.context_cache_bytes_reserved(), 0) << chunk;  // spare buffers for the next one
    runtime::ReleasePages(e.kv_pool(), p);
  }
  // A decode step of the sequence drops what its prefill kept.
  ASSERT_TRUE(runtime::EnsureCapacity(e.kv_pool(), p1, ids.size() + 1).ok());
  RunAll(e, ids, &p1, 64, AttentionForm::kMha, 7);
  EXPECT_GT(e.context_cache_bytes_used(), 0);
  const int32_t next = 17;
  SequenceInput step{{&next, 1}, 150, &p1, false, AttentionForm::kAuto, 7};
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(e.Forward({&step, 1}, &out).ok());
  EXPECT_EQ(e.context_cache_bytes_used(), 0);
}

// Kept context is only trusted under the same pages: the same id continued over other pages
// holding another prefix must use that prefix (a stale context would give the first one's logits).
TEST(CpuEngineTest, KeptContextIsNotReusedAcrossOtherPages) {
  auto w = Tiny();
  const std::vector<int32_t> a = Ids(100, 6), b = Ids(100, 8);
  cpu::CpuEngine e(w, 16);
  PageTable pa, pb, pr;
  RunAll(e, std::vector<int32_t>(a.begin(), a.begin() + 70), &pa, 70, AttentionForm::kMha, 3);
  RunAll(e, std::vector<int32_t>(b.begin(), b.begin() + 70), &pb, 70, AttentionForm::kMha);
  const auto got = RunAll(e, b, &pb, 30, AttentionForm::kMha, 3, 70);
  const auto ref = RunAll(e, b, &pr, 100, AttentionForm::kMha);
  const size_t vocab = w->config.vocab_size;
  ASSERT_EQ(got.size(), 30 * vocab);
  EXPECT_LT(RelError(got.data(), ref.data() + 70 * vocab, got.size()), 1e-5);
}

// The budget bounds what is kept between calls; over it, contexts are recomputed, not wrong.
TEST(CpuEngineTest, KeptContextsStayWithinTheBudget) {
  auto w = Tiny();
  const std::vector<int32_t> ids = Ids(130, 9);
  cpu::CpuEngine unlimited(w, 8);
  PageTable pu;
  RunAll(unlimited, ids, &pu, 40, AttentionForm::kMha, 1);
  const int64_t one = unlimited.context_cache_bytes_used();
  ASSERT_GT(one, 0);

  cpu::CpuEngine e(w, 16, 64, runtime::KvPrecision::kF32, one + one / 2);
  PageTable p0, p1, p2, p3;
  const auto ref = RunAll(e, ids, &p0, 130, AttentionForm::kMha);
  const auto first = RunAll(e, ids, &p1, 40, AttentionForm::kMha, 1);
  EXPECT_EQ(e.context_cache_bytes_used(), one);
  const auto second = RunAll(e, ids, &p2, 40, AttentionForm::kMha, 2);
  EXPECT_LE(e.context_cache_bytes_used(), one + one / 2);  // the older one was evicted
  EXPECT_LE(e.context_cache_bytes_reserved(), one + one / 2);
  e.ForgetSequence(2);
  const auto third = RunAll(e, ids, &p3, 40, AttentionForm::kMha, 3);  // on the spare buffers
  EXPECT_LT(RelError(third.data(), ref.data(), ref.size()), 1e-5);
  EXPECT_LE(e.context_cache_bytes_reserved(), one + one / 2);
  EXPECT_LT(RelError(first.data(), ref.data(), ref.size()), 1e-5);
  EXPECT_LT(RelError(second.data(), ref.data(), ref.size()), 1e-5);

  cpu::CpuEngine none(w, 8, 64, runtime::KvPrecision::kF32, 0);
  PageTable pn;
  const auto got = RunAll(none, ids, &pn, 40, AttentionForm::kMha, 5);
  EXPECT_EQ(none.context_cache_bytes_used(), 0);
  EXPECT_LT(RelError(got.data(), ref.data(), ref.size()), 1e-5);
}

TEST(CpuEngineTest, BatchedDecodeEqualsOneAtATime) {
  auto w = Tiny();
  const int kSeqs = 4;
  cpu::CpuEngine e(w, 16);
  std::vector<PageTable> pages(kSeqs);
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < kSeqs; ++s) {
    prompts.push_back(Ids(10 + 17 * s, s + 2));
    RunAll(e, prompts[s], &pages[s], 64, AttentionForm::kMha);
  }
  // One batched decode step: every sequence adds one token at its own position.
  std::vector<int32_t> next(kSeqs);
  std::vector<SequenceInput> batch;
  for (int s = 0; s < kSeqs; ++s) {
    next[s] = 1000 + s;
    ASSERT_TRUE(runtime::EnsureCapacity(e.kv_pool(), pages[s], prompts[s].size() + 1).ok());
    batch.push_back({{&next[s], 1},
                     static_cast<int64_t>(prompts[s].size()),
                     &pages[s],
                     false,
                     AttentionForm::kAuto});
  }
  std::vector<SequenceOutput> batched;
  ASSERT_TRUE(e.Forward(batch, &batched).ok());
  ASSERT_EQ(batched.size(), static_cast<size_t>(kSeqs));
  for (int s = 0; s < kSeqs; ++s) {
    cpu::CpuEngine solo(w, 4);
    PageTable p;
    std::vector<int32_t> ids = prompts[s];
    ids.push_back(next[s]);
    const auto all = RunAll(solo, ids, &p, 64, AttentionForm::kMha);
    const float* last = all.data() + (ids.size() - 1) * w->config.vocab_size;
    EXPECT_LT(RelError(batched[s].logits.data(), last, w->config.vocab_size), 1e-5) << s;
  }
}

// Draws on the CPU engine: the logits still come back, and `token` is what the draw picks from
// the last row (runtime::PickToken, as the sequence's Sampler would); outputs without a draw
// keep -1.
TEST(CpuEngineTest, DrawnTokensArePickedFromTheLastRow) {
  auto w = Tiny();
  cpu::CpuEngine e(w, 16);
  const std::vector<int32_t> a = Ids(20, 3), b = Ids(7, 4), c = Ids(9, 5);
  PageTable pa, pb, pc;
  ASSERT_TRUE(runtime::EnsureCapacity(e.kv_pool(), pa, a.size()).ok());
  ASSERT_TRUE(runtime::EnsureCapacity(e.kv_pool(), pb, b.size()).ok());
  ASSERT_TRUE(runtime::EnsureCapacity(e.kv_pool(), pc, c.size()).ok());
  std::vector<SequenceInput> batch = {{a, 0, &pa, true, AttentionForm::kMha},
                                      {b, 0, &pb, false, AttentionForm::kMha},
                                      {c, 0, &pc, false, AttentionForm::kMha}};
  runtime::Sampler greedy_sampler({});
  EXPECT_TRUE(greedy_sampler.greedy());
  batch[0].draw = greedy_sampler.Draw();
  runtime::Sampler hot({.temperature = 5.0f, .top_p = 0.9f, .seed = 11});
  batch[2].draw = hot.Draw();
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(e.Forward(batch, &out).ok());
  const int64_t vocab = w->config.vocab_size;
  ASSERT_EQ(out[0].logits.size(), a.size() * vocab);
  const auto last = out[0].logits.end() - vocab;
  EXPECT_EQ(out[0].token, std::max_element(last, out[0].logits.end()) - last);
  EXPECT_EQ(out[1].token, -1);
  // The same stream sampling on the host picks the same token.
  runtime::Sampler hot_again({.temperature = 5.0f, .top_p = 0.9f, .seed = 11});
  EXPECT_EQ(out[2].token, hot_again.Sample(out[2].logits));
}

// A prefix of 64 of `ids` computed in a bf16 pool, exported as a `dtype` block payload and
// imported into a fresh bf16 pool, and the other 16 computed on top.
struct Restored {
  std::vector<float> reference;  // logits of every token of the uninterrupted run
  std::vector<float> suffix;     // logits of the 16 tokens computed on the restored prefix
  size_t payload_bytes = 0;
};

Restored RestoreAPrefix(const std::shared_ptr<const model::ModelWeights>& w,
                        const std::vector<int32_t>& ids, runtime::PayloadDtype dtype) {
  Restored r;
  cpu::CpuEngine a(w, 4, 64, runtime::KvPrecision::kBf16);
  PageTable pa;
  r.reference = RunAll(a, ids, &pa, 64, AttentionForm::kMha);
  std::vector<uint8_t> payload;
  EXPECT_TRUE(a.kv_pool().ExportPage(pa.pages[0], dtype, &payload).ok());
  r.payload_bytes = payload.size();
  cpu::CpuEngine b(w, 4, 64, runtime::KvPrecision::kBf16);
  PageTable pb;
  EXPECT_TRUE(runtime::EnsureCapacity(b.kv_pool(), pb, ids.size()).ok());
  EXPECT_TRUE(b.kv_pool().ImportPage(pb.pages[0], dtype, payload).ok());
  SequenceInput in{std::span<const int32_t>(ids).subspan(64), 64, &pb, true, AttentionForm::kMha};
  std::vector<SequenceOutput> out;
  EXPECT_TRUE(b.Forward({&in, 1}, &out).ok());
  if (!out.empty()) r.suffix = std::move(out[0].logits);
  return r;
}

// With a bf16 pool, a prefix restored from a bf16 block payload is bit-identical to the prefix
// computed in place, so the logits of what follows are equal, not just close.
TEST(CpuEngineTest, Bf16PoolRestoresAPrefixExactly) {
  auto w = Tiny();
  const std::vector<int32_t> ids = Ids(80, 5);
  const Restored r = RestoreAPrefix(w, ids, runtime::PayloadDtype::kBf16);
  const size_t vocab = w->config.vocab_size;
  ASSERT_EQ(r.suffix.size(), 16 * vocab);
  EXPECT_TRUE(std::equal(r.suffix.begin(), r.suffix.end(), r.reference.begin() + 64 * vocab));

  // An fp32 pool exported through bf16 is lossy: the same restore is only close.
  cpu::CpuEngine c(w, 4);
  PageTable pc;
  const auto ref32 = RunAll(c, ids, &pc, 64, AttentionForm::kMha);
  EXPECT_FALSE(std::equal(ref32.begin(), ref32.end(), r.reference.begin()));
}

// An fp8 block restores the prefix at fp8 precision: what follows is close to the run that kept
// its bf16 prefix, not equal (the figures are in docs/numerics.md).
TEST(CpuEngineTest, Fp8BlocksRestoreAPrefixClosely) {
  auto w = Tiny();
  const Restored r = RestoreAPrefix(w, Ids(80, 5), runtime::PayloadDtype::kFp8E4M3);
  cpu::CpuEngine probe(w, 1, 64);
  EXPECT_EQ(r.payload_bytes, probe.kv_pool().PayloadBytes(runtime::PayloadDtype::kFp8E4M3));
  const size_t vocab = w->config.vocab_size;
  ASSERT_EQ(r.suffix.size(), 16 * vocab);
  double diff = 0, norm = 0;
  int same_argmax = 0;
  for (size_t row = 0; row < 16; ++row) {
    const float* got = r.suffix.data() + row * vocab;
    const float* want = r.reference.data() + (64 + row) * vocab;
    for (size_t v = 0; v < vocab; ++v) {
      diff += (got[v] - want[v]) * double(got[v] - want[v]);
      norm += double(want[v]) * want[v];
    }
    same_argmax +=
        std::max_element(got, got + vocab) - got == std::max_element(want, want + vocab) - want;
  }
  const double rel = std::sqrt(diff / norm);
  std::printf("fp8 prefix: logits relative error %.3e, argmax equal on %d of 16 rows\n", rel,
              same_argmax);
  EXPECT_GT(rel, 0) << "fp8 is lossy; equal logits mean the fp8 path was not taken";
  EXPECT_LT(rel, 0.05);
  EXPECT_GE(same_argmax, 14);
}

TEST(CpuEngineTest, RejectsBadInput) {
  auto w = Tiny();
  cpu::CpuEngine e(w, 2);
  PageTable pages;
  ASSERT_TRUE(runtime::EnsureCapacity(e.kv_pool(), pages, 10).ok());
  std::vector<SequenceOutput> out;
  const std::vector<int32_t> bad = {5, 129280};
  SequenceInput in{bad, 0, &pages, false, AttentionForm::kAuto};
  EXPECT_EQ(e.Forward({&in, 1}, &out).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> many = Ids(65, 3);  // pages cover only 64 tokens
  SequenceInput too_long{many, 0, &pages, false, AttentionForm::kAuto};
  EXPECT_EQ(e.Forward({&too_long, 1}, &out).code(), absl::StatusCode::kInvalidArgument);
  SequenceInput no_pages{many, 0, nullptr, false, AttentionForm::kAuto};
  EXPECT_EQ(e.Forward({&no_pages, 1}, &out).code(), absl::StatusCode::kInvalidArgument);
}

model::ModelConfig RoutingConfig(model::ModelType type) {
  model::ModelConfig c;
  c.type = type;
  c.n_routed_experts = 8;
  c.n_group = 4;
  c.topk_group = 2;
  c.num_experts_per_tok = 2;
  c.routed_scaling_factor = 2.5;
  c.norm_topk_prob = true;
  c.scoring_func = type == model::ModelType::kDeepseekV3 ? model::ScoringFunc::kSigmoid
                                                         : model::ScoringFunc::kSoftmax;
  c.topk_method = type == model::ModelType::kDeepseekV3 ? model::TopkMethod::kNoauxTc
                                                        : model::TopkMethod::kGroupLimitedGreedy;
  return c;
}

TEST(RoutingTest, ZeroBiasTiesGoToTheLowerExpert) {
  const auto c = RoutingConfig(model::ModelType::kDeepseekV3);
  const std::vector<float> logits(8, 0.0f), bias(8, 0.0f);
  std::vector<int32_t> experts;
  std::vector<float> weights;
  cpu::RouteToken(c, logits.data(), bias.data(), &experts, &weights);
  std::sort(experts.begin(), experts.end());
  EXPECT_EQ(experts, (std::vector<int32_t>{0, 1}));
  for (float w : weights) EXPECT_FLOAT_EQ(w, 0.5f * 2.5f);  // normalized, then scaled
}

TEST(RoutingTest, BiasSteersChoiceButNotWeights) {
  const auto c = RoutingConfig(model::ModelType::kDeepseekV3);
  std::vector<float> logits(8, 0.0f), bias(8, 0.0f);
  logits[6] = 1.0f;  // group 3 has the best raw score...
  bias[5] = 0.3f;    // ...but group 2's biased sum (0.8 + 0.5) wins, group 3 comes second
  std::vector<int32_t> experts;
  std::vector<float> weights;
  cpu::RouteToken(c, logits.data(), bias.data(), &experts, &weights);
  ASSERT_EQ(experts.size(), 2u);
  EXPECT_EQ(experts[0], 5);
  EXPECT_EQ(experts[1], 6);
  const float s5 = 0.5f, s6 = 1.0f / (1.0f + std::exp(-1.0f));  // unbiased sigmoid scores
  EXPECT_NEAR(weights[0], s5 / (s5 + s6) * 2.5f, 1e-6);
  EXPECT_NEAR(weights[1], s6 / (s5 + s6) * 2.5f, 1e-6);
}

TEST(RoutingTest, V2GroupLimitedGreedyScalesSoftmaxWithoutNormalizing) {
  const auto c = RoutingConfig(model::ModelType::kDeepseekV2);  // norm_topk_prob ignored, as HF
  std::vector<float> logits = {0.0f, 0.1f, 3.0f, 0.0f, 0.0f, 2.0f, 2.5f, 0.0f};
  std::vector<int32_t> experts;
  std::vector<float> weights;
  cpu::RouteToken(c, logits.data(), nullptr, &experts, &weights);
  // Group maxima: g1 (e2: 3.0) and g3 (e6: 2.5) win; e5 (2.0, in g2) is excluded.
  EXPECT_EQ(experts, (std::vector<int32_t>{2, 6}));
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(weights[0], std::exp(3.0) / z * 2.5, 1e-6);
  EXPECT_NEAR(weights[1], std::exp(2.5) / z * 2.5, 1e-6);
}

TEST(KvPoolTest, PayloadIsLayerMajorLatentThenKPe) {
  runtime::KvLayout layout{/*num_layers=*/2, /*block_tokens=*/16, /*latent_dim=*/8,
                           /*rope_dim=*/4};
  runtime::HostKvPool pool(layout, 2);
  auto page = pool.Allocate();
  ASSERT_TRUE(page.ok());
  for (int l = 0; l < 2; ++l) {
    for (int t = 0; t < 16; ++t) {
      for (int d = 0; d < 8; ++d) pool.Latent(*page, l)[t * 8 + d] = 1000 * l + 10 * t + d;
      for (int d = 0; d < 4; ++d) pool.KPe(*page, l)[t * 4 + d] = -(1000 * l + 10 * t + d);
    }
  }
  std::vector<uint8_t> payload;
  ASSERT_TRUE(pool.ExportPage(*page, runtime::PayloadDtype::kF32, &payload).ok());
  ASSERT_EQ(payload.size(), 2u * 16 * (8 + 4) * 4);
  const auto* f = reinterpret_cast<const float*>(payload.data());
  // Layer 1 starts after layer 0's latent [16][8] and k_pe [16][4].
  EXPECT_EQ(f[16 * 8 + 3 * 4 + 2], -(0 + 30 + 2));
  EXPECT_EQ(f[16 * 12 + 5 * 8 + 1], 1000 + 50 + 1);
  EXPECT_EQ(f[16 * 12 + 16 * 8 + 15 * 4 + 3], -(1000 + 150 + 3));
  // bf16 round trip is the bf16 rounding of every value.
  std::vector<uint8_t> bf16;
  ASSERT_TRUE(pool.ExportPage(*page, runtime::PayloadDtype::kBf16, &bf16).ok());
  EXPECT_EQ(bf16.size(), payload.size() / 2);
  auto other = pool.Allocate();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(pool.ImportPage(*other, runtime::PayloadDtype::kBf16, bf16).ok());
  EXPECT_EQ(pool.Latent(*other, 0)[3 * 8 + 2], 32.0f);    // exact in bf16
  EXPECT_EQ(pool.Latent(*other, 1)[5 * 8 + 1], 1048.0f);  // 1051 rounds to 1048 (8-bit mantissa)
  EXPECT_FALSE(pool.ImportPage(*other, runtime::PayloadDtype::kF32, bf16).ok());
  EXPECT_FALSE(pool.ExportPage(7, runtime::PayloadDtype::kF32, &payload).ok());
}

// The pool's inlined conversions are model::FloatToBf16 / Bf16ToFloat bit for bit: ties to even,
// NaNs quiet, infinities, zeros and subnormals as they are.
TEST(KvPoolTest, Bf16MovesConvertExactlyLikeTheModelsConversions) {
  const runtime::KvLayout layout{/*num_layers=*/1, /*block_tokens=*/16, /*latent_dim=*/8,
                                 /*rope_dim=*/4};
  runtime::HostKvPool pool(layout, 2);
  auto page = pool.Allocate();
  ASSERT_TRUE(page.ok());
  const int64_t n = layout.floats_per_page();
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xc0490fdbu};
  std::mt19937 rng(5);
  while (static_cast<int64_t>(bits.size()) < n) bits.push_back(static_cast<uint32_t>(rng()));
  float* f = pool.Latent(*page, 0);  // the page is layer-major: latent then k_pe, contiguous
  for (int64_t i = 0; i < n; ++i) std::memcpy(f + i, &bits[i], 4);
  std::vector<uint8_t> bf16;
  ASSERT_TRUE(pool.ExportPage(*page, runtime::PayloadDtype::kBf16, &bf16).ok());
  for (int64_t i = 0; i < n; ++i) {
    uint16_t got;
    std::memcpy(&got, bf16.data() + 2 * i, 2);
    float x;
    std::memcpy(&x, &bits[i], 4);
    ASSERT_EQ(got, model::FloatToBf16(x)) << "value " << i << " bits " << std::hex << bits[i];
  }
  auto other = pool.Allocate();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(pool.ImportPage(*other, runtime::PayloadDtype::kBf16, bf16).ok());
  const float* back = pool.Latent(*other, 0);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    const float want = model::Bf16ToFloat(b);
    ASSERT_EQ(std::memcmp(back + i, &want, 4), 0) << "value " << i;
  }
}

TEST(KvPoolTest, BatchedMovesEqualPerPageMoves) {
  runtime::HostKvPool pool({/*num_layers=*/3, /*block_tokens=*/16, /*latent_dim=*/8,
                            /*rope_dim=*/4},
                           12);
  testutil::CheckBatchedPageMoves(pool, 11, 7);
  testutil::CheckHostBufferPageMoves(pool, 11, 8);
}

// Batches of megabytes move on several threads; a page named twice in one batch takes the
// later payload, as it would one page at a time.
TEST(KvPoolTest, LargeBatchesMoveOnThreadsAndRepeatedPagesInOrder) {
  runtime::HostKvPool pool({/*num_layers=*/4, /*block_tokens=*/64, /*latent_dim=*/512,
                            /*rope_dim=*/64},
                           40, runtime::KvPrecision::kBf16);
  testutil::CheckBatchedPageMoves(pool, 24, 41);  // 24 x 295 KB bf16 payloads
  testutil::CheckFp8PageMoves(pool, 12, 42);
  // Pages 0..14, then page 0 again: 16 payloads, 4.7 MB, enough for threads if it were distinct.
  const size_t bytes = pool.PayloadBytes(runtime::PayloadDtype::kBf16);
  std::vector<std::vector<uint8_t>> payloads(16, std::vector<uint8_t>(bytes));
  std::vector<int32_t> pages;
  for (size_t k = 0; k < 16; ++k) {
    for (size_t i = 0; i < bytes; i += 2) payloads[k][i + 1] = static_cast<uint8_t>(0x30 + k);
    pages.push_back(static_cast<int32_t>(k % 15));
  }
  const std::vector<std::span<const uint8_t>> in(payloads.begin(), payloads.end());
  int64_t done = 0;
  ASSERT_TRUE(pool.ImportPages(pages, runtime::PayloadDtype::kBf16, in, &done).ok());
  EXPECT_EQ(done, 16);
  std::vector<uint8_t> got;
  ASSERT_TRUE(pool.ExportPage(0, runtime::PayloadDtype::kBf16, &got).ok());
  EXPECT_EQ(got, payloads[15]);
  ASSERT_TRUE(pool.ExportPage(14, runtime::PayloadDtype::kBf16, &got).ok());
  EXPECT_EQ(got, payloads[14]);
}

TEST(KvPoolTest, Fp8PayloadsAreTheBlockFormatsCodec) {
  for (const runtime::KvPrecision precision :
       {runtime::KvPrecision::kBf16, runtime::KvPrecision::kF32}) {
    runtime::HostKvPool pool({/*num_layers=*/2, /*block_tokens=*/16, /*latent_dim=*/256,
                              /*rope_dim=*/32},
                             10, precision);
    testutil::CheckFp8PageMoves(pool, 5, 21);
  }
  // A latent dim that is not a multiple of the fp8 group cannot be fp8.
  runtime::HostKvPool odd({1, 16, 8, 4}, 1);
  std::vector<uint8_t> payload(odd.PayloadBytes(runtime::PayloadDtype::kBf16));
  const absl::Status st = odd.ImportPage(0, runtime::PayloadDtype::kFp8E4M3, payload);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("multiple of 128"), std::string::npos) << st;
}

TEST(KvPoolTest, ExhaustionIsAStatusAndLeaksNothing) {
  runtime::HostKvPool pool({1, 16, 8, 4}, 3);
  PageTable a, b;
  ASSERT_TRUE(runtime::EnsureCapacity(pool, a, 33).ok());  // 3 pages
  EXPECT_EQ(pool.free_pages(), 0);
  EXPECT_EQ(runtime::EnsureCapacity(pool, b, 1).code(), absl::StatusCode::kResourceExhausted);
  runtime::ReleasePages(pool, a);
  EXPECT_EQ(pool.free_pages(), 3);
  ASSERT_TRUE(runtime::EnsureCapacity(pool, a, 20).ok());
  EXPECT_EQ(runtime::EnsureCapacity(pool, b, 40).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.free_pages(), 1);  // the failed request returned what it took
  EXPECT_TRUE(b.pages.empty());
}

TEST(SamplerTest, GreedyTopKTopPSeedAndStops) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 1.95f};
  runtime::SamplingParams greedy;
  EXPECT_EQ(runtime::Sampler(greedy).Sample(logits), 1);
  runtime::SamplingParams hot;
  hot.temperature = 1.0f;
  hot.seed = 42;
  runtime::Sampler s1(hot), s2(hot);
  std::vector<int32_t> draws1, draws2;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 2000; ++i) {
    draws1.push_back(s1.Sample(logits));
    draws2.push_back(s2.Sample(logits));
    ++counts[draws1.back()];
  }
  EXPECT_EQ(draws1, draws2);  // same seed, same draws
  EXPECT_GT(counts[0], 0);    // every token reachable at temperature 1
  EXPECT_GT(counts[3], 0);
  runtime::SamplingParams topk = hot;
  topk.top_k = 2;
  runtime::Sampler sk(topk);
  for (int i = 0; i < 500; ++i) {
    const int32_t t = sk.Sample(logits);
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
  runtime::SamplingParams topp = hot;
  topp.top_p = 0.05f;  // the nucleus is the single best token
  runtime::Sampler sp(topp);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sp.Sample(logits), 1);

  runtime::SamplingParams stop;
  stop.max_tokens = 3;
  stop.stop_ids = {7};
  const std::vector<int32_t> g1 = {1, 2}, g2 = {1, 7}, g3 = {1, 2, 3};
  EXPECT_EQ(runtime::CheckStop(stop, g1), runtime::StopReason::kNone);
  EXPECT_EQ(runtime::CheckStop(stop, g2), runtime::StopReason::kStopId);
  EXPECT_EQ(runtime::CheckStop(stop, g3), runtime::StopReason::kMaxTokens);
  stop.stop_strings = {"<end>"};
  EXPECT_EQ(runtime::CheckStop(stop, g1), runtime::StopReason::kNone);  // no detokenizer yet
  stop.detokenize = [](std::span<const int32_t> ids) {
    return ids.size() == 2 && ids[1] == 2 ? std::string("text<end>") : std::string("text");
  };
  EXPECT_EQ(runtime::CheckStop(stop, g1), runtime::StopReason::kStopString);
}

TEST(GenerateTest, StopsAtStopIdAndReleasesPages) {
  auto w = Tiny();
  cpu::CpuEngine e(w, 4);
  const std::vector<int32_t> prompt = Ids(12, 9);
  runtime::SamplingParams p;
  p.max_tokens = 6;
  auto full = runtime::Generate(e, prompt, p);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->tokens.size(), 6u);
  EXPECT_EQ(full->stop, runtime::StopReason::kMaxTokens);
  p.stop_ids = {full->tokens[2]};
  auto stopped = runtime::Generate(e, prompt, p, /*prefill_chunk=*/5);
  ASSERT_TRUE(stopped.ok());
  // Greedy: the same first tokens, cut at the first occurrence of the stop id.
  const auto first = std::find(full->tokens.begin(), full->tokens.end(), full->tokens[2]);
  EXPECT_EQ(stopped->tokens, std::vector<int32_t>(full->tokens.begin(), first + 1));
  EXPECT_EQ(stopped->stop, runtime::StopReason::kStopId);
  EXPECT_EQ(e.kv_pool().free_pages(), 4);
  // A pool too small for the prompt fails cleanly.
  cpu::CpuEngine small(w, 1);
  const std::vector<int32_t> longp = Ids(70, 4);
  EXPECT_EQ(runtime::Generate(small, longp, p).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(small.kv_pool().free_pages(), 1);
}

}  // namespace
}  // namespace strata
