// Argument validation of the small kernels and prefill attention: host-only (label unit), so a
// bad shape is refused with InvalidArgument before anything reaches the device.
#include <gtest/gtest.h>

#include "kernels/activation/silu_mul.h"
#include "kernels/common/grid_barrier.h"
#include "kernels/kv_pages/kv_pages.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_router/moe_router.h"
#include "kernels/norm_rope/latent_rows.h"
#include "kernels/norm_rope/rms_norm.h"
#include "kernels/norm_rope/rope.h"
#include "kernels/prefill_attention/prefill_attention.h"
#include "kernels/sampling/greedy_sample.h"
#include "kernels/sampling/sample.h"

namespace strata::kernels {
namespace {

// A 16-byte aligned fake device address: validation never dereferences it.
template <typename T>
T* Fake() {
  return reinterpret_cast<T*>(uintptr_t{1} << 20);
}

TEST(SmallKernelsParamsTest, RmsNorm) {
  RmsNormParams p;
  p.rows = 4;
  p.dim = 512;
  p.x = Fake<__nv_bfloat16>();
  p.weight = Fake<__nv_bfloat16>();
  p.out = Fake<__nv_bfloat16>();
  p.ld_x = p.ld_out = 576;
  EXPECT_TRUE(ValidateRmsNormParams(p).ok());
  p.dim = 12;  // not a multiple of 8
  EXPECT_EQ(ValidateRmsNormParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.dim = 512;
  p.residual = Fake<__nv_bfloat16>();  // without residual_out
  p.ld_residual = 512;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok());
  p.residual_out = Fake<__nv_bfloat16>() + 1;  // misaligned
  p.ld_residual_out = 512;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok());
}

TEST(SmallKernelsParamsTest, RmsNormMoeSum) {
  static char fake[64] __attribute__((aligned(16)));
  auto* bf = reinterpret_cast<__nv_bfloat16*>(fake);
  RmsNormParams p;
  p.rows = 1;
  p.dim = 16;
  p.weight = bf;
  p.out = bf;
  p.ld_out = 16;
  p.residual = bf;
  p.ld_residual = 16;
  p.residual_out = bf;
  p.ld_residual_out = 16;
  p.moe.top_k = 2;
  p.moe.expert_out = bf;
  p.moe.ld_expert_out = 16;
  p.moe.slot = reinterpret_cast<const int64_t*>(fake);
  p.moe.weight = reinterpret_cast<const float*>(fake);
  EXPECT_TRUE(ValidateRmsNormParams(p).ok()) << "x is not needed with moe";
  p.moe.ld_expert_out = 12;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok());
  p.moe.ld_expert_out = 16;
  p.moe.slot = nullptr;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok());
  p.moe.slot = reinterpret_cast<const int64_t*>(fake);
  p.moe.top_k = kRmsNormMaxTopK + 1;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok());
  p.moe.top_k = 2;
  p.residual = nullptr;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok()) << "the sum goes only into the residual";
  p.moe.top_k = 0;
  EXPECT_FALSE(ValidateRmsNormParams(p).ok()) << "no moe: x must be set";
}

