#include "common/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdlib>
#include <new>
#include <string_view>

namespace strata::checksum_internal {

size_t StateBytes() { return sizeof(XXH3_state_t); }

const Kernels& Active() {
  static const Kernels* const best = [] {
    // STRATA_CHECKSUM_ISA=sse2|avx2 caps the choice (diagnostics, A/B in benchmarks).
    const char* cap = std::getenv("STRATA_CHECKSUM_ISA");
    const std::string_view want = cap != nullptr ? cap : "avx512";
    __builtin_cpu_init();
    if (want == "avx512" && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw")) {
      return &Avx512Variant();
    }
    if (want != "sse2" && __builtin_cpu_supports("avx2")) return &Avx2Variant();
    return &Sse2Variant();
  }();
  return *best;
}

}  // namespace strata::checksum_internal

namespace strata {

Checksum64Stream::Checksum64Stream()
    : kernels_(&checksum_internal::Active()),
      state_(::operator new (checksum_internal::StateBytes(), std::align_val_t{64})) {
  kernels_->reset(state_);
}

Checksum64Stream::~Checksum64Stream() { ::operator delete (state_, std::align_val_t{64}); }

}  // namespace strata
