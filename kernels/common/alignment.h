// The alignment the launchers check their pointers for: 16-byte vector loads and stores.
// Header-only, plain C++ (the launchers' host code includes it).
#pragma once

#include <cstdint>

namespace strata::kernels {

// Whether `ptr` is not 16-byte aligned (null is aligned).
inline bool Misaligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; }

}  // namespace strata::kernels
