// Helpers shared by the cross-process transfer tests: spawn peers, mint capabilities.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/strings.h"
#include "transfer/capability.h"
#include "transfer/peer_process.h"

namespace strata::transfer::testing_util {

inline constexpr char kSecret[] = "test-cluster-secret";
inline constexpr uint64_t kSegmentBytes = 8 << 20;

inline std::string PeerBinary() {
  const char* dir = std::getenv("STRATA_BINARY_DIR");
  return StrCat(dir ? dir : ".", "/tests/transfer/transfer_test_peer");
}

// A peer with one segment "seg" of kSegmentBytes, reachable over tcp and (unless `shm` is false)
// shm on host `host_id`.
inline std::unique_ptr<PeerProcess> SpawnPeer(uint64_t seed, bool shm = true,
                                              std::string host_id = "local",
                                              uint64_t bytes = kSegmentBytes) {
  static std::atomic<int> counter{0};
  PeerProcessOptions o;
  o.segments = {{"seg", bytes}};
  o.secret = kSecret;
  o.host_id = std::move(host_id);
  o.seed = seed;
  if (shm) {
    o.shm_socket_path =
        StrCat(::testing::TempDir(), "/strata-shm-", getpid(), "-", counter.fetch_add(1), ".sock");
  }
  std::vector<std::string> argv = {PeerBinary()};
  for (auto& a : PeerProcessArgs(o)) argv.push_back(a);
  auto p = PeerProcess::Spawn(std::move(argv), absl::Seconds(20));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

inline std::string Cap(uint64_t offset, uint64_t length, Access access = Access::kReadWrite,
                       std::string segment = "seg", absl::Duration ttl = absl::Minutes(5)) {
  return *IssueCapability(ClusterSecret(kSecret), {.segment = std::move(segment),
                                                   .offset = offset,
                                                   .length = length,
                                                   .access = access,
                                                   .expires = absl::Now() + ttl});
}

// A capability for the whole segment.
inline std::string WholeCap(Access access = Access::kReadWrite) {
  return Cap(0, kSegmentBytes, access);
}

}  // namespace strata::transfer::testing_util
