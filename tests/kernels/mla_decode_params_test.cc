// Argument checks of the MLA decode launcher and the split/workspace helpers (no GPU needed:
// validation happens before any CUDA call).
#include <gtest/gtest.h>

#include <string>

#include "kernels/mla_decode/combine_project.h"
#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels {
namespace {

MlaDecodeParams ValidParams() {
  alignas(16) static char dummy[64];
  MlaDecodeParams p;
  p.batch = 2;
  p.num_heads_q = 64;
  p.num_pages = 4;
  p.max_pages_per_seq = 2;
  p.num_splits = 1;
  p.softmax_scale = 0.1f;
  p.q = reinterpret_cast<const __nv_bfloat16*>(dummy);
  p.kv_cache = reinterpret_cast<const __nv_bfloat16*>(dummy);
  p.block_table = reinterpret_cast<const int32_t*>(dummy);
  p.seqlens = reinterpret_cast<const int32_t*>(dummy);
  p.out = reinterpret_cast<__nv_bfloat16*>(dummy);
  p.lse = reinterpret_cast<float*>(dummy);
  return p;
}

TEST(MlaDecodeParamsTest, AcceptsValid) {
  EXPECT_TRUE(ValidateMlaDecodeParams(ValidParams()).ok());
}

TEST(MlaDecodeParamsTest, RejectsBadArguments) {
  const auto rejects = [](auto mutate) {
    MlaDecodeParams p = ValidParams();
    mutate(p);
    const absl::Status st = ValidateMlaDecodeParams(p);
    return st.code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.num_heads_q = 8; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.num_heads_q = 72; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.num_heads_q = 144; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.batch = 0; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.num_splits = 0; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.num_splits = kMlaMaxSplits + 1; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.num_splits = 2; }));  // no workspace
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.softmax_scale = 0.f; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.softmax_scale = std::nanf(""); }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.kv_cache = nullptr; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.lse = nullptr; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) {
    p.out = reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(p.out) + 2);
  }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.max_pages_per_seq = 0; }));
  EXPECT_TRUE(rejects([](MlaDecodeParams& p) { p.fresh_rows = -1; }));
  EXPECT_FALSE(rejects([](MlaDecodeParams& p) { p.fresh_rows = 1; }));
}

TEST(MlaDecodeParamsTest, TransposedKernelRefusesOtherHeadCounts) {
  EXPECT_FALSE(MlaDecodeSm90TransposedApplies(48, MlaKvDtype::kBf16));
  EXPECT_FALSE(MlaDecodeSm90TransposedApplies(16, MlaKvDtype::kFp8E4M3));
  MlaDecodeParams p = ValidParams();  // 64 heads
  p.impl = MlaDecodeImpl::kSm90Transposed;
  const absl::Status st = LaunchMlaDecode(p, nullptr);  // host pointers: must refuse first
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("num_heads_q 16 or 32"), std::string::npos) << st;
  p.num_heads_q = 16;
  EXPECT_TRUE(ValidateMlaDecodeParams(p).ok());
}

