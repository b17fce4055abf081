#include "transfer/capability.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"

namespace strata::transfer {
namespace {

constexpr uint8_t kVersion = 1;
constexpr size_t kMacBytes = 32;
constexpr size_t kFixedBytes = 1 + 1 + 8 + 8 + 8 + 1;  // before the name

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

std::string_view AccessName(Access access) {
  switch (access) {
    case Access::kRead:
      return "read";
    case Access::kWrite:
      return "write";
    case Access::kReadWrite:
      return "read-write";
  }
  return "none";
}

absl::StatusOr<ClusterSecret> ClusterSecret::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string key, ReadSecretFile(path, "cluster secret"));
  return ClusterSecret(std::move(key));
}

std::string ClusterSecret::Mac(std::string_view data) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  // An empty key is legal for HMAC; OpenSSL wants a non-null pointer.
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), key_.empty() ? &kEmpty : key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &mac_len);
  return std::string(reinterpret_cast<char*>(mac), mac_len);
}

absl::StatusOr<std::string> IssueCapability(const ClusterSecret& secret,
                                            const CapabilityGrant& grant) {
  if (grant.segment.empty() || grant.segment.size() > 255) {
    return absl::InvalidArgumentError("capability: segment name must be 1..255 bytes");
  }
  if (grant.offset + grant.length < grant.offset) {
    return absl::InvalidArgumentError("capability: range overflows");
  }
  std::string token;
  token.reserve(kFixedBytes + grant.segment.size() + kMacBytes);
  token.push_back(static_cast<char>(kVersion));
  token.push_back(static_cast<char>(grant.access));
  const int64_t expires_ms =
      grant.expires == absl::InfiniteFuture() ? INT64_MAX : absl::ToUnixMillis(grant.expires);
  PutU64(token, static_cast<uint64_t>(expires_ms));
  PutU64(token, grant.offset);
  PutU64(token, grant.length);
  token.push_back(static_cast<char>(grant.segment.size()));
  token.append(grant.segment);
  token.append(secret.Mac(token));
  return token;
}

absl::StatusOr<CapabilityGrant> DecodeCapability(std::string_view token) {
  if (token.size() < kFixedBytes + kMacBytes) {
    return absl::PermissionDeniedError("capability: malformed token (too short)");
  }
  if (static_cast<uint8_t>(token[0]) != kVersion) {
    return absl::PermissionDeniedError("capability: unknown token version");
  }
  const size_t name_len = static_cast<uint8_t>(token[kFixedBytes - 1]);
  if (token.size() != kFixedBytes + name_len + kMacBytes) {
    return absl::PermissionDeniedError("capability: malformed token (length)");
  }
  CapabilityGrant g;
  const uint8_t access = static_cast<uint8_t>(token[1]);
  if (access < 1 || access > 3) return absl::PermissionDeniedError("capability: bad access");
  g.access = static_cast<Access>(access);
  const int64_t expires_ms = static_cast<int64_t>(GetU64(token.data() + 2));
  g.expires = expires_ms == INT64_MAX ? absl::InfiniteFuture() : absl::FromUnixMillis(expires_ms);
  g.offset = GetU64(token.data() + 10);
  g.length = GetU64(token.data() + 18);
  g.segment = std::string(token.substr(kFixedBytes, name_len));
  return g;
}

absl::Status VerifyCapability(const ClusterSecret& secret, std::string_view token,
                              std::string_view segment, uint64_t offset, uint64_t length,
                              Access needed, absl::Time now) {
  ASSIGN_OR_RETURN(CapabilityGrant g, DecodeCapability(token));
  const std::string_view body = token.substr(0, token.size() - kMacBytes);
  const std::string expected = secret.Mac(body);
  if (CRYPTO_memcmp(expected.data(), token.data() + body.size(), kMacBytes) != 0) {
    return absl::PermissionDeniedError("capability: bad MAC (not issued with this cluster secret)");
  }
  if (g.segment != segment) {
    return absl::PermissionDeniedError(
        StrCat("capability: issued for segment ", g.segment, ", not ", segment));
  }
  if (now >= g.expires) {
    return absl::PermissionDeniedError(
        StrCat("capability: expired ", absl::FormatDuration(now - g.expires), " ago"));
  }
  if ((static_cast<uint8_t>(g.access) & static_cast<uint8_t>(needed)) !=
      static_cast<uint8_t>(needed)) {
    return absl::PermissionDeniedError(StrCat("capability: grants ", AccessName(g.access),
                                              ", request needs ", AccessName(needed)));
  }
  if (length == 0 || offset < g.offset || offset + length < offset ||
      offset + length > g.offset + g.length) {
    return absl::PermissionDeniedError(StrCat("capability: range [", offset, ", +", length,
                                              ") is outside the granted [", g.offset, ", +",
                                              g.length, ")"));
  }
  return absl::OkStatus();
}

}  // namespace strata::transfer
