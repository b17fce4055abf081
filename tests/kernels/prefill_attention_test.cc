// Prefill attention kernel against the double-precision CPU reference on fresh random inputs
// (label gpu: SKIPPED without a GPU): causal and not, ragged q/k lengths (1, tile edges, a prefix,
// k_len < q_len, empty sequences), padded strides, and the chunked-prefix path (prefix chunks
// merged by log-sum-exp, then the new tokens causally) against one full causal pass. Outputs are
// poisoned (NaN) before the first launch; rows that see no key must read 0 and lse -inf.
#include "kernels/prefill_attention/prefill_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/prefill_attention_reference.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;
using testing::ErrorSummary;
using testing::FromBf16;
using testing::ToBf16;

constexpr int kQk = kPrefillQkDim, kV = kPrefillVDim;

struct Seq {
  int prefix;  // cached tokens before the new ones
  int len;     // new tokens (query rows)
};

// Host tensors of one problem, bf16 values held as float: q [new][H][192], k [all][H][192],
// v [all][H][128] per sequence (dense, per-sequence vectors).
struct Problem {
  int heads;
  std::vector<Seq> seqs;
  std::vector<std::vector<float>> q, k, v;
};

Problem MakeProblem(std::mt19937& rng, int heads, std::vector<Seq> seqs) {
  Problem pr{heads, std::move(seqs), {}, {}, {}};
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<float> x(n);
    for (float& f : x) f = FromBf16(ToBf16(normal(rng)));
    return x;
  };
  for (const Seq& s : pr.seqs) {
    const size_t total = static_cast<size_t>(s.prefix + s.len);
    pr.q.push_back(fill(static_cast<size_t>(s.len) * heads * kQk));
    pr.k.push_back(fill(total * heads * kQk));
    pr.v.push_back(fill(total * heads * kV));
  }
  return pr;
}

// Packs rows [begin, begin + count) of every sequence's tensor (row width `width` per head) into
// one bf16 buffer at (token_stride, head_stride); returns it and fills cu (rows per sequence).
std::vector<uint16_t> Pack(const Problem& pr, const std::vector<std::vector<float>>& t, int width,
                           const std::vector<int>& begin, const std::vector<int>& count,
                           int token_stride, int head_stride, std::vector<int32_t>& cu) {
  cu.assign(1, 0);
  for (int c : count) cu.push_back(cu.back() + c);
  std::vector<uint16_t> out(static_cast<size_t>(std::max(cu.back(), 1)) * token_stride, 0xffff);
  for (size_t s = 0; s < pr.seqs.size(); ++s) {
    for (int r = 0; r < count[s]; ++r) {
      for (int h = 0; h < pr.heads; ++h) {
        const float* src = t[s].data() + (static_cast<size_t>(begin[s] + r) * pr.heads + h) * width;
        uint16_t* dst =
            out.data() + static_cast<size_t>(cu[s] + r) * token_stride + h * head_stride;
        for (int d = 0; d < width; ++d) dst[d] = ToBf16(src[d]);
      }
    }
  }
  return out;
}

