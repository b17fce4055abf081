// kernels/moe_experts (routing alignment + grouped expert GEMMs) against the CPU reference on fresh
// random inputs: decode shapes of v2-lite (64 experts, top-6, 2048 x 1408), ragged and empty
// experts, one expert holding more tokens than a pass (several passes), sizes that are not
// multiples of the tiles, invalid expert ids, poisoned outputs and unpicked experts, 1-4 tokens
// and v3 sizes; the identity (dense MLP) mode and the skinny GEMM built on the same kernels, two
// of them chained without a host sync (label gpu: SKIPPED without a GPU).
#include "kernels/moe_experts/moe_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/moe_align_buffers.h"
#include "tests/kernels/small_kernels_reference.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ErrorSummary;
using testing::FromBf16;
using testing::RoundBf16;
using testing::ToBf16;

enum class Routing { kRandom, kSkewed, kInvalid };

struct Case {
  int tokens, experts, top_k, hidden, inter, token_tiles;
  Routing routing;
  bool weights_static = false;  // the down kernel's first weights loaded before its launch wait
};

class MoeExpertsTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  std::vector<float> Random(size_t n, float stddev) {
    std::normal_distribution<float> d(0.f, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = RoundBf16(d(rng_));
    return v;
  }
  // top_k distinct experts per token; kSkewed puts every token on expert 3 (plus random others);
  // kInvalid also plants ids outside [0, E).
  std::vector<int32_t> Route(const Case& c) {
    std::vector<int32_t> ids(static_cast<size_t>(c.tokens) * c.top_k);
    std::vector<int32_t> all(c.experts);
    for (int t = 0; t < c.tokens; ++t) {
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng_);
      if (c.routing == Routing::kSkewed) {
        std::iter_swap(all.begin(), std::find(all.begin(), all.end(), 3));
      }
      for (int k = 0; k < c.top_k; ++k) ids[t * c.top_k + k] = all[k];
    }
    if (c.routing == Routing::kInvalid && c.tokens >= 2) {
      ids[c.top_k - 1] = c.experts;
      ids[c.top_k] = -1;
    }
    return ids;
  }
};

// The reference dot product of n weights and inputs, in double.
double Dot(const float* w, const float* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(w[i]) * x[i];
  return acc;
}

std::vector<uint16_t> ToBf16s(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToBf16(v[i]);
  return out;
}

