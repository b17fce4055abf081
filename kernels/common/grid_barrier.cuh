// A grid-wide barrier for persistent kernels, without cooperative groups: one 32-bit word in
// global memory, zero once at allocation and never reset (graph replays included).
//
// Each CTA adds to the word once per barrier: CTA 0 adds 0x80000000 - (n - 1), every other CTA 1,
// so the n additions of one barrier sum to exactly 0x80000000: bit 31 flips once per barrier and
// the low bits come back to where they were. A CTA waits until bit 31 differs from what its own
// addition saw before it. A fence before the addition releases the CTA's writes (gathered by the
// block barrier in front of it) and the wait's loads acquire, so everything written by any CTA
// before the barrier is visible to every CTA after it.
//
// The caller must guarantee that all n CTAs are resident at once (a CTA spinning here holds its
// SM, so one that never started would hang the grid): size the grid from the occupancy query, or
// launch cooperatively (grid_barrier.h). Only one thread per CTA touches the word. Data that
// another CTA wrote before the barrier must be read with ordinary (coherent) loads, not through
// the non-coherent path (ld.global.nc, __ldg).
//
// Cost on the H200 (`strata bench kernels --only barrier`, docs/decode-notes.md): 1.24 us per
// barrier at 132 CTAs, 1.30 at 264, 2.3 at 1,056, against 0.89 / 0.93 / 1.54 us for a kernel
// boundary between programmatic launches in a CUDA graph. Two variants measured slower and were
// not kept: the release on a separate generation line (1.89 us at 132 CTAs) and a fire-and-forget
// red.add with relaxed polling (1.50 us).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::kernels {

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* word) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(value) : "l"(word) : "memory");
  return value;
}

// All CTAs of the grid (num_ctas of them, linear index cta) meet here; every thread of each CTA
// must call it.
__device__ __forceinline__ void GridBarrier(uint32_t* word, uint32_t num_ctas, uint32_t cta) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const uint32_t add = cta == 0 ? 0x80000000u - (num_ctas - 1) : 1u;
    __threadfence();  // release: the CTA's writes (ordered by the block barrier) before the add
    const uint32_t before = atomicAdd(word, add);
    while (((LoadAcquire(word) ^ before) & 0x80000000u) == 0) {
    }
  }
  __syncthreads();
}

}  // namespace strata::kernels