class PrefillAttentionTest : public ::testing::TestWithParam<int> {  // param: kernel variant
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};

  // Launches over k rows [k_begin, k_begin + k_count) of each sequence, q = all new rows.
  void Launch(const Problem& pr, const std::vector<int>& k_begin, const std::vector<int>& k_count,
              bool causal, bool accumulate, float scale, DeviceBuffer& out, DeviceBuffer& lse) {
    const int n = static_cast<int>(pr.seqs.size()), H = pr.heads;
    std::vector<int> q_begin(n, 0), q_count(n);
    int max_q = 0;
    for (int s = 0; s < n; ++s) {
      q_count[s] = pr.seqs[s].len;
      max_q = std::max(max_q, q_count[s]);
    }
    std::vector<int32_t> cu_q, cu_k, cu_tmp;
    // Padded strides: k heads 200 apart, v rows padded by 16 elements.
    const auto q16 = Pack(pr, pr.q, kQk, q_begin, q_count, H * kQk, kQk, cu_q);
    const auto k16 = Pack(pr, pr.k, kQk, k_begin, k_count, H * 200, 200, cu_k);
    const auto v16 = Pack(pr, pr.v, kV, k_begin, k_count, H * kV + 16, kV, cu_tmp);
    DeviceBuffer dq(q16), dk(k16), dv(v16), dcq(cu_q), dck(cu_k);
    PrefillAttentionParams p;
    p.batch = n;
    p.num_heads = H;
    p.max_seqlen_q = max_q;
    p.causal = causal;
    p.accumulate = accumulate;
    p.softmax_scale = scale;
    p.cu_seqlens_q = dcq.get<int32_t>();
    p.cu_seqlens_k = dck.get<int32_t>();
    p.q = dq.get<__nv_bfloat16>();
    p.q_token_stride = H * kQk;
    p.q_head_stride = kQk;
    p.k = dk.get<__nv_bfloat16>();
    p.k_token_stride = H * 200;
    p.k_head_stride = 200;
    p.v = dv.get<__nv_bfloat16>();
    p.v_token_stride = H * kV + 16;
    p.v_head_stride = kV;
    p.out = out.get<__nv_bfloat16>();
    p.out_token_stride = H * kV;
    p.out_head_stride = kV;
    p.lse = lse.get<float>();
    p.total_k = cu_k.back();
    const absl::Status st = LaunchPrefillAttentionVariant(p, GetParam(), nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
  }

  // Compares out/lse with the reference over k rows [0, prefix + len) of every sequence.
  void Check(const Problem& pr, bool causal, float scale, const DeviceBuffer& out,
             const DeviceBuffer& lse, const char* what) {
    const auto out16 = out.Download<uint16_t>();
    const auto lse_got = lse.Download<float>();
    const int H = pr.heads;
    int row0 = 0;
    double worst_rel = 0, worst_lse = 0;
    for (size_t s = 0; s < pr.seqs.size(); ++s) {
      const Seq& sq = pr.seqs[s];
      const int k_len = sq.prefix + sq.len;
      for (int h = 0; h < H; ++h) {
        std::vector<double> ref, ref_lse;
        PrefillAttentionReference(pr.q[s].data() + h * kQk, H * kQk, pr.k[s].data() + h * kQk,
                                  H * kQk, pr.v[s].data() + h * kV, H * kV, sq.len, k_len, causal,
                                  scale, ref, ref_lse);
        ErrorSummary err;
        int bad_empty = 0, non_finite_lse = 0;
        double lse_err = 0;
        for (int i = 0; i < sq.len; ++i) {
          const size_t row = static_cast<size_t>(row0 + i);
          const float got_lse = lse_got[row * H + h];
          for (int d = 0; d < kV; ++d) {
            err.Add(FromBf16(out16[row * H * kV + h * kV + d]),
                    ref[static_cast<size_t>(i) * kV + d]);
          }
          if (std::isinf(ref_lse[i])) {
            bool zero = true;
            for (int d = 0; d < kV; ++d) zero &= FromBf16(out16[row * H * kV + h * kV + d]) == 0.f;
            if (!(std::isinf(got_lse) && got_lse < 0) || !zero) ++bad_empty;
          } else if (!std::isfinite(got_lse)) {
            ++non_finite_lse;
          } else {
            lse_err = std::max(
                lse_err, std::abs(got_lse - ref_lse[i]) / std::max(1.0, std::abs(ref_lse[i])));
          }
        }
        EXPECT_EQ(err.non_finite, 0) << what << " seq " << s << " head " << h;
        EXPECT_EQ(bad_empty, 0) << what << " seq " << s << " head " << h;
        EXPECT_EQ(non_finite_lse, 0) << what << " seq " << s << " head " << h;
        EXPECT_LT(err.Rel(), 1e-2) << what << " seq " << s << " head " << h << " len " << sq.len;
        EXPECT_LT(lse_err, 1e-3) << what << " seq " << s << " head " << h;
        worst_rel = std::max(worst_rel, err.Rel());
        worst_lse = std::max(worst_lse, lse_err);
      }
      row0 += sq.len;
    }
    std::printf("prefill v%d %s heads=%d seqs=%zu causal=%d worst rel_err=%.2e lse_err=%.2e\n",
                GetParam(), what, H, pr.seqs.size(), causal, worst_rel, worst_lse);
  }

  void SinglePass(int heads, const std::vector<Seq>& seqs, bool causal) {
    const Problem pr = MakeProblem(rng_, heads, seqs);
    std::vector<int> kb(seqs.size(), 0), kc;
    int total_q = 0;
    for (const Seq& s : seqs) {
      kc.push_back(s.prefix + s.len);
      total_q += s.len;
    }
    DeviceBuffer out(static_cast<size_t>(std::max(total_q, 1)) * heads * kV * 2),
        lse(static_cast<size_t>(std::max(total_q, 1)) * heads * 4);
    const float scale = 0.1f;
    Launch(pr, kb, kc, causal, /*accumulate=*/false, scale, out, lse);
    Check(pr, causal, scale, out, lse, "single");
  }

  // Prefix in chunks of `chunk` keys (non-causal, merged), then the new tokens causally.
  void Chunked(int heads, const std::vector<Seq>& seqs, int chunk) {
    const Problem pr = MakeProblem(rng_, heads, seqs);
    int total_q = 0, max_prefix = 0;
    for (const Seq& s : seqs) {
      total_q += s.len;
      max_prefix = std::max(max_prefix, s.prefix);
    }
    DeviceBuffer out(static_cast<size_t>(std::max(total_q, 1)) * heads * kV * 2),
        lse(static_cast<size_t>(std::max(total_q, 1)) * heads * 4);
    const float scale = 0.1f;
    const int n = static_cast<int>(seqs.size());
    int launches = 0;
    for (int c0 = 0; c0 < max_prefix; c0 += chunk) {
      std::vector<int> kb(n), kc(n);
      for (int s = 0; s < n; ++s) {
        kb[s] = std::min(c0, seqs[s].prefix);
        kc[s] = std::clamp(seqs[s].prefix - c0, 0, chunk);
      }
      Launch(pr, kb, kc, /*causal=*/false, /*accumulate=*/launches > 0, scale, out, lse);
      ++launches;
    }
    std::vector<int> kb(n), kc(n);
    for (int s = 0; s < n; ++s) {
      kb[s] = seqs[s].prefix;
      kc[s] = seqs[s].len;
    }
    Launch(pr, kb, kc, /*causal=*/true, /*accumulate=*/launches > 0, scale, out, lse);
    Check(pr, /*causal=*/true, scale, out, lse, "chunked");
  }
};