void RunCase(const Case& c, MoeExpertsTest& t, std::vector<float>& x_host,
             std::vector<int32_t>& ids) {
  SCOPED_TRACE(::testing::Message()
               << "tokens=" << c.tokens << " E=" << c.experts << " k=" << c.top_k
               << " H=" << c.hidden << " I=" << c.inter << " tiles=" << c.token_tiles << " routing="
               << static_cast<int>(c.routing) << " weights_static=" << c.weights_static);
  const int64_t stride = 3 * static_cast<int64_t>(c.inter) * c.hidden + 8;  // padded on purpose
  const int slots = c.tokens * c.top_k;
  const int64_t ld_x = c.hidden + 16;
  ids = t.Route(c);
  x_host = t.Random(static_cast<size_t>(c.tokens) * ld_x, 1.f);
  // Only the experts some token picked get weights (w holds them in that order, `packed` maps an
  // expert to its place); every other expert, and the padding, stays poisoned (bf16 NaN), so a
  // read of the wrong expert's rows shows as non-finite output.
  std::vector<int> packed(c.experts, -1);
  int used_experts = 0;
  for (int32_t e : ids) {
    if (e >= 0 && e < c.experts && packed[e] < 0) packed[e] = used_experts++;
  }
  std::vector<float> w =
      t.Random(stride * used_experts, 1.f / std::sqrt(static_cast<float>(c.hidden)));
  DeviceBuffer d_w(static_cast<size_t>(stride) * c.experts * 2), d_x(ToBf16s(x_host));
  {
    const std::vector<uint16_t> w_bf16 = ToBf16s(w);
    for (int e = 0; e < c.experts; ++e) {
      if (packed[e] < 0) continue;
      ASSERT_CUDA_OK(cudaMemcpy(d_w.get<uint16_t>() + e * stride,
                                w_bf16.data() + packed[e] * stride, (stride - 8) * 2,
                                cudaMemcpyHostToDevice));
    }
  }
  DeviceBuffer d_act(static_cast<size_t>(std::max(slots, 1)) * c.inter * 2),
      d_out(static_cast<size_t>(std::max(slots, 1)) * c.hidden * 2);
  testing::MoeAlignBuffers align(ids, c.tokens, c.top_k, c.experts);
  const MoeAlignParams& a = align.params;
  ASSERT_TRUE(LaunchMoeAlign(a, nullptr).ok());

  MoeExpertsParams p;
  p.num_tokens = c.tokens;
  p.num_experts = c.experts;
  p.max_active = std::min(c.experts, slots);
  p.hidden = c.hidden;
  p.inter = c.inter;
  p.token_tiles = c.token_tiles;
  p.x = d_x.get<__nv_bfloat16>();
  p.ld_x = ld_x;
  p.weights = d_w.get<__nv_bfloat16>();
  p.expert_stride = stride;
  p.expert_count = a.out.expert_count;
  p.expert_offset = a.out.expert_offset;
  p.active = a.out.active;
  p.num_active = a.out.num_active;
  p.slot_token = a.out.slot_token;
  p.act = d_act.get<__nv_bfloat16>();
  p.out = d_out.get<__nv_bfloat16>();
  p.weights_static = c.weights_static;
  const absl::Status st = LaunchMoeExperts(p, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  // Alignment.
  const auto count = align.count.Download<int32_t>(), offset = align.offset.Download<int32_t>(),
             active = align.active.Download<int32_t>(),
             slot_token = align.slot_token.Download<int32_t>();
  const auto token_slot = align.token_slot.Download<int64_t>();
  std::vector<int32_t> want_count(c.experts, 0);
  bool invalid = false;
  for (int32_t e : ids) {
    if (e >= 0 && e < c.experts) {
      ++want_count[e];
    } else {
      invalid = true;
    }
  }
  EXPECT_EQ(align.error.Download<int32_t>()[0], invalid ? 1 : 0);
  int want_active = 0, run = 0;
  for (int e = 0; e < c.experts; ++e) {
    ASSERT_EQ(count[e], want_count[e]) << "expert " << e;
    ASSERT_EQ(offset[e], run) << "expert " << e;
    run += want_count[e];
    if (want_count[e] > 0) {
      ASSERT_EQ(active[want_active++], e);
    }
  }
  EXPECT_EQ(offset[c.experts], run);
  EXPECT_EQ(align.num_active.Download<int32_t>()[0], want_active);
  for (int e = want_active; e < c.experts; ++e) EXPECT_EQ(active[e], -1);
  std::vector<int> used(std::max(slots, 1), 0);
  for (int i = 0; i < slots; ++i) {
    const int e = ids[i];
    if (e < 0 || e >= c.experts) {
      EXPECT_EQ(token_slot[i], -1) << "choice " << i;
      continue;
    }
    const int64_t s = token_slot[i];
    ASSERT_GE(s, offset[e]) << "choice " << i;
    ASSERT_LT(s, offset[e + 1]) << "choice " << i;
    ASSERT_EQ(slot_token[s], i / c.top_k) << "choice " << i;
    ++used[s];
  }
  for (int s = 0; s < run; ++s) ASSERT_EQ(used[s], 1) << "slot " << s;

  // Expert outputs, every valid choice against the reference.
  const auto act = d_act.Download<uint16_t>(), out = d_out.Download<uint16_t>();
  ErrorSummary err_act, err_out;
  std::vector<float> ref_act, ref_out;
  for (int i = 0; i < slots; ++i) {
    const int e = ids[i];
    if (e < 0 || e >= c.experts) continue;
    const int64_t s = token_slot[i];
    MoeExpertReference(w, stride, packed[e], c.hidden, c.inter,
                       x_host.data() + (i / c.top_k) * ld_x, ref_act, ref_out);
    for (int j = 0; j < c.inter; ++j) err_act.Add(FromBf16(act[s * c.inter + j]), ref_act[j]);
    for (int j = 0; j < c.hidden; ++j) err_out.Add(FromBf16(out[s * c.hidden + j]), ref_out[j]);
  }
  EXPECT_EQ(err_act.non_finite, 0);
  EXPECT_EQ(err_out.non_finite, 0);
  EXPECT_LT(err_act.Rel(), 1e-2);
  EXPECT_LT(err_out.Rel(), 1e-2);
  std::printf(
      "tokens %3d E %3d k %d H %5d I %5d tiles %d: act rel %.2e  out rel %.2e  (%ld rows)\n",
      c.tokens, c.experts, c.top_k, c.hidden, c.inter, c.token_tiles, err_act.Rel(), err_out.Rel(),
      static_cast<long>(err_out.count / c.hidden));
}

TEST_F(MoeExpertsTest, MatchesReference) {
  const std::vector<Case> cases = {
      {1, 64, 6, 2048, 1408, 1, Routing::kRandom},   // v2-lite decode, batch 1
      {16, 24, 6, 2048, 1408, 2, Routing::kRandom},  // batch 16: ragged and empty experts
      {9, 16, 6, 2048, 1408, 1, Routing::kSkewed},   // 9 tokens on one expert, one-tile passes
      {40, 8, 2, 136, 88, 2, Routing::kSkewed},      // 40 on expert 3: three passes; odd sizes
      {24, 16, 4, 64, 32, 1, Routing::kInvalid},     // tiny preset sizes, bad ids
      {5, 4, 4, 72, 24, 2, Routing::kRandom},        // every expert active, K below a step
      {0, 8, 2, 64, 32, 1, Routing::kRandom},        // no tokens
      // 1..4 tokens (decode batches below one token tile), v3 sizes.
      {4, 64, 6, 2048, 1408, 1, Routing::kRandom},  // v2-lite decode, batch 4
      {3, 8, 2, 136, 88, 1, Routing::kSkewed},      // 3 slots on expert 3, odd sizes
      {2, 4, 2, 72, 24, 1, Routing::kRandom},       // few rows: most CTAs idle
      {4, 16, 4, 64, 32, 1, Routing::kInvalid},     // bad ids with few tokens
      {2, 32, 8, 7168, 2048, 1, Routing::kRandom},  // v3 sizes (H 7168)
  };
  std::vector<float> x;
  std::vector<int32_t> ids;
  // Every case once as the engine launches it (weights_static: the down kernel reads the
  // alignment arrays and its first weights before its programmatic-launch wait), and the v2-lite
  // decode cases also without.
  for (Case c : cases) {
    c.weights_static = true;
    RunCase(c, *this, x, ids);
  }
  for (const Case& c : {cases[0], cases[7]}) RunCase(c, *this, x, ids);
}

// identity = true: one expert holding every token (the dense and shared-expert MLPs), gate|up and
// down in separate tensors.
TEST_F(MoeExpertsTest, IdentityMlpMatchesReference) {
  struct Shape {
    int tokens, hidden, inter;
  };
  for (const Shape& c : std::vector<Shape>{{1, 2048, 2816},
                                           {16, 2048, 2816},
                                           {11, 136, 88},
                                           {20, 64, 40},
                                           {3, 136, 88},
                                           {4, 2048, 10944},  // v2-lite's dense MLP, 4 rows
                                           {2, 7168, 2048}}) {
    SCOPED_TRACE(::testing::Message()
                 << "tokens=" << c.tokens << " H=" << c.hidden << " I=" << c.inter);
    const int64_t gu_size = 2 * static_cast<int64_t>(c.inter) * c.hidden;
    const std::vector<float> w = Random(gu_size + static_cast<int64_t>(c.hidden) * c.inter,
                                        1.f / std::sqrt(static_cast<float>(c.hidden)));
    const std::vector<float> x = Random(static_cast<size_t>(c.tokens) * c.hidden, 1.f);
    const std::vector<float> gate_up(w.begin(), w.begin() + gu_size),
        down(w.begin() + gu_size, w.end());
    DeviceBuffer d_gu(ToBf16s(gate_up)), d_down(ToBf16s(down)), d_x(ToBf16s(x));
    DeviceBuffer d_act(static_cast<size_t>(c.tokens) * c.inter * 2),
        d_out(static_cast<size_t>(c.tokens) * c.hidden * 2);
    MoeExpertsParams p;
    p.num_tokens = c.tokens;
    p.num_experts = 1;
    p.max_active = 1;
    p.hidden = c.hidden;
    p.inter = c.inter;
    p.token_tiles = c.tokens <= 8 ? 1 : 2;
    p.identity = true;
    p.x = d_x.get<__nv_bfloat16>();
    p.ld_x = c.hidden;
    p.weights = d_gu.get<__nv_bfloat16>();
    p.down = d_down.get<__nv_bfloat16>();
    p.act = d_act.get<__nv_bfloat16>();
    p.out = d_out.get<__nv_bfloat16>();
    const absl::Status st = LaunchMoeExperts(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto out = d_out.Download<uint16_t>();
    ErrorSummary err;
    std::vector<float> ref_act, ref_out;
    for (int t = 0; t < c.tokens; ++t) {
      MoeExpertReference(w, 0, 0, c.hidden, c.inter, x.data() + t * c.hidden, ref_act, ref_out);
      for (int j = 0; j < c.hidden; ++j) err.Add(FromBf16(out[t * c.hidden + j]), ref_out[j]);
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_LT(err.Rel(), 1e-2);
    std::printf("identity tokens %2d H %5d I %5d: out rel %.2e\n", c.tokens, c.hidden, c.inter,
                err.Rel());
  }
}

TEST_F(MoeExpertsTest, SkinnyGemmMatchesReference) {
  // batch > 1: strided x rows (ld_x > k, x entries interleaved as per-head slices), strided
  // outputs with untouched gaps (still poison), fp32 or bf16 out.
  struct Shape {
    int tokens, n_out, k, batch;
    bool fp32;
  };
  for (const Shape& c : std::vector<Shape>{{1, 3072, 2048, 1, false},
                                           {16, 576, 2048, 1, false},
                                           {5, 2048, 2048, 1, false},
                                           {33, 136, 72, 1, false},
                                           {0, 64, 64, 1, false},
                                           {3, 64, 2048, 1, true},
                                           {7, 512, 128, 16, false},
                                           {16, 128, 512, 16, false},
                                           {2, 61, 40, 3, true},
                                           {4, 2048, 2048, 1, false},
                                           {1, 64, 2048, 1, true},
                                           {2, 40, 18432, 1, true},  // v3 dense down length
                                           {3, 1000, 10944, 1, false}}) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << c.tokens << " n=" << c.n_out << " k=" << c.k
                                      << " batch=" << c.batch << " fp32=" << c.fp32);
    const int64_t ld_x = static_cast<int64_t>(c.batch) * (c.k + 8), stride_x = c.k + 8;
    const int64_t ld_out = static_cast<int64_t>(c.batch) * (c.n_out + 3), stride_out = c.n_out + 3;
    const int64_t stride_w = static_cast<int64_t>(c.n_out) * c.k + 16;
    const std::vector<float> w =
        Random(stride_w * c.batch, 1.f / std::sqrt(static_cast<float>(c.k)));
    const std::vector<float> x = Random(std::max<int64_t>(c.tokens, 1) * ld_x, 1.f);
    DeviceBuffer d_w(ToBf16s(w)), d_x(ToBf16s(x));
    DeviceBuffer d_out(std::max<int64_t>(c.tokens, 1) * ld_out * (c.fp32 ? 4 : 2));
    SkinnyGemmParams p;
    p.tokens = c.tokens;
    p.n_out = c.n_out;
    p.k = c.k;
    p.batch = c.batch;
    p.x = d_x.get<__nv_bfloat16>();
    p.ld_x = ld_x;
    p.batch_stride_x = stride_x;
    p.w = d_w.get<__nv_bfloat16>();
    p.batch_stride_w = stride_w;
    if (c.fp32) {
      p.out_f32 = d_out.get<float>();
    } else {
      p.out = d_out.get<__nv_bfloat16>();
    }
    p.ld_out = ld_out;
    p.batch_stride_out = stride_out;
    const absl::Status st = LaunchSkinnyGemm(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto out16 = d_out.Download<uint16_t>();
    const auto out32 = d_out.Download<float>();
    ErrorSummary err;
    int64_t gaps_written = 0;
    for (int t = 0; t < c.tokens; ++t) {
      for (int b = 0; b < c.batch; ++b) {
        for (int j = 0; j < c.n_out + 3; ++j) {
          const int64_t o = t * ld_out + b * stride_out + j;
          const float got = c.fp32 ? out32[o] : FromBf16(out16[o]);
          if (j >= c.n_out) {
            gaps_written += std::isnan(got) ? 0 : 1;
            continue;
          }
          const double acc = Dot(&w[b * stride_w + static_cast<int64_t>(j) * c.k],
                                 &x[t * ld_x + b * stride_x], c.k);
          err.Add(got, c.fp32 ? static_cast<float>(acc) : RoundBf16(static_cast<float>(acc)));
        }
      }
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_EQ(gaps_written, 0) << "wrote outside the output columns";
    EXPECT_LT(err.Rel(), 1e-2);
    std::printf("skinny tokens %2d n %5d k %5d batch %2d fp32 %d: rel %.2e\n", c.tokens, c.n_out,
                c.k, c.batch, c.fp32, err.Rel());
  }
}

// Two projections back to back on one stream with no host sync between (programmatic launches):
// the second reads what the first wrote; an input read before the first kernel's writes would
// see the poisoned (NaN) buffer.
// With weights_static the second kernel loads its weights early, but its input only after the
// wait.
TEST_F(MoeExpertsTest, ChainedSkinnyGemmsReadEachOthersOutput) {
  const int k = 2048, mid = 1536, n = 576;
  const std::vector<float> w1 = Random(static_cast<size_t>(mid) * k, 1.f / std::sqrt(1.f * k));
  const std::vector<float> w2 = Random(static_cast<size_t>(n) * mid, 1.f / std::sqrt(1.f * mid));
  DeviceBuffer d_w1(ToBf16s(w1)), d_w2(ToBf16s(w2));
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int run = 0; run < 6; ++run) {
    const int tokens = std::vector<int>{1, 3, 12}[run % 3];
    const bool weights_static = run >= 3;
    SCOPED_TRACE(::testing::Message()
                 << "tokens=" << tokens << " weights_static=" << weights_static);
    const std::vector<float> x = Random(static_cast<size_t>(tokens) * k, 1.f);
    DeviceBuffer d_x(ToBf16s(x)), d_mid(static_cast<size_t>(tokens) * mid * 2),
        d_out(static_cast<size_t>(tokens) * n * 2);
    SkinnyGemmParams a;
    a.tokens = tokens;
    a.n_out = mid;
    a.k = k;
    a.x = d_x.get<__nv_bfloat16>();
    a.w = d_w1.get<__nv_bfloat16>();
    a.out = d_mid.get<__nv_bfloat16>();
    a.weights_static = weights_static;
    SkinnyGemmParams b = a;
    b.n_out = n;
    b.k = mid;
    b.x = a.out;
    b.w = d_w2.get<__nv_bfloat16>();
    b.out = d_out.get<__nv_bfloat16>();
    ASSERT_TRUE(LaunchSkinnyGemm(a, stream).ok());
    ASSERT_TRUE(LaunchSkinnyGemm(b, stream).ok());
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    const auto out = d_out.Download<uint16_t>();
    ErrorSummary err;
    std::vector<float> h(mid);
    for (int t = 0; t < tokens; ++t) {
      for (int j = 0; j < mid; ++j) {
        h[j] = RoundBf16(static_cast<float>(Dot(&w1[static_cast<size_t>(j) * k], &x[t * k], k)));
      }
      for (int j = 0; j < n; ++j) {
        const double acc = Dot(&w2[static_cast<size_t>(j) * mid], h.data(), mid);
        err.Add(FromBf16(out[t * n + j]), RoundBf16(static_cast<float>(acc)));
      }
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_LT(err.Rel(), 1e-2);
  }
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

// Argument checks touch no device: they run without a GPU too.
TEST(MoeExpertsParamsTest, RejectsBadParams) {
  MoeExpertsParams p;
  EXPECT_FALSE(ValidateMoeExpertsParams(p).ok());
  MoeAlignParams a;
  a.num_experts = kMoeAlignMaxExperts + 1;
  a.top_k = 1;
  EXPECT_FALSE(ValidateMoeAlignParams(a).ok());
  // A well-formed identity MLP, then one bad field at a time.
  alignas(16) static __nv_bfloat16 buf[64];
  p.num_tokens = 1;
  p.num_experts = 1;
  p.max_active = 1;
  p.hidden = 8;
  p.inter = 8;
  p.token_tiles = 1;
  p.identity = true;
  p.x = p.weights = buf;
  p.ld_x = 8;
  p.act = p.out = buf;
  EXPECT_TRUE(ValidateMoeExpertsParams(p).ok());
  MoeExpertsParams q = p;
  q.max_active = 2;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "identity needs max_active 1";
  q = p;
  q.hidden = 12;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "hidden not a multiple of 8";
  q = p;
  q.token_tiles = 3;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok());
  q = p;
  q.identity = false;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "routed without alignment arrays";
  q = p;
  q.x = buf + 1;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "misaligned x";
  SkinnyGemmParams g;
  g.tokens = 1;
  g.n_out = 8;
  g.k = 12;
  g.x = g.w = buf;
  g.out = buf;
  EXPECT_FALSE(LaunchSkinnyGemm(g, nullptr).ok()) << "k not a multiple of 8";
  g.k = 8;
  g.out_f32 = reinterpret_cast<float*>(buf);
  EXPECT_FALSE(LaunchSkinnyGemm(g, nullptr).ok()) << "both outputs set";
}

}  // namespace
}  // namespace strata::kernels
