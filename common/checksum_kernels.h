// The compiled variants of xxh3-64 behind Checksum64 (checksum.h). This header holds no inline
// code: it is included by the files compiled for AVX2 and AVX-512 (checksum_simd.inc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::checksum_internal {

// One compiled variant of xxh3-64; `state` points to an XXH3_state_t (64-byte aligned).
struct Kernels {
  const char* name;  // "sse2", "avx2", "avx512"
  uint64_t (*oneshot)(const void* data, size_t size);
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, size_t size);
  uint64_t (*digest)(const void* state);
};

// Each is compiled for its ISA (checksum_simd_<isa>.cc); call one only where the CPU has it.
const Kernels& Sse2Variant();
const Kernels& Avx2Variant();
const Kernels& Avx512Variant();

}  // namespace strata::checksum_internal