TEST(MlaDecodeParamsTest, LaunchRejectsBeforeTouchingTheDevice) {
  MlaDecodeParams p = ValidParams();
  p.num_heads_q = 0;
  EXPECT_EQ(LaunchMlaDecode(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The Hopper kernel reads bf16 pages only; named for fp8 pages it is refused before any launch
// (on a machine without a compute capability 9.x device it is refused for bf16 pages too).
TEST(MlaDecodeParamsTest, Sm90KernelRefusesFp8Pages) {
  EXPECT_FALSE(MlaDecodeSm90Applies(MlaKvDtype::kFp8E4M3));
  MlaDecodeParams p = ValidParams();
  p.kv_dtype = MlaKvDtype::kFp8E4M3;
  p.kv_cache_fp8 = reinterpret_cast<const uint8_t*>(p.kv_cache);
  p.impl = MlaDecodeImpl::kSm90;
  EXPECT_EQ(LaunchMlaDecode(p, nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MlaDecodeParamsTest, SplitsAndWorkspace) {
  // Long sequences, few blocks: split to fill 132 SMs; one block per SM's worth: no split.
  constexpr MlaKvDtype kBf16 = MlaKvDtype::kBf16;
  for (MlaDecodeImpl impl : {MlaDecodeImpl::kMmaSync, MlaDecodeImpl::kSm90}) {
    EXPECT_GT(MlaDecodeNumSplits(1, 64, 32768, 132, kBf16, impl), 16);
    EXPECT_LE(MlaDecodeNumSplits(1, 16, 1, 132, kBf16, impl), 1);
    EXPECT_EQ(MlaDecodeNumSplits(128, 64, 4096, 132, kBf16, impl), 1);
    for (int s : {1, 4, 64}) {
      const int n = MlaDecodeNumSplits(128, 128, 1024 * s, 132, kBf16, impl);
      EXPECT_GE(n, 1);
      EXPECT_LE(n, kMlaMaxSplits);
    }
  }
  // 40 tokens: 2 tiles of 32 for mma.sync (at most 2 splits), 1 tile of 64 for the Hopper kernel.
  EXPECT_EQ(MlaDecodeNumSplits(4, 16, 40, 132, kBf16, MlaDecodeImpl::kMmaSync), 2);
  EXPECT_EQ(MlaDecodeNumSplits(4, 16, 40, 132, kBf16, MlaDecodeImpl::kSm90), 1);
  // Blocks of 16 heads share an SM in pairs on mma.sync: 128 sequences still split in two; the
  // Hopper kernel takes them as 128 blocks of one SM each.
  EXPECT_EQ(MlaDecodeNumSplits(128, 16, 4096, 132, kBf16, MlaDecodeImpl::kMmaSync), 2);
  EXPECT_EQ(MlaDecodeNumSplits(128, 16, 4096, 132, kBf16, MlaDecodeImpl::kSm90), 1);
  // The seesaw kernel takes tiles in pairs (an odd split is padded with a masked tile): 1,024
  // tokens (16 tiles) split in 8, where the other Hopper kernel takes one tile a split.
  EXPECT_EQ(MlaDecodeNumSplits(2, 128, 1024, 132, kBf16, MlaDecodeImpl::kSm90Seesaw), 8);
  EXPECT_EQ(MlaDecodeNumSplits(2, 128, 1024, 132, kBf16, MlaDecodeImpl::kSm90), 16);
  EXPECT_EQ(MlaDecodeNumSplits(128, 128, 4096, 132, kBf16, MlaDecodeImpl::kSm90Seesaw), 1);
  EXPECT_EQ(MlaDecodeWorkspaceBytes(8, 64, 1), 0u);
  MlaDecodeParams p = ValidParams();
  p.num_splits = 3;
  const size_t bytes = MlaDecodeWorkspaceBytes(p.batch, p.num_heads_q, p.num_splits);
  EXPECT_GE(bytes, static_cast<size_t>(2 * 3 * 64) * (512 + 1) * 4);
  std::vector<char> ws(bytes);
  MlaDecodeSetWorkspace(p, ws.data());
  EXPECT_EQ(static_cast<void*>(p.o_accum), ws.data());
  EXPECT_LE(reinterpret_cast<char*>(p.lse_accum + 2 * 3 * 64), ws.data() + bytes);
  EXPECT_TRUE(ValidateMlaDecodeParams(p).ok());
}

// The merge + projection kernel of few-row decode (combine_project.h).
TEST(MlaCombineProjectParamsTest, RejectsBadArguments) {
  MlaCombineProjectParams p;
  p.batch = 1;
  p.num_heads = 16;
  p.num_heads_q = 16;
  p.num_splits = 2;
  p.v_dim = 128;
  p.ld_out = 16 * 128;
  alignas(16) static float o[16], lse[16];
  alignas(16) static uint16_t w[16], out[16];
  p.o_accum = o;
  p.lse_accum = lse;
  p.w_uv = reinterpret_cast<const __nv_bfloat16*>(w);
  p.out = reinterpret_cast<__nv_bfloat16*>(out);
  EXPECT_TRUE(ValidateMlaCombineProjectParams(p).ok());
  auto bad = [&](auto change) {
    MlaCombineProjectParams q = p;
    change(q);
    return ValidateMlaCombineProjectParams(q).code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(bad([](auto& q) { q.batch = 0; }));
  EXPECT_TRUE(bad([](auto& q) { q.num_heads = 17; }));
  EXPECT_TRUE(bad([](auto& q) { q.num_splits = kMlaMaxSplits + 1; }));
  EXPECT_TRUE(bad([](auto& q) { q.v_dim = 100; }));
  EXPECT_TRUE(bad([](auto& q) { q.ld_out = 16 * 128 - 1; }));
  EXPECT_TRUE(bad([](auto& q) { q.lse_accum = nullptr; }));
  EXPECT_TRUE(bad([](auto& q) { q.num_splits = 1; }));  // then o_lat is needed
  EXPECT_TRUE(bad([](auto& q) { q.w_uv = reinterpret_cast<const __nv_bfloat16*>(w + 1); }));
}

TEST(MlaCombineProjectParamsTest, LaunchRejectsBeforeTouchingTheDevice) {
  MlaCombineProjectParams p;  // nothing set
  EXPECT_EQ(LaunchMlaCombineProject(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::kernels