const std::vector<Seq> kRagged = {{0, 1},   {0, 17},   {0, 128}, {71, 129},
                                  {0, 300}, {333, 64}, {0, 0},   {5, 255}};

TEST_P(PrefillAttentionTest, CausalRagged) { SinglePass(3, kRagged, true); }

TEST_P(PrefillAttentionTest, NonCausalRagged) { SinglePass(2, kRagged, false); }

TEST_P(PrefillAttentionTest, CausalLongAndManyHeads) {
  SinglePass(2, {{0, 1000}, {24, 777}}, true);
  SinglePass(16, {{0, 130}, {64, 64}}, true);
}

TEST_P(PrefillAttentionTest, RowsThatSeeNoKeyGiveZeroAndMinusInf) {
  // k_len < q_len: with bottom-right alignment the first q_len - k_len rows see nothing.
  const Problem pr = MakeProblem(rng_, 2, {{0, 10}});
  DeviceBuffer out(10 * 2 * kV * 2), lse(10 * 2 * 4);
  Launch(pr, {0}, {4}, /*causal=*/true, /*accumulate=*/false, 0.1f, out, lse);
  const auto lse_got = lse.Download<float>();
  const auto out16 = out.Download<uint16_t>();
  for (int i = 0; i < 6; ++i) {
    for (int h = 0; h < 2; ++h) {
      EXPECT_TRUE(std::isinf(lse_got[i * 2 + h]) && lse_got[i * 2 + h] < 0) << "row " << i;
      for (int d = 0; d < kV; ++d) EXPECT_EQ(FromBf16(out16[(i * 2 + h) * kV + d]), 0.f);
    }
  }
  for (int i = 6; i < 10; ++i) EXPECT_TRUE(std::isfinite(lse_got[i * 2])) << "row " << i;
}

TEST_P(PrefillAttentionTest, ChunkedPrefixMergedByLse) {
  Chunked(3, {{700, 50}, {100, 129}, {0, 64}, {256, 1}, {513, 300}}, 256);
  Chunked(2, {{64, 64}, {1, 1}}, 64);
}

INSTANTIATE_TEST_SUITE_P(Variants, PrefillAttentionTest,
                         ::testing::Range(0, kPrefillAttentionVariants));

}  // namespace
}  // namespace strata::kernels