// A projection forming its input row from a norm (MoeNormIn): one row of the input's width, a
// valid norm, and with writes no output over an input the other CTAs still read.
TEST(SmallKernelsParamsTest, NormInFormsOneRowAndNeverOverwritesItsInputs) {
  alignas(16) static __nv_bfloat16 in[4][16];
  alignas(16) static __nv_bfloat16 w[16 * 16], out[16 * 16], xn[16], residual_out[16];
  SkinnyGemmParams g;
  g.tokens = 1;
  g.n_out = 16;
  g.k = 16;
  g.w = w;
  g.out = out;
  EXPECT_FALSE(ValidateSkinnyGemmParams(g).ok()) << "no x and no norm_in";
  RmsNormParams& n = g.norm_in.params;
  n.rows = 1;
  n.dim = 16;
  n.x = in[0];
  n.ld_x = 16;
  n.residual = in[1];
  n.ld_residual = 16;
  n.residual_out = residual_out;
  n.ld_residual_out = 16;
  n.weight = in[2];
  n.out = xn;
  n.ld_out = 16;
  g.norm_in.writes = true;
  EXPECT_TRUE(ValidateSkinnyGemmParams(g).ok()) << "x is not read";
  SkinnyGemmParams bad = g;
  bad.tokens = 2;
  EXPECT_FALSE(ValidateSkinnyGemmParams(bad).ok()) << "two token rows";
  bad = g;
  bad.norm_in.params.dim = 8;
  bad.norm_in.params.ld_x = bad.norm_in.params.ld_out = 8;
  EXPECT_FALSE(ValidateSkinnyGemmParams(bad).ok()) << "dim is not the input width k";
  bad = g;
  bad.norm_in.params.residual_out = in[1];
  EXPECT_FALSE(ValidateSkinnyGemmParams(bad).ok()) << "the residual updated in place";
  bad.norm_in.writes = false;
  EXPECT_TRUE(ValidateSkinnyGemmParams(bad).ok()) << "nothing written: aliasing is harmless";
  bad = g;
  bad.norm_in.params.out = in[0] + 8;
  EXPECT_FALSE(ValidateSkinnyGemmParams(bad).ok()) << "out overlapping x";
  bad = g;
  bad.norm_in.params.weight = nullptr;
  EXPECT_FALSE(ValidateSkinnyGemmParams(bad).ok()) << "an invalid norm";

  MoeExpertsParams p;  // an identity MLP of width 16
  p.num_tokens = 1;
  p.num_experts = 1;
  p.max_active = 1;
  p.hidden = 16;
  p.inter = 16;
  p.token_tiles = 1;
  p.identity = true;
  p.ld_x = 16;
  p.weights = w;
  p.act = p.out = out;
  p.norm_in = g.norm_in;
  EXPECT_TRUE(ValidateMoeExpertsParams(p).ok());
  MoeExpertsParams q = p;
  q.token_tiles = 2;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "one token tile";
  q = p;
  q.hidden = 24;
  q.ld_x = 24;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "dim is not hidden";
  q = p;
  q.norm_in.params.rows = 0;
  EXPECT_FALSE(ValidateMoeExpertsParams(q).ok()) << "no norm_in: x must be set";
}

TEST(SmallKernelsParamsTest, LatentRows) {
  static char fake[64] __attribute__((aligned(16)));
  LatentRowsParams p;
  p.num_tokens = 2;
  p.in = reinterpret_cast<const __nv_bfloat16*>(fake);
  p.ld_in = 576;
  p.norm_weight = p.in;
  p.positions = reinterpret_cast<const int32_t*>(fake);
  p.inv_freq = reinterpret_cast<const float*>(fake);
  p.out = reinterpret_cast<__nv_bfloat16*>(fake);
  p.ld_out = 576;
  p.out_rows = reinterpret_cast<const int64_t*>(fake);
  EXPECT_TRUE(ValidateLatentRowsParams(p).ok());
  p.rank = 513;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok());
  p.rank = 512;
  p.ld_out = 570;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok());
  p.ld_out = 576;
  p.out_rows = nullptr;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok());
  p.out_rows = reinterpret_cast<const int64_t*>(fake);
  p.rope_dim = 65;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok());
  p.rope_dim = 64;
  p.q_heads = 16;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok()) << "q_heads without q";
  p.q = reinterpret_cast<__nv_bfloat16*>(fake);
  EXPECT_TRUE(ValidateLatentRowsParams(p).ok());
  p.q_head_stride = -1;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok());
  p.q_head_stride = 192;
  p.q_heads = -1;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok());
  p.q_heads = 65534 * 3;  // grid y = 1 + 65534 blocks of 3 heads: the most a launch takes
  EXPECT_TRUE(ValidateLatentRowsParams(p).ok());
  p.q_heads += 1;
  EXPECT_FALSE(ValidateLatentRowsParams(p).ok()) << "grid y would exceed 65535";
}

TEST(SmallKernelsParamsTest, Rope) {
  RopeParams p;
  p.num_tokens = 3;
  p.num_heads = 16;
  p.x = Fake<__nv_bfloat16>();
  p.positions = Fake<int32_t>();
  p.inv_freq = Fake<float>();
  p.token_stride = 16 * 192;
  p.head_stride = 192;
  EXPECT_TRUE(ValidateRopeParams(p).ok());
  p.rope_dim = 63;
  EXPECT_FALSE(ValidateRopeParams(p).ok());
  p.rope_dim = 64;
  p.head_stride = 32;  // vectors would overlap
  EXPECT_FALSE(ValidateRopeParams(p).ok());
  p.head_stride = 192;
  p.out = Fake<__nv_bfloat16>();  // out of place: its own strides
  p.out_token_stride = 16 * 576;
  p.out_head_stride = 576;
  EXPECT_TRUE(ValidateRopeParams(p).ok());
  p.out_head_stride = 0;
  EXPECT_FALSE(ValidateRopeParams(p).ok());
  p.out_head_stride = 576;
  p.out_token_stride = 8;
  EXPECT_FALSE(ValidateRopeParams(p).ok());
}

