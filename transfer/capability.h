// Capabilities: the right to touch one range of one segment, for a while, issued by its owner.
//
// A capability token is opaque bytes:
//   version u8 = 1 | access u8 | expires_unix_ms i64 | offset u64 | length u64 |
//   name_len u8 | segment name | HMAC-SHA256(cluster secret, all the preceding bytes) [32]
// (integers little-endian). The owner of a segment (the cache server, issue #4) calls
// IssueCapability() when it grants a lease and puts the token in the proto `Lease.capability`;
// the client passes it with every transfer request; the side that enforces access (the owner's
// TransferServer for tcp/rdma, the mapping side for shm) calls VerifyCapability() on every
// request. A token covers any sub-range of its range with the access it grants.
//
// Peers also authenticate each other with the same cluster secret when a connection opens
// (transfer/wire.h), so a token is only ever accepted from a peer that holds the secret.
// Trust model: every holder of the secret can mint tokens; capabilities protect against stale
// leases, out-of-range offsets and wrong-direction access (bugs and races), not against a
// malicious holder of the secret. Keep the secret file 0600.
//
// Thread safety: all functions are thread-safe; ClusterSecret is immutable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::transfer {

enum class Access : uint8_t { kRead = 1, kWrite = 2, kReadWrite = 3 };

std::string_view AccessName(Access access);

// The shared key of a cluster. An empty secret is allowed (tests, single-user dev boxes) and
// still produces and checks MACs, so code paths are the same.
class ClusterSecret {
 public:
  ClusterSecret() = default;
  explicit ClusterSecret(std::string key) : key_(std::move(key)) {}

  // Reads the whole file (trailing whitespace stripped). NotFound / PermissionDenied / ... from
  // the file system; InvalidArgument when the file is empty.
  static absl::StatusOr<ClusterSecret> FromFile(const std::string& path);

  const std::string& key() const { return key_; }

  // HMAC-SHA256(key, data): 32 raw bytes.
  std::string Mac(std::string_view data) const;

 private:
  std::string key_;
};

// What a token grants.
struct CapabilityGrant {
  std::string segment;
  uint64_t offset = 0;
  uint64_t length = 0;
  Access access = Access::kRead;
  absl::Time expires = absl::InfinitePast();
};

// Mints a token for `grant`. InvalidArgument for an empty or >255-byte segment name, or a
// range that overflows uint64.
absl::StatusOr<std::string> IssueCapability(const ClusterSecret& secret,
                                            const CapabilityGrant& grant);

// Parses a token without checking its MAC (for logs and diagnostics only).
absl::StatusOr<CapabilityGrant> DecodeCapability(std::string_view token);

// Checks that `token` is a well-formed token minted with `secret`, not expired at `now`, naming
// `segment`, covering [offset, offset + length) and granting `needed`. Every failure is
// PermissionDenied with a message that says which check failed (the token's MAC itself is never
// printed). Does not log: the caller logs refusals with its peer's identity.
absl::Status VerifyCapability(const ClusterSecret& secret, std::string_view token,
                              std::string_view segment, uint64_t offset, uint64_t length,
                              Access needed, absl::Time now = absl::Now());

}  // namespace strata::transfer
