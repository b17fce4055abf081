// SHA-256 over OpenSSL's EVP interface, with the digest fetched once per process and the context
// reused, so hashing many short messages (block keys) costs little more than the compression.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

struct evp_md_ctx_st;

namespace strata {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256. Not thread-safe; use one object per thread. Reset() starts a new message;
// Final() finishes it (the object must be Reset() before the next Update()).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Reset();
  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  Sha256Digest Final();

  // One-shot helper.
  static Sha256Digest Hash(std::string_view data);

 private:
  evp_md_ctx_st* ctx_;
};

}  // namespace strata
