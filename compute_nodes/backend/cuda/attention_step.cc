// The two attention forms of a CUDA engine step: MHA over the decompressed context (prefill
// rows) and absorbed MLA decode over the latent pages (decode rows).
#include "common/status.h"
#include "compute_nodes/backend/cuda/cuda_ops.h"
#include "compute_nodes/backend/cuda/engine_impl.h"
#include "kernels/mla_decode/combine_project.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/prefill_attention/prefill_attention.h"

namespace strata::cuda {
namespace {

using bf16 = __nv_bfloat16;
using engine_detail::kLatent;
using engine_detail::kPadNope;
using engine_detail::kPadQk;
using engine_detail::kPadV;
using engine_detail::kRope;
using engine_detail::kRow;
using engine_detail::MhaSeq;
using model::ModelConfig;

// The per-head halves of kv_b_proj ([heads][nope + vd][512] rows): head h's W_UK ([nope][512])
// at w_uk + h * head_stride, its W_UV ([vd][512]) at w_uv + h * head_stride.
struct KvbSlices {
  const bf16* w_uk;
  const bf16* w_uv;
  int64_t head_stride;
};

KvbSlices SlicesOf(const DeviceLinear& kv_b_proj, const ModelConfig& c) {
  return {kv_b_proj.w, kv_b_proj.w + c.qk_nope_head_dim * kLatent,
          (c.qk_nope_head_dim + c.v_head_dim) * kLatent};
}

}  // namespace

// Attention, MHA form: per prefill sequence over its decompressed context. The prefill kernel
// reads K = [k_nope | 0 | k_pe] (192 per head) and V = [v | ·] (128) through strides, so W_UK and
// W_UV (the two halves of every head's kv_b_proj rows) write straight into those layouts as two
// GEMMs batched over the heads, and only k_pe, shared by every head, is copied. Q and the output
// need copies only when the model's head dims are narrower than the kernel's (small presets).
absl::Status CudaEngine::Impl::MhaAttention(const DeviceLayer& L, const StepPlan& P,
                                            int64_t layer) {
  const ModelConfig& c = W.config();
  const int64_t heads = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  const int64_t qk = c.qk_head_dim();
  const KvbSlices kvb = SlicesOf(L.kv_b_proj, c);
  const bool q_direct = nope == kPadNope, out_direct = vd == kPadV;
  const int64_t q_ld = QueryLd();
  const bf16* pool_l = pool.layer_base(layer);
  bf16* attn_p = attn.as<bf16>();
  bf16* kpp = kp.as<bf16>();
  for (const MhaSeq& sq : P.mha) {
    bf16* latp = lat.as<bf16>();
    RETURN_IF_ERROR(GatherRows(pool_l, kRow, meta.At<int64_t>(P.o_lat) + sq.lat_off, sq.ctx, kRow,
                               latp, kRow, s));
    // k_nope[t][h] = W_UK[h] · c_kv[t] and v[t][h] = W_UV[h] · c_kv[t].
    GemmArgs g;
    g.m = sq.ctx;
    g.k = kLatent;
    g.a = latp;
    g.lda = kRow;
    g.ldb = kLatent;
    g.batch = heads;
    g.stride_a = 0;
    g.stride_b = kvb.head_stride;
    g.n = nope;
    g.b = kvb.w_uk;
    g.c = kpp;
    g.ldc = heads * kPadQk;
    g.stride_c = kPadQk;
    RETURN_IF_ERROR(blas.Gemm(g));
    g.n = vd;
    g.b = kvb.w_uv;
    g.c = vp.as<bf16>();
    g.ldc = heads * kPadV;
    g.stride_c = kPadV;
    RETURN_IF_ERROR(blas.Gemm(g));
    // V's pad lanes (vd < 128) reach only output lanes that are dropped; K's must be zero, as Q's.
    CopyHeadsParams cp;
    if (!q_direct) {
      cp = {sq.ctx, heads, 0, kPadNope - nope, nullptr, 0, 0, kpp + nope, heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }
    cp = {sq.ctx, heads, kRope,          kRope,          latp + kLatent,
          kRow,   0,     kpp + kPadNope, heads * kPadQk, kPadQk};
    RETURN_IF_ERROR(CopyHeads(cp, s));
    // Q = [q_nope | 0 | q_pe].
    const bf16* qs = QueryRows() + sq.first_row * q_ld;
    if (!q_direct) {
      cp = {sq.q_len, heads, nope, kPadNope, qs, q_ld, qk, qp.as<bf16>(), heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
      cp = {sq.q_len,       heads, kRope, kRope, qs + nope, q_ld, qk, qp.as<bf16>() + kPadNope,
            heads * kPadQk, kPadQk};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }
    bf16* out = attn_p + sq.first_row * heads * vd;
    kernels::PrefillAttentionParams p;
    p.batch = 1;
    p.num_heads = static_cast<int>(heads);
    p.max_seqlen_q = static_cast<int>(sq.q_len);
    p.causal = true;
    p.accumulate = false;
    p.softmax_scale = static_cast<float>(c.SoftmaxScale());
    p.cu_seqlens_q = meta.At<int32_t>(P.o_cu) + sq.cu_off;
    p.cu_seqlens_k = meta.At<int32_t>(P.o_cu) + sq.cu_off + 2;
    p.q = q_direct ? qs : qp.as<bf16>();
    p.q_token_stride = q_direct ? q_ld : heads * kPadQk;
    p.q_head_stride = q_direct ? qk : kPadQk;
    p.k = kpp;
    p.k_token_stride = heads * kPadQk;
    p.k_head_stride = kPadQk;
    p.v = vp.as<bf16>();
    p.v_token_stride = heads * kPadV;
    p.v_head_stride = kPadV;
    p.out = out_direct ? out : op.as<bf16>();
    p.out_token_stride = heads * kPadV;
    p.out_head_stride = kPadV;
    p.lse = plse.as<float>();
    p.total_k = static_cast<int64_t>(sq.ctx);
    RETURN_IF_ERROR(kernels::LaunchPrefillAttention(p, s));
    if (!out_direct) {
      cp = {sq.q_len, heads, vd, vd, op.as<bf16>(), heads * kPadV, kPadV, out, heads * vd, vd};
      RETURN_IF_ERROR(CopyHeads(cp, s));
    }
  }
  return absl::OkStatus();
}

// The MLA query rows' latent part, q_lat = q_nope · W_UK per head (and q_pe copied beside it
// unless RopeRows wrote it there).
absl::Status CudaEngine::Impl::QueryLatent(const DeviceLayer& L, const StepPlan& P, int64_t layer) {
  if (P.m == 0) return absl::OkStatus();
  const ModelConfig& c = W.config();
  const int64_t m = P.m, heads = c.num_attention_heads, nope = c.qk_nope_head_dim;
  const int64_t qk = c.qk_head_dim();
  const KvbSlices kvb = SlicesOf(L.kv_b_proj, c);
  const int64_t hq_pad = QueryHeadsPadded();
  // The decode rows' queries: in place for decode-only steps, else gathered (compact rows).
  const bf16* qdp = QueryRows();
  int64_t ld_qd = QueryLd();
  if (!P.all_decode) {
    RETURN_IF_ERROR(GatherRows(qdp, ld_qd, meta.At<int64_t>(P.o_dec), m, heads * qk, qd.as<bf16>(),
                               heads * qk, s));
    qdp = qd.as<bf16>();
    ld_qd = heads * qk;
  }
  bf16* qf = qfull.as<bf16>();
  const bool skinny = m <= kSkinnyMaxRows && wuk_t != nullptr;
  // q_pe into the query rows (side stream) beside q_lat, unless RopeRows wrote it there.
  const bool copy_pe = !RopesIntoQueryRows(P);
  if (copy_pe) {
    RETURN_IF_ERROR(side->Fork());
    CopyHeadsParams cp{m,     heads, kRope,        kRope,         qdp + nope,
                       ld_qd, qk,    qf + kLatent, hq_pad * kRow, kRow};
    RETURN_IF_ERROR(CopyHeads(cp, side->stream()));
  }
  // q_lat[r][hd] = q_nope[r][hd] · W_UK[hd]   ([nope] × [nope][512], one GEMM per head): the
  // skinny kernel over the transposed copy for few rows, else cuBLAS over kv_b_proj.
  if (skinny) {
    kernels::SkinnyGemmParams sg;
    sg.tokens = static_cast<int>(m);
    sg.n_out = static_cast<int>(kLatent);
    sg.k = static_cast<int>(nope);
    sg.batch = static_cast<int>(heads);
    sg.x = qdp;
    sg.ld_x = ld_qd;
    sg.batch_stride_x = qk;
    sg.w = wuk_t + layer * heads * kLatent * nope;
    sg.batch_stride_w = kLatent * nope;
    sg.out = qf;
    sg.ld_out = hq_pad * kRow;
    sg.batch_stride_out = kRow;
    sg.weights_static = true;
    RETURN_IF_ERROR(kernels::LaunchSkinnyGemm(sg, s));
  } else {
    GemmArgs g;
    g.m = m;
    g.n = kLatent;
    g.k = nope;
    g.trans_b = false;
    g.a = qdp;
    g.lda = ld_qd;
    g.stride_a = qk;
    g.b = kvb.w_uk;
    g.ldb = kLatent;
    g.stride_b = kvb.head_stride;
    g.c = qf;
    g.ldc = hq_pad * kRow;
    g.stride_c = kRow;
    g.batch = heads;
    RETURN_IF_ERROR(blas.Gemm(g));
  }
  if (copy_pe) RETURN_IF_ERROR(side->Join());
  return absl::OkStatus();
}

// Attention, absorbed form (MLA decode over the latent pages).
absl::Status CudaEngine::Impl::AbsorbedAttention(const DeviceLayer& L, const StepPlan& P,
                                                 int64_t layer, bool query_latent_done) {
  if (P.m == 0) return absl::OkStatus();
  if (!query_latent_done) RETURN_IF_ERROR(QueryLatent(L, P, layer));
  const ModelConfig& c = W.config();
  const int64_t m = P.m, heads = c.num_attention_heads, vd = c.v_head_dim;
  const KvbSlices kvb = SlicesOf(L.kv_b_proj, c);
  const int64_t hq_pad = QueryHeadsPadded();
  const bool skinny = m <= kSkinnyMaxRows && wuk_t != nullptr;
  kernels::MlaDecodeParams p;
  p.batch = static_cast<int>(m);
  p.num_heads_q = static_cast<int>(hq_pad);
  p.num_pages = static_cast<int>(pool.num_pages());
  p.max_pages_per_seq = static_cast<int>(P.table_pages);
  p.num_splits = P.num_splits;
  p.softmax_scale = static_cast<float>(c.SoftmaxScale());
  p.q = qfull.as<bf16>();
  p.kv_cache = pool.layer_base(layer);
  p.block_table = meta.At<int32_t>(P.o_dtab);
  p.seqlens = meta.At<int32_t>(P.o_dlen);
  // A decode-only step's one new row per sequence is written by the latent-rows kernel, just ahead
  // (beside q·W_UK or before it); every older row, the table and the lengths were complete earlier.
  p.fresh_rows = P.all_decode ? 1 : 0;
  p.out = olat.as<bf16>();
  p.lse = dlse.as<float>();
  if (P.num_splits > 1) kernels::MlaDecodeSetWorkspace(p, dws.as<void>());
  // For one row the split merge and the W_UV projection below run as one kernel (its weight loads
  // start while the split kernel runs): at batch 1 a step 0.02 ms faster on the H200; at 4 and 16
  // rows slower (it reads W_UV once per row), so those keep the combine kernel and the GEMM.
  const bool fused = m == 1 && vd % kernels::kMlaCombineProjectRows == 0;
  p.skip_combine = fused;
  RETURN_IF_ERROR(kernels::LaunchMlaDecode(p, s));
  // out[r][hd] = o_lat[r][hd] · W_UV[hd]ᵀ   ([512] × [vd][512]ᵀ, one GEMM per head).
  bf16* odp = P.all_decode ? attn.as<bf16>() : od.as<bf16>();
  if (fused) {
    kernels::MlaCombineProjectParams cp;
    cp.batch = static_cast<int>(m);
    cp.num_heads = static_cast<int>(heads);
    cp.num_heads_q = static_cast<int>(hq_pad);
    cp.num_splits = P.num_splits;
    cp.v_dim = static_cast<int>(vd);
    cp.o_accum = p.o_accum;
    cp.lse_accum = p.lse_accum;
    cp.o_lat = olat.as<bf16>();
    cp.w_uv = kvb.w_uv;
    cp.w_head_stride = kvb.head_stride;
    cp.out = odp;
    cp.ld_out = heads * vd;
    RETURN_IF_ERROR(kernels::LaunchMlaCombineProject(cp, s));
  } else if (skinny) {
    kernels::SkinnyGemmParams sg;
    sg.tokens = static_cast<int>(m);
    sg.n_out = static_cast<int>(vd);
    sg.k = static_cast<int>(kLatent);
    sg.batch = static_cast<int>(heads);
    sg.x = olat.as<bf16>();
    sg.ld_x = hq_pad * kLatent;
    sg.batch_stride_x = kLatent;
    sg.w = kvb.w_uv;
    sg.batch_stride_w = kvb.head_stride;
    sg.out = odp;
    sg.ld_out = heads * vd;
    sg.batch_stride_out = vd;
    sg.weights_static = true;
    RETURN_IF_ERROR(kernels::LaunchSkinnyGemm(sg, s));
  } else {
    GemmArgs g;
    g.m = m;
    g.n = vd;
    g.k = kLatent;
    g.trans_b = true;
    g.a = olat.as<bf16>();
    g.lda = hq_pad * kLatent;
    g.stride_a = kLatent;
    g.b = kvb.w_uv;
    g.ldb = kLatent;
    g.stride_b = kvb.head_stride;
    g.c = odp;
    g.ldc = heads * vd;
    g.stride_c = vd;
    g.batch = heads;
    RETURN_IF_ERROR(blas.Gemm(g));
  }
  if (!P.all_decode) {
    RETURN_IF_ERROR(ScatterRows(odp, heads * vd, meta.At<int64_t>(P.o_dec), m, heads * vd,
                                attn.as<bf16>(), heads * vd, s));
  }
  return absl::OkStatus();
}

}  // namespace strata::cuda
