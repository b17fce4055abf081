#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/check.h"

namespace strata {
namespace {

const EVP_MD* Sha256Md() {
  // Explicit fetch: avoids the provider lookup that EVP_sha256() implies on every init.
  static const EVP_MD* md = [] {
    EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? static_cast<const EVP_MD*>(fetched) : EVP_sha256();
  }();
  return md;
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  STRATA_CHECK(ctx_ != nullptr, "EVP_MD_CTX_new failed");
  Reset();
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Reset() {
  STRATA_CHECK(EVP_DigestInit_ex(ctx_, Sha256Md(), nullptr) == 1, "SHA-256 init failed");
}

void Sha256::Update(const void* data, size_t size) {
  STRATA_CHECK(EVP_DigestUpdate(ctx_, data, size) == 1, "SHA-256 update failed");
}

Sha256Digest Sha256::Final() {
  Sha256Digest digest;
  unsigned int len = 0;
  STRATA_CHECK(EVP_DigestFinal_ex(ctx_, digest.data(), &len) == 1 && len == digest.size(),
               "SHA-256 final failed");
  return digest;
}

Sha256Digest Sha256::Hash(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.Final();
}

}  // namespace strata
