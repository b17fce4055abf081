// Payload and header checksums: xxh3-64 (ARCHITECTURE.md §3).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
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

}  // namespace strata
