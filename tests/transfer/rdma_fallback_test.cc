// No machine here has an RDMA device: a peer that offers rdma is reached over tcp instead, and
// forcing rdma fails with a clear reason.
#include <gtest/gtest.h>

#include "transfer/transfer_engine.h"
#include "transfer/transfer_server.h"

namespace strata::transfer {
namespace {

TEST(RdmaFallbackTest, PeerOfferingRdmaIsReachedOverTcpWhenNoDeviceExists) {
  const ClusterSecret secret("s");
  SegmentRegistry registry;
  std::vector<uint8_t> mem(1 << 20);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(registry.Register(Segment::Host("seg", mem.data(), mem.size())).ok());
  auto server = TransferServer::Start(&registry, {.host_id = "h2", .secret = secret});
  ASSERT_TRUE(server.ok()) << server.status();
  PeerSpec spec = (*server)->spec("rdma-peer");
  // The peer advertises rdma first (side channel on its tcp port), as a ConnectX host would.
  spec.endpoints.insert(spec.endpoints.begin(), {.kind = TransportKind::kRdma,
                                                 .address = spec.endpoints[0].address,
                                                 .host_id = "h2",
                                                 .rdma_gid = std::string(16, '\0'),
                                                 .rdma_qp_count = 4});

  auto engine = TransferEngine::Create({.host_id = "h1", .secret = secret});
  ASSERT_TRUE(engine.ok());
  const auto available = (*engine)->available_transports();
  EXPECT_EQ(std::count(available.begin(), available.end(), TransportKind::kRdma), 0);
  auto peer = (*engine)->OpenPeer(spec);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ((*peer)->transport(), TransportKind::kTcp);
  std::vector<uint8_t> buf(4096);
  auto cap = IssueCapability(secret, {.segment = "seg",
                                      .offset = 0,
                                      .length = mem.size(),
                                      .access = Access::kRead,
                                      .expires = absl::Now() + absl::Minutes(1)});
  auto batch = (*engine)->Submit(**peer, {{.op = OpKind::kRead,
                                           .local = buf.data(),
                                           .segment = "seg",
                                           .offset = 4096,
                                           .length = buf.size(),
                                           .capability = *cap}});
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
  ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  EXPECT_EQ(0, std::memcmp(buf.data(), mem.data() + 4096, buf.size()));

  // Forcing rdma is refused with the reason, not silently downgraded.
  auto forced = TransferEngine::Create(
      {.host_id = "h1", .secret = secret, .force_transport = TransportKind::kRdma});
  ASSERT_TRUE(forced.ok());
  auto refused = (*forced)->OpenPeer(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("rdma"), std::string::npos);
}

}  // namespace
}  // namespace strata::transfer
