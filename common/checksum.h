// Payload and header checksums: xxh3-64 (ARCHITECTURE.md §3).
//
// Every block is hashed on each hop (commit, SSD read, every get), so the hash runs at the speed
// of the widest vector unit the CPU has: the xxh3 code is compiled once per x86 level (SSE2,
// AVX2, AVX-512) in checksum_simd_*.cc, and the first call picks the one this CPU runs. The
// digest is the same on every level (xxh3 is defined independently of the vector width).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/checksum_kernels.h"

namespace strata {

namespace checksum_internal {
const Kernels& Active();  // the widest variant this CPU runs
size_t StateBytes();      // sizeof(XXH3_state_t)
}  // namespace checksum_internal

inline uint64_t Checksum64(const void* data, size_t size) {
  return checksum_internal::Active().oneshot(data, size);
}
inline uint64_t Checksum64(std::string_view data) { return Checksum64(data.data(), data.size()); }

// Which variant Checksum64 runs on this CPU ("sse2", "avx2", "avx512"); for logs and benchmarks.
inline const char* Checksum64Isa() { return checksum_internal::Active().name; }

// Streaming form, for payloads that arrive in pieces (layer by layer).
class Checksum64Stream {
 public:
  Checksum64Stream();
  ~Checksum64Stream();
  Checksum64Stream(const Checksum64Stream&) = delete;
  Checksum64Stream& operator=(const Checksum64Stream&) = delete;

  void Update(const void* data, size_t size) { kernels_->update(state_, data, size); }
  uint64_t Digest() const { return kernels_->digest(state_); }

 private:
  const checksum_internal::Kernels* kernels_;
  void* state_;
};

// Copies `size` bytes from `src` to `dst` and returns their checksum (= Checksum64(dst, size)),
// hashing each piece right after copying it, while it is still in cache: one pass over memory
// where a copy and then a checksum make two.
inline uint64_t CopyAndChecksum64(void* dst, const void* src, size_t size) {
  constexpr size_t kPiece = 64 << 10;  // well inside a core's L2
  if (size <= kPiece) {
    std::memcpy(dst, src, size);
    return Checksum64(dst, size);
  }
  Checksum64Stream sum;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t done = 0; done < size; done += kPiece) {
    const size_t n = size - done < kPiece ? size - done : kPiece;
    std::memcpy(d + done, s + done, n);
    sum.Update(d + done, n);
  }
  return sum.Digest();
}

}  // namespace strata
