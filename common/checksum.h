// Payload and header checksums: xxh3-64 (ARCHITECTURE.md §3).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace strata {

inline uint64_t Checksum64(const void* data, size_t size) { return XXH3_64bits(data, size); }
inline uint64_t Checksum64(std::string_view data) { return Checksum64(data.data(), data.size()); }

// Streaming form, for payloads that arrive in pieces (layer by layer).
class Checksum64Stream {
 public:
  Checksum64Stream() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~Checksum64Stream() { XXH3_freeState(state_); }
  Checksum64Stream(const Checksum64Stream&) = delete;
  Checksum64Stream& operator=(const Checksum64Stream&) = delete;

  void Update(const void* data, size_t size) { XXH3_64bits_update(state_, data, size); }
  uint64_t Digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
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