TEST(SmallKernelsParamsTest, SiluMul) {
  SiluMulParams p;
  p.rows = 2;
  p.dim = 1408;
  p.gate = Fake<__nv_bfloat16>();
  p.up = Fake<__nv_bfloat16>() + 1408;
  p.out = Fake<__nv_bfloat16>();
  p.ld_gate = p.ld_up = p.ld_out = 2816;
  EXPECT_TRUE(ValidateSiluMulParams(p).ok());
  p.ld_up = 100;
  EXPECT_FALSE(ValidateSiluMulParams(p).ok());
}

TEST(SmallKernelsParamsTest, KvPages) {
  KvPagesParams p;
  p.num_blocks = 2;
  p.num_layers = 3;
  p.layer_end = 3;
  p.page_stride = 64 * 576;
  p.layer_stride = 10 * 64 * 576;
  p.pool = Fake<__nv_bfloat16>();
  p.pages = Fake<int32_t>();
  p.payloads = Fake<uint8_t* const>();
  EXPECT_TRUE(ValidateKvPagesParams(p).ok());
  EXPECT_EQ(KvPayloadLayerBytes(p), 73728);  // docs/block-format.md
  p.codec = KvPayloadCodec::kFp8E4M3;
  EXPECT_TRUE(ValidateKvPagesParams(p).ok());
  EXPECT_EQ(KvPayloadLayerBytes(p), 41984);
  EXPECT_EQ(KvPayloadBytes(p), 3 * 41984);
  p.latent_dim = 520;  // fp8 needs a multiple of 128
  EXPECT_FALSE(ValidateKvPagesParams(p).ok());
  p.latent_dim = 512;
  p.layer_begin = 2;
  p.layer_end = 1;
  EXPECT_FALSE(ValidateKvPagesParams(p).ok());
}

// A valid one-token DeepSeek-V3 router call.
MoeRouterParams ValidRouter() {
  MoeRouterParams p;
  p.num_tokens = 1;
  p.num_experts = 256;
  p.top_k = 8;
  p.n_group = 8;
  p.topk_group = 4;
  p.logits = Fake<float>();
  p.ld_logits = 256;
  p.experts = Fake<int32_t>();
  p.weights = Fake<float>();
  return p;
}

TEST(SmallKernelsParamsTest, MoeRouter) {
  MoeRouterParams p = ValidRouter();
  EXPECT_TRUE(ValidateMoeRouterParams(p).ok());
  p.num_experts = 100;  // 8 groups do not divide 100
  p.ld_logits = 100;
  EXPECT_FALSE(ValidateMoeRouterParams(p).ok());
  p.num_experts = 1024;  // above kMoeMaxExperts
  EXPECT_FALSE(ValidateMoeRouterParams(p).ok());
}

TEST(SmallKernelsParamsTest, MoeRouterAlignIsFewTokensAndComplete) {
  MoeRouterParams p = ValidRouter();
  p.align = {.expert_count = Fake<int32_t>(),
             .expert_offset = Fake<int32_t>(),
             .active = Fake<int32_t>(),
             .num_active = Fake<int32_t>(),
             .slot_token = Fake<int32_t>(),
             .token_slot = Fake<int64_t>(),
             .error = Fake<int32_t>()};
  EXPECT_TRUE(ValidateMoeRouterParams(p).ok());
  p.num_tokens = kMoeRouterAlignMaxTokens;  // one block of a warp per token
  EXPECT_TRUE(ValidateMoeRouterParams(p).ok());
  p.num_tokens = kMoeRouterAlignMaxTokens + 1;
  EXPECT_FALSE(ValidateMoeRouterParams(p).ok());
  p.num_tokens = 1;
  p.align.error = nullptr;  // some outputs but not all
  EXPECT_FALSE(ValidateMoeRouterParams(p).ok());
}

