// Capabilities and segment bounds: what a remote peer may touch.
#include "transfer/capability.h"

#include <gtest/gtest.h>

#include <cstring>

#include "transfer/segment.h"

namespace strata::transfer {
namespace {

CapabilityGrant Grant(Access access = Access::kRead) {
  return {.segment = "dram",
          .offset = 4096,
          .length = 8192,
          .access = access,
          .expires = absl::Now() + absl::Minutes(1)};
}

TEST(CapabilityTest, IssuedTokenVerifiesForSubRanges) {
  ClusterSecret secret("s3cret");
  auto token = IssueCapability(secret, Grant(Access::kReadWrite));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_TRUE(VerifyCapability(secret, *token, "dram", 4096, 8192, Access::kRead).ok());
  EXPECT_TRUE(VerifyCapability(secret, *token, "dram", 5000, 100, Access::kWrite).ok());
  auto decoded = DecodeCapability(*token);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->segment, "dram");
  EXPECT_EQ(decoded->offset, 4096u);
  EXPECT_EQ(decoded->length, 8192u);
}

TEST(CapabilityTest, RefusesEveryViolationWithPermissionDenied) {
  ClusterSecret secret("s3cret");
  const std::string token = *IssueCapability(secret, Grant(Access::kRead));
  // Out of the granted range, on either side, and overflowing.
  EXPECT_TRUE(
      absl::IsPermissionDenied(VerifyCapability(secret, token, "dram", 4095, 10, Access::kRead)));
  EXPECT_TRUE(
      absl::IsPermissionDenied(VerifyCapability(secret, token, "dram", 4096, 8193, Access::kRead)));
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyCapability(secret, token, "dram", UINT64_MAX - 1, 10, Access::kRead)));
  // Wrong access, wrong segment, another secret.
  EXPECT_TRUE(
      absl::IsPermissionDenied(VerifyCapability(secret, token, "dram", 4096, 10, Access::kWrite)));
  EXPECT_TRUE(
      absl::IsPermissionDenied(VerifyCapability(secret, token, "gpu", 4096, 10, Access::kRead)));
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyCapability(ClusterSecret("other"), token, "dram", 4096, 10, Access::kRead)));
  // Expired.
  CapabilityGrant old = Grant();
  old.expires = absl::Now() - absl::Seconds(1);
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyCapability(secret, *IssueCapability(secret, old), "dram", 4096, 10, Access::kRead)));
  // Tampered: widen the length field; the MAC no longer matches.
  std::string forged = token;
  forged[18 + 3] ^= 0x01;
  EXPECT_TRUE(
      absl::IsPermissionDenied(VerifyCapability(secret, forged, "dram", 4096, 10, Access::kRead)));
  EXPECT_TRUE(absl::IsPermissionDenied(
      VerifyCapability(secret, "garbage", "dram", 4096, 10, Access::kRead)));
  EXPECT_TRUE(absl::IsPermissionDenied(VerifyCapability(secret, "", "dram", 0, 1, Access::kRead)));
}

TEST(SegmentRegistryTest, RegisterResolveUnregister) {
  SegmentRegistry registry;
  std::vector<char> mem(1000);
  ASSERT_TRUE(registry.Register(Segment::Host("a", mem.data(), mem.size())).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(registry.Register(Segment::Host("a", mem.data(), 10))));
  EXPECT_TRUE(absl::IsInvalidArgument(registry.Register(Segment::Host("", mem.data(), 10))));
  EXPECT_TRUE(absl::IsInvalidArgument(registry.Register(Segment::Host("b", nullptr, 10))));
  void* addr = nullptr;
  ASSERT_TRUE(registry.Resolve("a", 10, 990, &addr).ok());
  EXPECT_EQ(addr, mem.data() + 10);
  EXPECT_TRUE(absl::IsOutOfRange(registry.Resolve("a", 10, 991, &addr).status()));
  EXPECT_TRUE(absl::IsOutOfRange(registry.Resolve("a", UINT64_MAX, 2, &addr).status()));
  EXPECT_TRUE(absl::IsOutOfRange(registry.Resolve("a", 0, 0, &addr).status()));
  EXPECT_TRUE(absl::IsNotFound(registry.Resolve("zz", 0, 1, &addr).status()));
  ASSERT_TRUE(registry.Unregister("a").ok());
  EXPECT_TRUE(absl::IsNotFound(registry.Unregister("a")));
  EXPECT_TRUE(absl::IsNotFound(registry.Lookup("a").status()));
}

TEST(SegmentRegistryTest, SharedHostSegmentOutlivesUnregisterWhileReferenced) {
  auto seg = CreateSharedHostSegment("shared", 1 << 20);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_GE(seg->memfd, 0);
  SegmentRegistry registry;
  ASSERT_TRUE(registry.Register(*seg).ok());
  void* addr = nullptr;
  auto ref = registry.Resolve("shared", 0, 16, &addr);
  ASSERT_TRUE(ref.ok());
  seg = absl::InternalError("dropped");  // the caller's copy is gone
  ASSERT_TRUE(registry.Unregister("shared").ok());
  std::memset(addr, 0x5a, 16);  // still mapped: the reference keeps it alive
  EXPECT_EQ(static_cast<unsigned char*>(addr)[15], 0x5a);
}

}  // namespace
}  // namespace strata::transfer
