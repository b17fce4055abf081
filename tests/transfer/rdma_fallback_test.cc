// No machine here has an RDMA device: a peer that offers rdma is reached over tcp instead, and
// forcing rdma fails with a clear reason.
#include <gtest/gtest.h>

#include "tests/transfer/fake_verbs.h"
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

// Reads `n` bytes at `offset` through `engine` and checks them against `mem`.
void ReadAndCheck(TransferEngine& engine, Peer& peer, const ClusterSecret& secret,
                  const std::vector<uint8_t>& mem, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> buf(n);
  auto cap = IssueCapability(secret, {.segment = "seg",
                                      .offset = 0,
                                      .length = mem.size(),
                                      .access = Access::kRead,
                                      .expires = absl::Now() + absl::Minutes(1)});
  auto batch = engine.Submit(peer, {{.op = OpKind::kRead,
                                     .local = buf.data(),
                                     .segment = "seg",
                                     .offset = offset,
                                     .length = n,
                                     .capability = *cap}});
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
  ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  EXPECT_EQ(0, std::memcmp(buf.data(), mem.data() + offset, n));
}

std::function<absl::StatusOr<std::shared_ptr<rdma::VerbsContext>>()> NoDevice() {
  return []() -> absl::StatusOr<std::shared_ptr<rdma::VerbsContext>> {
    return absl::UnavailableError("rdma: no RDMA device with an active port (test)");
  };
}

// Mixed peers: an rdma-capable owner (advertising rdma) and a client without a device; and an
// rdma-capable client talking to an owner that advertises rdma but cannot serve it. Both end
// up on tcp; two rdma-capable ends use rdma.
TEST(RdmaFallbackTest, MixedPeersFallBackToTcpBothWays) {
  const ClusterSecret secret("s");
  auto fabric = std::make_shared<testing_util::FakeFabric>();
  SegmentRegistry registry;
  std::vector<uint8_t> mem(1 << 20);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<uint8_t>(i * 13 + 1);
  ASSERT_TRUE(registry.Register(Segment::Host("seg", mem.data(), mem.size())).ok());
  auto rdma_owner = TransferServer::Start(
      &registry, {.host_id = "h2", .secret = secret, .rdma_context = fabric->NewContext()});
  ASSERT_TRUE(rdma_owner.ok()) << rdma_owner.status();
  auto plain_owner = TransferServer::Start(
      &registry, {.host_id = "h3", .secret = secret, .rdma_context = nullptr});
  ASSERT_TRUE(plain_owner.ok()) << plain_owner.status();
  ASSERT_TRUE((*rdma_owner)->has_rdma());

  const PeerSpec rdma_spec = (*rdma_owner)->spec("rdma-owner");
  ASSERT_EQ(std::count_if(rdma_spec.endpoints.begin(), rdma_spec.endpoints.end(),
                          [](const Endpoint& e) { return e.kind == TransportKind::kRdma; }),
            1);
  // The plain owner is made to advertise rdma (a misconfigured or downgraded host).
  PeerSpec plain_spec = (*plain_owner)->spec("plain-owner");
  plain_spec.endpoints.push_back({.kind = TransportKind::kRdma,
                                  .address = plain_spec.endpoints[0].address,
                                  .host_id = "h3",
                                  .rdma_gid = std::string(16, '\1'),
                                  .rdma_qp_count = 4});

  // 1. Client without a device → rdma owner: tcp.
  auto plain_client =
      TransferEngine::Create({.host_id = "h1", .secret = secret, .rdma_context = NoDevice()});
  ASSERT_TRUE(plain_client.ok());
  auto p1 = (*plain_client)->OpenPeer(rdma_spec);
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_EQ((*p1)->transport(), TransportKind::kTcp);
  ReadAndCheck(**plain_client, **p1, secret, mem, 12345, 70000);

  // 2. rdma client → owner that advertises rdma but whose side channel refuses it: tcp.
  auto rdma_client = TransferEngine::Create(
      {.host_id = "h1",
       .secret = secret,
       .rdma_context = [fabric]() -> absl::StatusOr<std::shared_ptr<rdma::VerbsContext>> {
         return fabric->NewContext();
       }});
  ASSERT_TRUE(rdma_client.ok());
  const auto available = (*rdma_client)->available_transports();
  EXPECT_EQ(std::count(available.begin(), available.end(), TransportKind::kRdma), 1);
  auto p2 = (*rdma_client)->OpenPeer(plain_spec);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ((*p2)->transport(), TransportKind::kTcp);
  ReadAndCheck(**rdma_client, **p2, secret, mem, 777, 4096);

  // 3. Both ends have rdma: rdma.
  auto p3 = (*rdma_client)->OpenPeer(rdma_spec);
  ASSERT_TRUE(p3.ok()) << p3.status();
  EXPECT_EQ((*p3)->transport(), TransportKind::kRdma);
  const int64_t wrs = fabric->work_requests();
  ReadAndCheck(**rdma_client, **p3, secret, mem, 4096, 100000);
  EXPECT_GT(fabric->work_requests(), wrs);  // the bytes really went through the (fake) NIC
}

// The engine's own segments are reached through the cuda transport; without one (no GPU, or a
// build without CUDA) opening the local peer fails with the reason instead of picking another
// transport (no other transport serves LocalPeerSpec()).
TEST(RdmaFallbackTest, LocalPeerNeedsTheCudaTransport) {
  auto engine = TransferEngine::Create({.host_id = "h1", .secret = ClusterSecret("s")});
  ASSERT_TRUE(engine.ok());
  const auto available = (*engine)->available_transports();
  const bool has_cuda = std::count(available.begin(), available.end(), TransportKind::kCuda) == 1;
  auto peer = (*engine)->OpenPeer((*engine)->LocalPeerSpec());
  if (has_cuda) {
    ASSERT_TRUE(peer.ok()) << peer.status();
    EXPECT_EQ((*peer)->transport(), TransportKind::kCuda);
  } else {
    ASSERT_FALSE(peer.ok());
    EXPECT_NE(std::string(peer.status().message()).find("cuda:"), std::string::npos)
        << peer.status();
  }
}

}  // namespace
}  // namespace strata::transfer
