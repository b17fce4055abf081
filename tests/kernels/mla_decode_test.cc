// MLA decode kernel against the fp32 CPU reference, on fresh random inputs (label gpu: reports
// SKIPPED without a GPU). Outputs and workspace are poisoned with NaN before every launch, pages
// not owned by a sequence and tokens past its length are NaN too, so an unwritten output or a
// read past the sequence fails the check.
#include "kernels/mla_decode/mla_decode.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/block_format.h"
#include "kernels/moe_experts/moe_experts.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/mla_decode_reference.h"

namespace strata::kernels {
namespace {

constexpr int kD = kMlaQkHeadDim, kV = kMlaValueDim, kPage = kMlaPageSize;

using testing::FromBf16;
using testing::HaveGpu;
using testing::ToBf16;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct Case {
  int num_heads_q;
  std::vector<int> seqlens;
  int num_splits;    // 0: MlaDecodeNumSplits
  bool fp8 = false;  // the cache in fp8 pages; checked against the bf16 kernel too
  MlaDecodeImpl impl = MlaDecodeImpl::kAuto;
  // Tokens whose latent rows are scaled by loud_scale in every sequence that reaches them: their
  // scores stand far above (or below) the rest, so a row's running maximum jumps late in the
  // sequence.
  std::vector<int> loud_tokens = {};
  float loud_scale = 8.f;
  // The newest row of every sequence (all of the same length mod 64, none empty, bf16) is written
  // by a long GEMM launched just ahead of the attention, which runs with fresh_rows = 1 and
  // programmatic launch: it must load that row only after its wait (poisoned until written).
  bool fresh_ahead = false;
};

// The kernel ahead for fresh_ahead: a skinny GEMM over ~75 MB of weights (tens of µs, 36 CTAs,
// so the attention's blocks start beside it) whose output row t lands on sequence t's newest row
// (every such row at one stride: the last pages consecutive, the same offset in each).
class FreshRowsAhead {
 public:
  static constexpr int kK = 65536;
  FreshRowsAhead(int rows, uint32_t seed)
      : rows_(rows), w_(size_t{kD} * kK * 2), x_(static_cast<size_t>(rows) * kK * 2) {
    cudaError_t e = cudaMemset(w_.get(), 0x3c, size_t{kD} * kK * 2);  // bf16 0x3c3c, ~0.0115
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 0.3f);
    std::vector<uint16_t> x(static_cast<size_t>(rows) * kK);
    for (uint16_t& v : x) v = ToBf16(normal(rng));
    if (e == cudaSuccess) e = cudaMemcpy(x_.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    init_ = e;
  }
  absl::Status Launch(__nv_bfloat16* first_row, cudaStream_t stream) {
    if (init_ != cudaSuccess) return absl::InternalError(cudaGetErrorString(init_));
    SkinnyGemmParams g;
    g.tokens = rows_;
    g.n_out = kD;
    g.k = kK;
    g.x = x_.get<__nv_bfloat16>();
    g.w = w_.get<__nv_bfloat16>();
    g.out = first_row;
    g.ld_out = int64_t{kPage} * kD;
    return LaunchSkinnyGemm(g, stream);
  }

 private:
  int rows_;
  testing::DeviceBuffer w_, x_;
  cudaError_t init_ = cudaSuccess;
};

void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "h_q=" << c.num_heads_q << " splits=" << c.num_splits << " fp8=" << c.fp8
               << " impl=" << static_cast<int>(c.impl) << " seed=" << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int batch = static_cast<int>(c.seqlens.size());
  const int h_q = c.num_heads_q;
  int max_pages = 1, total_pages = 0, max_len = 1;
  for (int len : c.seqlens) {
    const int pages = std::max(1, (len + kPage - 1) / kPage);
    max_pages = std::max(max_pages, pages);
    total_pages += pages;
    max_len = std::max(max_len, len);
  }
  const int num_pages = total_pages + 3;  // a few pages nobody owns
  const float nan = std::numeric_limits<float>::quiet_NaN();