TEST(SmallKernelsParamsTest, PrefillAttention) {
  PrefillAttentionParams p;
  p.batch = 1;
  p.num_heads = 2;
  p.max_seqlen_q = 10;
  p.softmax_scale = 0.1f;
  p.cu_seqlens_q = p.cu_seqlens_k = Fake<int32_t>();
  p.q = p.k = p.v = Fake<__nv_bfloat16>();
  p.out = Fake<__nv_bfloat16>();
  p.lse = Fake<float>();
  p.q_token_stride = p.k_token_stride = 384;
  p.v_token_stride = p.out_token_stride = 256;
  p.q_head_stride = p.k_head_stride = 192;
  p.v_head_stride = p.out_head_stride = 128;
  EXPECT_TRUE(ValidatePrefillAttentionParams(p).ok());
  p.v_token_stride = 250;  // not a multiple of 8
  EXPECT_FALSE(ValidatePrefillAttentionParams(p).ok());
  p.v_token_stride = 256;
  p.softmax_scale = -1.f;
  EXPECT_FALSE(ValidatePrefillAttentionParams(p).ok());
  p.softmax_scale = 0.1f;
  p.total_k = -1;  // the rows of k and v; 0 = unknown (no TMA variant)
  EXPECT_FALSE(ValidatePrefillAttentionParams(p).ok());
  p.total_k = 0;
  EXPECT_EQ(PrefillAttentionVariantFor(p), 1);  // without total_k: never the TMA variants
}

TEST(SmallKernelsParamsTest, GreedySample) {
  GreedySampleParams p;
  p.rows = 2;
  p.vocab = 129280;
  p.ld_logits = 129280;
  p.logits = Fake<float>();
  p.tokens = Fake<int32_t>();
  EXPECT_TRUE(ValidateGreedySampleParams(p).ok());
  p.ld_logits = 1000;
  EXPECT_FALSE(ValidateGreedySampleParams(p).ok());
  p.ld_logits = 129280;
  p.vocab = 0;
  EXPECT_FALSE(ValidateGreedySampleParams(p).ok());
}

TEST(SmallKernelsParamsTest, Sample) {
  SampleParams p;
  p.rows = 64;
  p.vocab = 129280;
  p.ld_logits = 129280;
  p.logits = Fake<float>();
  p.draws = Fake<SampleRowDraw>();
  p.tokens = Fake<int32_t>();
  EXPECT_TRUE(ValidateSampleParams(p).ok());
  p.ld_logits = 100;
  EXPECT_FALSE(ValidateSampleParams(p).ok());
  p.ld_logits = 129280;
  p.draws = nullptr;
  EXPECT_FALSE(ValidateSampleParams(p).ok());
  p.draws = Fake<SampleRowDraw>();
  p.vocab = 0;
  EXPECT_FALSE(ValidateSampleParams(p).ok());
}

// The fields are checked before the device is asked how many CTAs it holds (the gpu test covers
// that refusal), so these hold without a GPU.
TEST(SmallKernelsParamsTest, GridRounds) {
  GridRoundsParams p;
  p.num_ctas = 4;
  p.sync = GridSync::kLaunch;
  p.slots = Fake<int32_t>();
  p.errors = Fake<int32_t>();
  EXPECT_TRUE(ValidateGridRoundsParams(p).ok());
  p.rounds = 2;  // a launch boundary separates one round from the next
  EXPECT_FALSE(ValidateGridRoundsParams(p).ok());
  p.sync = GridSync::kCooperativeGroups;  // grid.sync() without a cooperative launch
  EXPECT_FALSE(ValidateGridRoundsParams(p).ok());
  p.sync = GridSync::kBarrier;  // no barrier word
  EXPECT_FALSE(ValidateGridRoundsParams(p).ok());
  p.sync = GridSync::kLaunch;
  p.rounds = 1;
  p.first_round = -1;
  EXPECT_FALSE(ValidateGridRoundsParams(p).ok());
  p.first_round = 0;
  p.num_ctas = 0;
  EXPECT_FALSE(ValidateGridRoundsParams(p).ok());
  p.num_ctas = 4;
  p.slots = nullptr;
  EXPECT_FALSE(ValidateGridRoundsParams(p).ok());
}

TEST(SmallKernelsParamsTest, PrefillUnknownVariantRefused) {
  PrefillAttentionParams p;  // invalid anyway: validation comes first
  EXPECT_FALSE(LaunchPrefillAttentionVariant(p, 99, nullptr).ok());
}

}  // namespace
}  // namespace strata::kernels
