// The fused latent-rows kernel (norm + RoPE + scatter of a step's new KV rows) against the CPU
// references (RmsNormReference, cpu::Rope), and bit for bit against the kernels it stands for
// (RmsNorm and Rope in place, then the row scatter) on the same inputs, for ranks up to 512. Page
// rows no token goes to must come back untouched. The optional query part (q_pe of every head,
// in place or into separate rows) bit for bit against the Rope kernel. Launched beside a long
// kernel ahead of it (beside_previous), the same results, and a kernel after it finds the one
// ahead complete (label gpu: SKIPPED without a GPU).
#include "kernels/norm_rope/latent_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "compute_nodes/backend/cpu/cpu_ops.h"
#include "compute_nodes/model/model_config.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/norm_rope/rms_norm.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/rope_test_config.h"
#include "tests/kernels/small_kernels_reference.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ErrorSummary;
using testing::FromBf16;
using testing::RoundBf16;
using testing::ToBf16;

struct Case {
  int tokens, rank, page_rows;
  model::RopeLayout layout;
  bool yarn;
  int q_heads = 0;
  bool q_out = false;   // the query vectors into separate rows (else in place)
  bool beside = false;  // launched beside a long kernel ahead of it (beside_previous)
};

// For the beside cases: a kernel ahead (a GEMV over 128 MB of weights in one wave of CTAs, tens of
// µs) writing g, the latent rows launched beside it, and a kernel after them that reads g: it
// must find g complete (poisoned until written: NaN). This is what PdlWaitBeforeExit promises by
// the programming model; on an H100 the check also passed with the wait removed (session 33), so
// there it guards the contract rather than catching that mutant.
class AheadAndAfter {
 public:
  static constexpr int kRows = 4096, kK = 16384, kOut = 64;
  AheadAndAfter()
      : w_(size_t{kRows} * kK * 2),
        x_(size_t{kK} * 2),
        g_(size_t{kRows} * 2),
        w2_(size_t{kOut} * kRows * 2),
        h_(size_t{kOut} * 4),
        h_ref_(size_t{kOut} * 4) {
    (void)cudaMemset(w_.get(), 0x3c, size_t{kRows} * kK * 2);  // bf16 0x3c3c, ~0.0115
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint16_t> x(kK), w2(size_t{kOut} * kRows);
    for (uint16_t& v : x) v = ToBf16(normal(rng));
    for (uint16_t& v : w2) v = ToBf16(normal(rng));
    (void)cudaMemcpy(x_.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    (void)cudaMemcpy(w2_.get(), w2.data(), w2.size() * 2, cudaMemcpyHostToDevice);
  }
  absl::Status Ahead(cudaStream_t s) {  // g = W x
    return LaunchSkinnyGemm(Gemm(kRows, kK, x_.get<__nv_bfloat16>(), w_.get<__nv_bfloat16>(),
                                 g_.get<__nv_bfloat16>(), nullptr),
                            s);
  }
  absl::Status After(cudaStream_t s, bool reference) {  // h = W2 g
    return LaunchSkinnyGemm(Gemm(kOut, kRows, g_.get<__nv_bfloat16>(), w2_.get<__nv_bfloat16>(),
                                 nullptr, (reference ? h_ref_ : h_).get<float>()),
                            s);
  }
  // Whether the kernel after found g complete: h equals the same kernel's h over the finished g.
  void Check() {
    const auto h = h_.Download<float>(), want = h_ref_.Download<float>();
    int64_t finite = 0;
    for (float v : want) finite += std::isfinite(v);
    ASSERT_EQ(finite, kOut) << "the kernel ahead must leave a finite g";
    EXPECT_EQ(std::memcmp(h.data(), want.data(), h.size() * 4), 0)
        << "the kernel after the latent rows read g before the kernel ahead had finished it";
  }

 private:
  static SkinnyGemmParams Gemm(int n_out, int k, const __nv_bfloat16* x, const __nv_bfloat16* w,
                               __nv_bfloat16* out, float* out_f32) {
    SkinnyGemmParams g;
    g.tokens = 1;
    g.n_out = n_out;
    g.k = k;
    g.x = x;
    g.w = w;
    g.out = out;
    g.out_f32 = out_f32;
    return g;
  }
  DeviceBuffer w_, x_, g_, w2_, h_, h_ref_;
};

// The query rows as the engine lays them out: per head [nope 128 | pe 64], heads * 192 wide,
// inside a wider row (the fused q|kv_a projection's output); q_out rows as the MLA query rows
// ([heads][576], q_pe at lane 512).
constexpr int kQk = 192, kNope = 128, kOutHead = 576, kOutPe = 512;

class LatentRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  void Run(const Case& c) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << c.tokens << " rank=" << c.rank
                                      << " layout=" << static_cast<int>(c.layout));
    const model::ModelConfig config = testing::RopeTestConfig(c.yarn, c.layout);
    const cpu::Rope rope(config);
    const int dim = 64, row = c.rank + dim, ld_in = row + 8;  // padded input rows
    const float eps = 1e-6f;
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> in(static_cast<size_t>(c.tokens) * ld_in), w(c.rank);
    for (float& v : in) v = RoundBf16(normal(rng_) * 3.f);
    for (float& v : w) v = RoundBf16(1.f + 0.2f * normal(rng_));
    std::vector<int32_t> pos(c.tokens);
    std::uniform_int_distribution<int32_t> any_pos(0, 163839);
    for (int32_t& p : pos) p = any_pos(rng_);
    pos_ = pos;
    std::vector<int64_t> rows(c.page_rows);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng_);
    rows.resize(c.tokens);  // distinct destination rows, in random order

    // References: the normed latent (dense [tokens][rank]) and the rotated k_pe.
    std::vector<float> lat(static_cast<size_t>(c.tokens) * c.rank), h, want_lat;
    for (int t = 0; t < c.tokens; ++t) {
      std::copy_n(&in[static_cast<size_t>(t) * ld_in], c.rank,
                  &lat[static_cast<size_t>(t) * c.rank]);
    }
    RmsNormReference(lat, nullptr, w, c.tokens, c.rank, eps, h, want_lat);

    std::vector<uint16_t> in16(in.size()), w16(w.size());
    for (size_t i = 0; i < in.size(); ++i) in16[i] = ToBf16(in[i]);
    for (size_t i = 0; i < w.size(); ++i) w16[i] = ToBf16(w[i]);
    std::vector<uint16_t> pages(static_cast<size_t>(c.page_rows) * row);
    for (uint16_t& v : pages) v = ToBf16(normal(rng_));
    DeviceBuffer din(in16), dw(w16), dpos(pos), drows(rows), dfreq(rope.inv_freq()), dpages(pages);

    LatentRowsParams p;
    p.num_tokens = c.tokens;
    p.rank = c.rank;
    p.rope_dim = dim;
    p.eps = eps;
    p.in = din.get<__nv_bfloat16>();
    p.ld_in = ld_in;
    p.norm_weight = dw.get<__nv_bfloat16>();
    p.layout = static_cast<RopeLanes>(static_cast<int>(c.layout));
    p.attention_factor = static_cast<float>(config.RopeAttentionFactor());
    p.positions = dpos.get<int32_t>();
    p.inv_freq = dfreq.get<float>();
    p.out = dpages.get<__nv_bfloat16>();
    p.ld_out = row;
    p.out_rows = drows.get<int64_t>();
    // The query part: random rows, and poisoned output rows when out of place.
    const int64_t q_ld = static_cast<int64_t>(c.q_heads) * kQk + 576;
    const int64_t qo_ld = static_cast<int64_t>(c.q_heads) * kOutHead;
    std::vector<uint16_t> q16(static_cast<size_t>(c.tokens) * q_ld);
    for (uint16_t& v : q16) v = ToBf16(normal(rng_));
    std::vector<uint16_t> qo16(c.q_out ? static_cast<size_t>(c.tokens) * qo_ld : 1, 0x7fc1);
    DeviceBuffer dq(q16), dqo(qo16);
    if (c.q_heads > 0) {
      p.q_heads = c.q_heads;
      p.q = dq.get<__nv_bfloat16>() + kNope;
      p.q_token_stride = q_ld;
      p.q_head_stride = kQk;
      if (c.q_out) {
        p.q_out = dqo.get<__nv_bfloat16>() + kOutPe;
        p.q_out_token_stride = qo_ld;
        p.q_out_head_stride = kOutHead;
      }
    }
    if (c.beside) {
      AheadAndAfter around;
      cudaStream_t stream;
      ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      p.beside_previous = true;
      absl::Status st = around.Ahead(stream);
      if (st.ok()) st = LaunchLatentRows(p, stream);
      if (st.ok()) st = around.After(stream, /*reference=*/false);
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_TRUE(around.After(stream, /*reference=*/true).ok());
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
      ASSERT_CUDA_OK(cudaStreamDestroy(stream));
      around.Check();
    } else {
      const absl::Status st = LaunchLatentRows(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(din.Download<uint16_t>(), in16) << "the input rows must only be read";
    const auto got = dpages.Download<uint16_t>();

    // The three kernels it replaces, on a copy of the input.
    DeviceBuffer dsplit(in16);
    RmsNormParams np;
    np.rows = c.tokens;
    np.dim = c.rank;
    np.eps = eps;
    np.x = dsplit.get<__nv_bfloat16>();
    np.ld_x = ld_in;
    np.weight = dw.get<__nv_bfloat16>();
    np.out = dsplit.get<__nv_bfloat16>();
    np.ld_out = ld_in;
    ASSERT_TRUE(LaunchRmsNorm(np, nullptr).ok());
    RopeParams rp;
    rp.num_tokens = c.tokens;
    rp.num_heads = 1;
    rp.rope_dim = dim;
    rp.layout = p.layout;
    rp.attention_factor = p.attention_factor;
    rp.x = dsplit.get<__nv_bfloat16>() + c.rank;
    rp.token_stride = ld_in;
    rp.head_stride = dim;
    rp.positions = p.positions;
    rp.inv_freq = p.inv_freq;
    ASSERT_TRUE(LaunchRope(rp, nullptr).ok());
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto split = dsplit.Download<uint16_t>();

    // Up to one 16-byte chunk per norm thread both kernels sum the squares in the same order;
    // wider ranks reassociate the sum (a last-bit difference in 1/rms may flip a rounding).
    const bool bit_exact = c.rank <= 512;
    std::vector<int> token_of(c.page_rows, -1);
    for (int t = 0; t < c.tokens; ++t) token_of[rows[t]] = t;
    ErrorSummary err;
    int64_t untouched_changed = 0, over = 0, split_mismatch = 0;
    for (int r = 0; r < c.page_rows; ++r) {
      const int t = token_of[r];
      for (int i = 0; i < row; ++i) {
        const size_t gi = static_cast<size_t>(r) * row + i;
        if (t < 0) {
          if (got[gi] != pages[gi]) ++untouched_changed;
          continue;
        }
        if (bit_exact && got[gi] != split[static_cast<size_t>(t) * ld_in + i]) ++split_mismatch;
        const float g = FromBf16(got[gi]);
        float want;
        if (i < c.rank) {
          want = want_lat[static_cast<size_t>(t) * c.rank + i];
        } else {
          float v[64];
          for (int j = 0; j < dim; ++j) v[j] = in[static_cast<size_t>(t) * ld_in + c.rank + j];
          rope.Apply(v, pos[t]);
          want = RoundBf16(v[i - c.rank]);
        }
        err.Add(g, want);
        if (!(std::abs(g - want) <= std::abs(want) * 0x1p-6f + 1e-4f)) ++over;
      }
    }
    EXPECT_EQ(err.non_finite, 0);
    EXPECT_EQ(untouched_changed, 0);
    EXPECT_EQ(over, 0);
    EXPECT_EQ(split_mismatch, 0) << "must equal RmsNorm + Rope bit for bit";
    EXPECT_LT(err.Rel(), 2e-3);
    std::printf("latent_rows tokens=%d rank=%d layout=%d rel_err=%.2e max_abs=%.2e\n", c.tokens,
                c.rank, static_cast<int>(c.layout), err.Rel(), err.max_abs);
    if (c.q_heads > 0) CheckQuery(c, p, q16, qo16, dq, dqo);
  }

  // The query vectors against the Rope kernel on a copy of the query rows (the same warp routine:
  // bit for bit) and against cpu::Rope; every other lane of both buffers unchanged.
  void CheckQuery(const Case& c, const LatentRowsParams& p, const std::vector<uint16_t>& q16,
                  const std::vector<uint16_t>& qo16, const DeviceBuffer& dq,
                  const DeviceBuffer& dqo) {
    DeviceBuffer dref(q16);
    RopeParams rp;
    rp.num_tokens = c.tokens;
    rp.num_heads = c.q_heads;
    rp.rope_dim = p.rope_dim;
    rp.layout = p.layout;
    rp.attention_factor = p.attention_factor;
    rp.x = dref.get<__nv_bfloat16>() + kNope;
    rp.token_stride = p.q_token_stride;
    rp.head_stride = kQk;
    rp.positions = p.positions;
    rp.inv_freq = p.inv_freq;
    ASSERT_TRUE(LaunchRope(rp, nullptr).ok());
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto want = dref.Download<uint16_t>();  // roped in place
    const auto got_q = dq.Download<uint16_t>();
    const auto got_o = dqo.Download<uint16_t>();
    int64_t rotated = 0, mismatch = 0, stray = 0;
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.q_heads; ++h) {
        for (int i = 0; i < p.rope_dim; ++i) {
          const size_t qi = static_cast<size_t>(t) * p.q_token_stride + h * kQk + kNope + i;
          const uint16_t g =
              c.q_out
                  ? got_o[static_cast<size_t>(t) * p.q_out_token_stride + h * kOutHead + kOutPe + i]
                  : got_q[qi];
          if (g != want[qi]) ++mismatch;
          if (g != q16[qi]) ++rotated;
        }
      }
    }
    // Outside the rotated lanes: q untouched when out of place, everything but them when in place.
    for (size_t i = 0; i < q16.size(); ++i) {
      const bool pe_lane = !c.q_out && want[i] != q16[i];
      if (!pe_lane && got_q[i] != q16[i]) ++stray;
    }
    if (c.q_out) {
      for (int t = 0; t < c.tokens; ++t) {
        for (int64_t j = 0; j < p.q_out_token_stride; ++j) {
          const int64_t lane = j % kOutHead;
          if (lane >= kOutPe && lane < kOutPe + p.rope_dim) continue;
          if (got_o[static_cast<size_t>(t) * p.q_out_token_stride + j] != qo16[0]) ++stray;
        }
      }
    }
    EXPECT_EQ(mismatch, 0) << "query vectors must equal the Rope kernel's bit for bit";
    EXPECT_EQ(stray, 0) << "lanes outside the query vectors changed";
    EXPECT_GT(rotated, 0) << "the query vectors were not roped";
    // Every vector against the CPU reference too (the Rope kernel shares the warp routine).
    const model::ModelConfig config = testing::RopeTestConfig(c.yarn, c.layout);
    const cpu::Rope rope(config);
    int64_t off = 0;
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.q_heads; ++h) {
        const size_t qi = static_cast<size_t>(t) * p.q_token_stride + h * kQk + kNope;
        float v[64];
        for (int j = 0; j < p.rope_dim; ++j) v[j] = FromBf16(q16[qi + j]);
        rope.Apply(v, pos_[t]);
        for (int j = 0; j < p.rope_dim; ++j) {
          const float g = FromBf16(
              c.q_out
                  ? got_o[static_cast<size_t>(t) * p.q_out_token_stride + h * kOutHead + kOutPe + j]
                  : got_q[qi + j]);
          const float want = RoundBf16(v[j]);
          if (!(std::abs(g - want) <= std::abs(want) * 0x1p-6f + 1e-4f)) ++off;
        }
      }
    }
    EXPECT_EQ(off, 0) << "query lanes off the CPU reference";
  }
  std::vector<int32_t> pos_;
};

TEST_F(LatentRowsTest, MatchesReferencesAndTheUnfusedKernels) {
  const std::vector<Case> cases = {
      {1, 512, 64, model::RopeLayout::kDeinterleaved, true},              // decode batch 1
      {1, 512, 64, model::RopeLayout::kDeinterleaved, true, 16, true},    // + v2-lite queries
      {16, 512, 300, model::RopeLayout::kInterleaved, false},             // V2 lanes
      {16, 512, 300, model::RopeLayout::kInterleaved, false, 128, true},  // v3 heads
      {257, 512, 1024, model::RopeLayout::kHalves, true, 16, false},      // a prefill chunk
      {5, 2048, 40, model::RopeLayout::kDeinterleaved, true, 4, false},   // widest rank: 4 turns
      {3, 8, 9, model::RopeLayout::kDeinterleaved, false, 1, true},       // tiny rank
      // Beside a long kernel ahead (the decode step's order: q·W_UK, then these rows).
      {1, 512, 64, model::RopeLayout::kDeinterleaved, true, 16, true, true},
      {16, 512, 300, model::RopeLayout::kInterleaved, false, 128, true, true},
  };
  for (const Case& c : cases) Run(c);
}

}  // namespace
}  // namespace strata::kernels
