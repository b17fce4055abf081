// Device helpers for Hopper (sm_90a) kernels: mbarriers, TMA tensor loads, wgmma fences and
// shared-memory matrix descriptors, named barriers. Header-only, included by .cu files.
//
// Vocabulary (PTX ISA, "asynchronous warpgroup level matrix" and "tensor copy"):
//  - A TMA load writes a box of a 2-D tensor into shared memory and counts its bytes on an
//    mbarrier (complete_tx); waiters spin on the barrier's phase parity.
//  - With the 128-byte swizzle a box row is 128 bytes and its 16-byte chunk c lands at chunk
//    c ^ (row % 8); 8 rows form a 1,024-byte atom. wgmma reads exactly that layout when its
//    descriptor says so (layout type 1) and the atom starts 1,024-byte aligned.
//  - Writes by ordinary stores become visible to wgmma and TMA (the async proxy) only after
//    fence.proxy.async by the writing threads and a barrier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels::sm90 {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count));
}

// Makes barrier initialisation visible to the async proxy (TMA) before any use.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}

// Spins until the phase with the given parity has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = SmemAddr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

// TMA: the box at element coordinates (x = inner, y = row) of `map` into `dst`, counted on `bar`.
__device__ __forceinline__ void TmaLoad2d(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(SmemAddr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(SmemAddr(bar))
      : "memory");
}

// The same for a 3-D map (x = inner, then y, z).
__device__ __forceinline__ void TmaLoad3d(void* dst, const void* map, int x, int y, int z,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4}], [%5];\n" ::"r"(SmemAddr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(SmemAddr(bar))
      : "memory");
}

// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared to global
// memory, in this thread's current bulk group. The shared source must stay as it is until
// BulkWaitRead says the group has read it (before the block exits, too).
__device__ __forceinline__ void BulkStore(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
               "r"(SmemAddr(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's committed bulk groups have read their shared-memory sources.
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

__device__ __forceinline__ void PrefetchTensorMap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// bar.sync on a named barrier (1..15; 0 is __syncthreads) for `threads` threads.
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Shared-memory matrix descriptor for a 128-byte-swizzled operand starting at `p` (the atom it is
// in must be 1,024-byte aligned; `p` may sit 32, 64 or 96 bytes into a row to pick a k-step).
// Byte offsets: `lbo` = leading dimension, `sbo` = stride dimension (PTX matrix-descriptor
// format). K-major operands: lbo unused (16), sbo = 1,024 (next 8 rows). MN-major operands:
// lbo = next 64 elements along M/N, sbo = next 8 rows along K.
__device__ __forceinline__ uint64_t DescSw128(const void* p, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((SmemAddr(p) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
         (uint64_t{1} << 62);
}

// The two operand layouts the kernels use, both from boxes of 64 rows x 128 bytes (TMA with the
// 128-byte swizzle, boxes 8,192 B apart): K-major (rows = M/N, 64 elements of K per row; 8-row
// groups 1,024 B apart) and MN-major (rows = K, 64 elements of M/N per row: the next 64 along M/N
// are the next box, the next 8 along K the next 1,024 B). The MN-major reading was verified on the
// H200 (the swapped lbo/sbo fails the MLA and prefill tests).
__device__ __forceinline__ uint64_t DescKMajorSw128(const void* p) {
  return DescSw128(p, 16, 1024);
}
__device__ __forceinline__ uint64_t DescMnMajorSw128(const void* p) {
  return DescSw128(p, 64 * 128, 1024);
}

// d (64 x 64 fp32; per warp the mma.sync C layout of its 16 rows: d[j] = columns 8j..8j+7) =
// (accumulate ? d : 0) + A (64 x 16) B (64 x 16)^T, A and B K-major in shared memory, by
// descriptor.
__device__ __forceinline__ void WgmmaM64N64Ss(float (&d)[8][4], uint64_t a, uint64_t b,
                                              int accumulate) {
#define STRATA_F4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, "
      "0;\n}\n"
      : STRATA_F4(0), STRATA_F4(1), STRATA_F4(2), STRATA_F4(3), STRATA_F4(4), STRATA_F4(5),
        STRATA_F4(6), STRATA_F4(7)
      : "l"(a), "l"(b), "r"(accumulate));
#undef STRATA_F4
}

// d (64 x 64 fp32) += A (64 x 16) B (64 x 16)^T with A in registers (the fragment of one k-step
// in the mma.sync A layout of the warp's 16 rows: a[0] rows 0-7 / a[1] rows 8-15 of columns
// 2 (lane % 4) + {0, 1}, a[2] / a[3] the same 8 columns on) and B K-major in shared memory.
__device__ __forceinline__ void WgmmaM64N64Rs(float (&d)[8][4], const uint32_t (&a)[4],
                                              uint64_t b) {
#define STRATA_F4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, "
      "%36, 1, 1, 1, 0;\n"
      : STRATA_F4(0), STRATA_F4(1), STRATA_F4(2), STRATA_F4(3), STRATA_F4(4), STRATA_F4(5),
        STRATA_F4(6), STRATA_F4(7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#undef STRATA_F4
}

// d (64 x 256 fp32, per warp the mma.sync C layout of its 16 rows: d[j] = columns 8j..8j+7) =
// (accumulate ? d : 0) + A (64 x 16) B (256 x 16)^T, A and B K-major in shared memory.
__device__ __forceinline__ void WgmmaM64N256Ss(float (&d)[32][4], uint64_t a, uint64_t b,
                                               int accumulate) {
#define STRATA_F4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : STRATA_F4(0), STRATA_F4(1), STRATA_F4(2), STRATA_F4(3), STRATA_F4(4), STRATA_F4(5),
        STRATA_F4(6), STRATA_F4(7), STRATA_F4(8), STRATA_F4(9), STRATA_F4(10), STRATA_F4(11),
        STRATA_F4(12), STRATA_F4(13), STRATA_F4(14), STRATA_F4(15), STRATA_F4(16), STRATA_F4(17),
        STRATA_F4(18), STRATA_F4(19), STRATA_F4(20), STRATA_F4(21), STRATA_F4(22), STRATA_F4(23),
        STRATA_F4(24), STRATA_F4(25), STRATA_F4(26), STRATA_F4(27), STRATA_F4(28), STRATA_F4(29),
        STRATA_F4(30), STRATA_F4(31)
      : "l"(a), "l"(b), "r"(accumulate));
#undef STRATA_F4
}

// Keeps the compiler from reading or moving accumulator registers between a wgmma's issue and its
// wait.
template <int kN>
__device__ __forceinline__ void PinRegisters(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void PinRegisters(float (&r)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    asm volatile("" : "+f"(r[j][0]), "+f"(r[j][1]), "+f"(r[j][2]), "+f"(r[j][3])::"memory");
  }
}

}  // namespace strata::kernels::sm90