  std::vector<float> q(static_cast<size_t>(batch) * h_q * kD);
  for (float& x : q) x = FromBf16(ToBf16(normal(rng)));
  std::vector<float> kv(static_cast<size_t>(num_pages) * kPage * kD, nan);
  // fresh_ahead: sequence b's last page is first_last + b; the other pages in random order.
  const int first_last = total_pages - batch;
  std::vector<int32_t> perm;
  for (int page = 0; page < num_pages; ++page) {
    if (!c.fresh_ahead || page < first_last || page >= total_pages) perm.push_back(page);
  }
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(batch) * max_pages, 0);
  // fp8 pages (the block format's fp8 layer layout), NaN wherever no token was written.
  std::vector<uint8_t> fp8(c.fp8 ? static_cast<size_t>(num_pages) * kMlaFp8PageBytes : 0, 0xff);
  int next = 0;
  for (int b = 0; b < batch; ++b) {
    const int len = c.seqlens[b];
    for (int i = 0; i * kPage < len; ++i) {
      const bool last = (i + 1) * kPage >= len;
      const int page = c.fresh_ahead && last ? first_last + b : perm[next++];
      table[static_cast<size_t>(b) * max_pages + i] = page;
      for (int t = 0; t < kPage && i * kPage + t < len; ++t) {
        float* row = kv.data() + (static_cast<size_t>(page) * kPage + t) * kD;
        const int token = i * kPage + t;
        const bool loud =
            std::find(c.loud_tokens.begin(), c.loud_tokens.end(), token) != c.loud_tokens.end();
        for (int d = 0; d < kD; ++d) {
          row[d] = FromBf16(ToBf16((loud ? c.loud_scale : 1.f) * normal(rng)));
        }
        if (c.fp8) {  // the latent becomes what the fp8 page holds: bf16(e4m3 x scale)
          uint8_t* base = fp8.data() + static_cast<size_t>(page) * kMlaFp8PageBytes;
          std::vector<float> scales(kV / 128), deq(kV);
          ASSERT_TRUE(
              QuantizeFp8E4M3({row, static_cast<size_t>(kV)}, {base + t * kV, size_t{kV}}, scales)
                  .ok());
          std::memcpy(base + kPage * kV + t * 16, scales.data(), 16);
          DequantizeFp8E4M3({base + t * kV, size_t{kV}}, scales, deq);
          for (int d = 0; d < kV; ++d) row[d] = FromBf16(ToBf16(deq[d]));
          for (int d = kV; d < kD; ++d) {
            const uint16_t h = ToBf16(row[d]);
            std::memcpy(base + kPage * (kV + 16) + t * 128 + (d - kV) * 2, &h, 2);
          }
        }
      }
    }
  }
  const float scale = 0.1f;

  MlaDecodeParams p;
  p.batch = batch;
  p.num_heads_q = h_q;
  p.num_pages = num_pages;
  p.max_pages_per_seq = max_pages;
  p.softmax_scale = scale;
  int num_sms = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  p.num_splits = c.num_splits > 0 ? c.num_splits : MlaDecodeNumSplits(batch, h_q, max_len, num_sms);

  std::vector<uint16_t> q16(q.size()), kv16(kv.size());
  for (size_t i = 0; i < q.size(); ++i) q16[i] = ToBf16(q[i]);
  for (size_t i = 0; i < kv.size(); ++i) kv16[i] = ToBf16(kv[i]);
  // fresh_ahead: where the newest rows are (NaN until the GEMM ahead writes them).
  const size_t fresh_row0 =
      c.fresh_ahead ? (static_cast<size_t>(first_last) * kPage + (c.seqlens[0] - 1) % kPage) * kD
                    : 0;
  if (c.fresh_ahead) {
    for (int b = 0; b < batch; ++b) {
      ASSERT_TRUE(c.seqlens[b] > 0 && (c.seqlens[b] - c.seqlens[0]) % kPage == 0 && !c.fp8);
      std::fill_n(kv16.begin() + fresh_row0 + size_t{kPage} * kD * b, kD, uint16_t{0x7fc1});
    }
    p.fresh_rows = 1;
  }
  // Runs the kernel on the bf16 cache or on the fp8 pages; fills out16 and lse.
  const size_t out_elems = static_cast<size_t>(batch) * h_q * kV;
  std::vector<uint16_t> out16(out_elems);
  std::vector<float> lse(static_cast<size_t>(batch) * h_q);
  auto launch = [&](MlaKvDtype dtype, MlaDecodeImpl impl) {
    void *dq, *dkv, *dtable, *dlens, *dout, *dlse, *dws = nullptr;
    const bool f8 = dtype == MlaKvDtype::kFp8E4M3;
    const size_t kv_bytes = f8 ? fp8.size() : kv16.size() * 2;
    ASSERT_CUDA(cudaMalloc(&dq, q16.size() * 2));
    ASSERT_CUDA(cudaMalloc(&dkv, kv_bytes));
    ASSERT_CUDA(cudaMalloc(&dtable, table.size() * 4));
    ASSERT_CUDA(cudaMalloc(&dlens, batch * 4));
    ASSERT_CUDA(cudaMalloc(&dout, out_elems * 2));
    ASSERT_CUDA(cudaMalloc(&dlse, static_cast<size_t>(batch) * h_q * 4));
    const size_t ws_bytes = MlaDecodeWorkspaceBytes(batch, h_q, p.num_splits);
    if (ws_bytes > 0) {
      ASSERT_CUDA(cudaMalloc(&dws, ws_bytes));
      ASSERT_CUDA(cudaMemset(dws, 0xff, ws_bytes));  // NaN
    }
    ASSERT_CUDA(cudaMemcpy(dq, q16.data(), q16.size() * 2, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(dkv, f8 ? static_cast<const void*>(fp8.data()) : kv16.data(), kv_bytes,
                           cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(dlens, c.seqlens.data(), batch * 4, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(dout, 0xff, out_elems * 2));  // bf16 NaN
    ASSERT_CUDA(cudaMemset(dlse, 0xff, static_cast<size_t>(batch) * h_q * 4));
    p.q = static_cast<const __nv_bfloat16*>(dq);
    p.kv_dtype = dtype;
    p.impl = impl;
    p.kv_cache = f8 ? nullptr : static_cast<const __nv_bfloat16*>(dkv);
    p.kv_cache_fp8 = f8 ? static_cast<const uint8_t*>(dkv) : nullptr;
    p.block_table = static_cast<const int32_t*>(dtable);
    p.seqlens = static_cast<const int32_t*>(dlens);
    p.out = static_cast<__nv_bfloat16*>(dout);
    p.lse = static_cast<float*>(dlse);
    MlaDecodeSetWorkspace(p, dws);
    if (c.fresh_ahead) {
      FreshRowsAhead ahead(batch, seed);
      cudaStream_t stream;
      ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      absl::Status st = ahead.Launch(static_cast<__nv_bfloat16*>(dkv) + fresh_row0, stream);
      if (st.ok()) st = LaunchMlaDecode(p, stream);
      ASSERT_CUDA(cudaStreamSynchronize(stream));
      ASSERT_CUDA(cudaStreamDestroy(stream));
      ASSERT_TRUE(st.ok()) << st;
      // The reference takes the rows the GEMM wrote.
      for (int b = 0; b < batch; ++b) {
        const size_t at = fresh_row0 + size_t{kPage} * kD * b;
        ASSERT_CUDA(cudaMemcpy(kv16.data() + at, static_cast<const uint16_t*>(dkv) + at, kD * 2,
                               cudaMemcpyDeviceToHost));
        for (int d = 0; d < kD; ++d) kv[at + d] = FromBf16(kv16[at + d]);
      }
    } else {
      const absl::Status st = LaunchMlaDecode(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_CUDA(cudaMemcpy(out16.data(), dout, out_elems * 2, cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    for (void* ptr : {dq, dkv, dtable, dlens, dout, dlse, dws}) {
      if (ptr != nullptr) {
        ASSERT_CUDA(cudaFree(ptr));
      }
    }
  };
  if (c.fp8) {
    // The fp8 kernel must give exactly what the bf16 kernel of the same structure (mma.sync)
    // gives on the dequantized cache.
    launch(MlaKvDtype::kBf16, MlaDecodeImpl::kMmaSync);
    if (::testing::Test::HasFatalFailure()) return;
    const std::vector<uint16_t> bf16_out = out16;
    const std::vector<float> bf16_lse = lse;
    launch(MlaKvDtype::kFp8E4M3, c.impl);
    if (::testing::Test::HasFatalFailure()) return;
    size_t differ = 0;
    for (size_t i = 0; i < out16.size(); ++i) differ += out16[i] != bf16_out[i];
    for (size_t i = 0; i < lse.size(); ++i) {
      differ += std::memcmp(&lse[i], &bf16_lse[i], 4) != 0;
    }
    EXPECT_EQ(differ, 0u) << "fp8 pages vs the bf16 kernel on the dequantized cache";
  } else {
    launch(MlaKvDtype::kBf16, c.impl);
    if (::testing::Test::HasFatalFailure()) return;
  }

  std::vector<float> ref_out, ref_lse;
  MlaDecodeReferenceInputs in{batch, h_q, max_pages, scale, &q, &kv, &table, &c.seqlens};
  MlaDecodeReference(in, ref_out, ref_lse);

  for (int b = 0; b < batch; ++b) {
    double err2 = 0, ref2 = 0, lse_err = 0;
    int non_finite = 0;
    for (int h = 0; h < h_q; ++h) {
      const size_t row = static_cast<size_t>(b) * h_q + h;
      for (int d = 0; d < kV; ++d) {
        const float got = FromBf16(out16[row * kV + d]);
        const float want = ref_out[row * kV + d];
        if (!std::isfinite(got)) ++non_finite;
        err2 += (got - want) * (got - want);
        ref2 += want * want;
      }
      if (c.seqlens[b] == 0) {
        EXPECT_TRUE(std::isinf(lse[row]) && lse[row] < 0) << "b=" << b << " lse=" << lse[row];
      } else {
        if (!std::isfinite(lse[row])) ++non_finite;
        lse_err = std::max(lse_err, std::abs(static_cast<double>(lse[row]) - ref_lse[row]) /
                                        std::max(1.0, std::abs(static_cast<double>(ref_lse[row]))));
      }
    }
    EXPECT_EQ(non_finite, 0) << "b=" << b << " len=" << c.seqlens[b];
    if (c.seqlens[b] == 0) {
      EXPECT_EQ(err2, 0.0) << "empty sequence must give zeros, b=" << b;
      continue;
    }
    const double rel = std::sqrt(err2 / ref2);
    EXPECT_LT(rel, 1e-2) << "b=" << b << " len=" << c.seqlens[b];
    EXPECT_LT(lse_err, 1e-3) << "b=" << b << " len=" << c.seqlens[b];
    std::printf("h_q=%3d splits=%2d len=%5d rel_err=%.2e lse_err=%.2e\n", h_q, p.num_splits,
                c.seqlens[b], rel, lse_err);
  }
}

class MlaDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  uint32_t Seed() { return std::random_device{}(); }
};

const std::vector<int> kRagged = {1, 63, 64, 65, 1000, 1537};

TEST_F(MlaDecodeTest, Heads16Ragged) {
  RunCase({16, kRagged, 1}, Seed());
  RunCase({16, kRagged, 0}, Seed());
  RunCase({16, kRagged, 7}, Seed());
}

TEST_F(MlaDecodeTest, Heads64Ragged) {
  RunCase({64, kRagged, 1}, Seed());
  RunCase({64, kRagged, 0}, Seed());
  RunCase({64, {1, 63, 64, 65, 2049}, 64}, Seed());  // more splits than tiles: empty splits
}

TEST_F(MlaDecodeTest, Heads128Ragged) {
  RunCase({128, kRagged, 1}, Seed());
  RunCase({128, kRagged, 0}, Seed());
  RunCase({128, {4096, 33, 31}, 5}, Seed());
}

TEST_F(MlaDecodeTest, OtherHeadCounts) {
  RunCase({32, {100, 700}, 3}, Seed());
  RunCase({48, {100, 700}, 2}, Seed());
  RunCase({96, {129, 800}, 0}, Seed());
}

TEST_F(MlaDecodeTest, Fp8PagesEqualTheBf16KernelOnTheDequantizedCache) {
  RunCase({16, kRagged, 1, true}, Seed());
  RunCase({32, {100, 700}, 3, true}, Seed());
  RunCase({64, kRagged, 0, true}, Seed());
  RunCase({128, {4096, 33, 31}, 5, true}, Seed());
  RunCase({64, {0, 65, 0}, 4, true}, Seed());
}

TEST_F(MlaDecodeTest, EmptySequenceGivesZeroAndMinusInfLse) {
  RunCase({64, {0, 65, 0}, 1}, Seed());
  RunCase({64, {0, 65, 0}, 4}, Seed());
}

// kAuto takes a Hopper kernel for bf16 pages on an H200; every kernel is checked by name here, at
// every block shape (heads 16..128: the Hopper kernels fill 64-row blocks and drop the rest), with
// odd and even tile counts (the seesaw kernel takes tiles in pairs) and partial last tiles.
TEST_F(MlaDecodeTest, EveryKernelAtEveryHeadCount) {
  for (MlaDecodeImpl impl :
       {MlaDecodeImpl::kMmaSync, MlaDecodeImpl::kSm90, MlaDecodeImpl::kSm90Seesaw}) {
    if (impl != MlaDecodeImpl::kMmaSync && !MlaDecodeSm90Applies(MlaKvDtype::kBf16)) {
      GTEST_SKIP() << "not a compute capability 9.x device";
    }
    RunCase({16, kRagged, 1, false, impl}, Seed());
    RunCase({32, {100, 700, 64}, 3, false, impl}, Seed());
    RunCase({48, {1, 129, 2049}, 2, false, impl}, Seed());
    RunCase({64, kRagged, 1, false, impl}, Seed());
    RunCase({64, {1, 63, 64, 65, 2049}, 64, false, impl}, Seed());
    RunCase({96, {129, 800}, 0, false, impl}, Seed());
    RunCase({128, {4096, 33, 31, 127, 128, 129}, 3, false, impl}, Seed());
    RunCase({128, {0, 1, 700}, 0, false, impl}, Seed());
    RunCase({64, {64, 128, 192, 200, 4096 + 17}, 5, false, impl}, Seed());
  }
}

// A key far above the running maximum late in a sequence: the seesaw and transposed kernels keep
// a row's maximum until a tile's exceeds it by more than 2^8 and rescale O and the sum then, so
// both the kept and the moved maximum must match the reference; so must every other kernel. At
// 8x (scores ~8x the others', for about half the heads) the maximum jumps by up to ~2^70: a
// kernel that skipped O's rescale when it moves fails. At 64x it jumps by more than 2^128: a
// maximum that lagged without bound (P overflowing fp32) fails too. The first tile's maximum is
// an ordinary one, so only the late jump checks the rescale.
TEST_F(MlaDecodeTest, LoudKeysLateInTheSequence) {
  const bool hopper = MlaDecodeSm90Applies(MlaKvDtype::kBf16);
  const std::vector<int> loud = {70, 1500, 3000, 3001, 4095};
  for (MlaDecodeImpl impl :
       {MlaDecodeImpl::kMmaSync, MlaDecodeImpl::kSm90, MlaDecodeImpl::kSm90Seesaw}) {
    if (impl != MlaDecodeImpl::kMmaSync && !hopper) continue;
    for (float scale : {8.f, 64.f}) {
      RunCase({128, {4096, 1537, 3000}, 1, false, impl, loud, scale}, Seed());
      RunCase({64, {4096, 1537, 3001}, 3, false, impl, loud, scale}, Seed());
    }
  }
  if (!hopper) GTEST_SKIP() << "not a compute capability 9.x device: the Hopper kernels not run";
  for (int h_q : {16, 32}) {
    for (float scale : {8.f, 64.f}) {
      RunCase({h_q, {4096, 1537, 3000}, 1, false, MlaDecodeImpl::kSm90Transposed, loud, scale},
              Seed());
      RunCase({h_q, {4096, 3001}, 4, false, MlaDecodeImpl::kSm90Transposed, loud, scale}, Seed());
    }
  }
}

// The transposed Hopper kernel (h_q 16 and 32 only): ragged lengths, partial last tiles, empty
// sequences and splits, more tiles than its ring of boxes holds (long sequences wrap it many
// times), and every split path (direct store and partials + combine).
TEST_F(MlaDecodeTest, TransposedKernelAtSixteenAndThirtyTwoHeads) {
  if (!MlaDecodeSm90TransposedApplies(16, MlaKvDtype::kBf16)) {
    GTEST_SKIP() << "not a compute capability 9.x device";
  }
  for (int h_q : {16, 32}) {
    RunCase({h_q, kRagged, 1, false, MlaDecodeImpl::kSm90Transposed}, Seed());
    RunCase({h_q, kRagged, 0, false, MlaDecodeImpl::kSm90Transposed}, Seed());
    RunCase({h_q, {1, 63, 64, 65, 2049}, 64, false, MlaDecodeImpl::kSm90Transposed}, Seed());
    RunCase({h_q, {0, 65, 0}, 4, false, MlaDecodeImpl::kSm90Transposed}, Seed());
    RunCase({h_q, {4096 + 17, 127, 128, 129}, 3, false, MlaDecodeImpl::kSm90Transposed}, Seed());
    RunCase({h_q, {8192}, 1, false, MlaDecodeImpl::kSm90Transposed}, Seed());
  }
}

// kAuto on a Hopper device: at h_q 16 the mma.sync kernel for a few-row call (batch x pages up
// to the SM count), the transposed one past it; from 64 heads the seesaw kernel, except for a
// few-row call; the few-row calls of a decode step (batch 1 and 4, ~1K tokens, split as the
// engine splits them) against the reference.
TEST_F(MlaDecodeTest, FewRowCallsTakeTheMmaSyncKernel) {
  if (!MlaDecodeSm90Applies(MlaKvDtype::kBf16)) {
    GTEST_SKIP() << "not a compute capability 9.x device";
  }
  int num_sms = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  EXPECT_EQ(MlaDecodeAutoImpl(1, 16, 17, num_sms, MlaKvDtype::kBf16), MlaDecodeImpl::kMmaSync);
  EXPECT_EQ(MlaDecodeAutoImpl(1, 16, num_sms, num_sms, MlaKvDtype::kBf16), MlaDecodeImpl::kMmaSync);
  EXPECT_EQ(MlaDecodeAutoImpl(1, 16, num_sms + 1, num_sms, MlaKvDtype::kBf16),
            MlaDecodeImpl::kSm90Transposed);
  EXPECT_EQ(MlaDecodeAutoImpl(16, 16, 17, num_sms, MlaKvDtype::kBf16),
            MlaDecodeImpl::kSm90Transposed);
  EXPECT_EQ(MlaDecodeAutoImpl(1, 32, 17, num_sms, MlaKvDtype::kBf16), MlaDecodeImpl::kSm90);
  EXPECT_EQ(MlaDecodeAutoImpl(1, 64, 17, num_sms, MlaKvDtype::kBf16), MlaDecodeImpl::kSm90);
  EXPECT_EQ(MlaDecodeAutoImpl(1, 128, 17, num_sms, MlaKvDtype::kBf16), MlaDecodeImpl::kSm90);
  EXPECT_EQ(MlaDecodeAutoImpl(16, 64, 17, num_sms, MlaKvDtype::kBf16), MlaDecodeImpl::kSm90Seesaw);
  EXPECT_EQ(MlaDecodeAutoImpl(128, 128, 512, num_sms, MlaKvDtype::kBf16),
            MlaDecodeImpl::kSm90Seesaw);
  EXPECT_EQ(MlaDecodeAutoImpl(1, 16, 17, num_sms, MlaKvDtype::kFp8E4M3), MlaDecodeImpl::kMmaSync);
  RunCase({16, {1025}, 0, false, MlaDecodeImpl::kAuto}, Seed());
  RunCase({16, {1, 1025, 1040, 700}, 0, false, MlaDecodeImpl::kAuto}, Seed());
  RunCase({16, {4096}, 0, false, MlaDecodeImpl::kAuto}, Seed());
}

// A decode step's newest rows, written by the kernel just ahead of the attention (fresh_rows = 1):
// the mma.sync and kSm90 kernels load the first tiles of older rows before their programmatic-
// launch wait and the newest row's tile after it, and must see the written row (at the start,
// middle or end of a tile; splits of one tile and of several; every prologue depth). The
// transposed and seesaw kernels ignore fresh_rows.
TEST_F(MlaDecodeTest, FreshRowsWrittenByTheKernelAheadAreReadAfterItsWait) {
  const bool hopper = MlaDecodeSm90Applies(MlaKvDtype::kBf16);
  const std::pair<int, MlaDecodeImpl> early_loaders[] = {{16, MlaDecodeImpl::kMmaSync},
                                                         {64, MlaDecodeImpl::kMmaSync},
                                                         {128, MlaDecodeImpl::kMmaSync},
                                                         {64, MlaDecodeImpl::kSm90},
                                                         {128, MlaDecodeImpl::kSm90}};
  for (const auto& [h_q, impl] : early_loaders) {
    if (impl == MlaDecodeImpl::kSm90 && !hopper) continue;
    for (const std::vector<int>& lens :
         {std::vector<int>{1025}, {1, 65, 1025, 129}, {41, 105, 1001, 553}, {64, 128, 1024, 192}}) {
      for (int splits : {0, 1, 5}) {
        Case c{h_q, lens, splits, false, impl};
        c.fresh_ahead = true;
        RunCase(c, Seed());
      }
    }
  }
  if (!hopper) GTEST_SKIP() << "the Hopper kernels not run";
  const std::pair<int, MlaDecodeImpl> others[] = {{16, MlaDecodeImpl::kSm90Transposed},
                                                  {128, MlaDecodeImpl::kSm90Seesaw}};
  for (const auto& [h_q, impl] : others) {
    Case c{h_q, {1, 65, 1025, 129}, 0, false, impl};
    c.fresh_ahead = true;
    RunCase(c, Seed());
  }
}

}  // namespace
}  // namespace strata::kernels
