// Thousands of random reads and writes from several threads to several peer processes, verified
// by checksums against a shadow copy, on every transport available here (shm, tcp).
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "common/checksum.h"
#include "tests/transfer/peer_fixture.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

using testing_util::kSegmentBytes;

class ConcurrencyTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(ConcurrencyTest, RandomReadsAndWritesAcrossPeersMatchShadowCopies) {
  constexpr int kPeers = 2;
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  constexpr int kOpsPerBatch = 16;  // 2 peers x 4 threads x 40 x 16 = 5120 requests
  constexpr uint64_t kRegion = kSegmentBytes / kThreads;
  constexpr uint64_t kSlot = kRegion / kOpsPerBatch;

  std::vector<std::unique_ptr<PeerProcess>> procs;
  for (int p = 0; p < kPeers; ++p) {
    procs.push_back(testing_util::SpawnPeer(100 + p));
    ASSERT_NE(procs.back(), nullptr);
  }
  auto engine = TransferEngine::Create({.host_id = "local",
                                        .secret = ClusterSecret(testing_util::kSecret),
                                        .force_transport = GetParam()});
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::shared_ptr<Peer>> peers;
  for (auto& proc : procs) {
    auto peer = (*engine)->OpenPeer(proc->spec());
    ASSERT_TRUE(peer.ok()) << peer.status();
    EXPECT_EQ((*peer)->transport(), GetParam());
    peers.push_back(*peer);
  }
  const std::string cap = testing_util::WholeCap();

  std::atomic<int> failures{0};
  std::atomic<int> requests{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(1234 + t);
    const uint64_t base = t * kRegion;
    // shadow[p]: what this thread's region of peer p must hold.
    std::vector<std::vector<uint8_t>> shadow(kPeers, std::vector<uint8_t>(kRegion));
    for (int p = 0; p < kPeers; ++p) {
      for (uint64_t i = 0; i < kRegion; ++i) shadow[p][i] = PatternByte(100 + p, base + i);
    }
    for (int round = 0; round < kRounds; ++round) {
      const int p = static_cast<int>(rng() % kPeers);
      std::vector<TransferOp> ops;
      std::vector<std::vector<uint8_t>> buffers(kOpsPerBatch);
      std::vector<uint64_t> offsets(kOpsPerBatch);
      for (int k = 0; k < kOpsPerBatch; ++k) {
        // Disjoint slots: requests of one batch may run in any order.
        const uint64_t len = 1 + rng() % (64 << 10);
        const uint64_t off = k * kSlot + rng() % (kSlot - len + 1);
        offsets[k] = off;
        buffers[k].resize(len);
        TransferOp op{.op = (rng() % 2) ? OpKind::kWrite : OpKind::kRead,
                      .local = buffers[k].data(),
                      .segment = "seg",
                      .offset = base + off,
                      .length = len,
                      .capability = cap};
        if (op.op == OpKind::kWrite) {
          for (auto& b : buffers[k]) b = static_cast<uint8_t>(rng());
        }
        if (rng() % 2) {  // half of the requests carry a checksum for end-to-end checks
          op.checksum = op.op == OpKind::kWrite ? Checksum64(buffers[k].data(), len)
                                                : Checksum64(shadow[p].data() + off, len);
        }
        ops.push_back(std::move(op));
      }
      std::vector<OpKind> kinds;
      for (auto& op : ops) kinds.push_back(op.op);
      auto batch = (*engine)->Submit(*peers[p], std::move(ops), {.timeout = absl::Seconds(60)});
      if (!batch->Wait(absl::Seconds(90))) {
        failures.fetch_add(1);
        ADD_FAILURE() << "batch did not complete";
        return;
      }
      for (int k = 0; k < kOpsPerBatch; ++k) {
        requests.fetch_add(1);
        if (!batch->status(k).ok()) {
          failures.fetch_add(1);
          ADD_FAILURE() << "request failed: " << batch->status(k);
          continue;
        }
        uint8_t* expected = shadow[p].data() + offsets[k];
        if (kinds[k] == OpKind::kWrite) {
          std::memcpy(expected, buffers[k].data(), buffers[k].size());
        } else if (Checksum64(buffers[k].data(), buffers[k].size()) !=
                   Checksum64(expected, buffers[k].size())) {
          failures.fetch_add(1);
          ADD_FAILURE() << "read returned wrong bytes at offset " << base + offsets[k];
        }
      }
    }
    // Finally the whole region must equal the shadow, on every peer.
    for (int p = 0; p < kPeers; ++p) {
      std::vector<uint8_t> all(kRegion);
      auto batch = (*engine)->Submit(*peers[p], {{.op = OpKind::kRead,
                                                  .local = all.data(),
                                                  .segment = "seg",
                                                  .offset = base,
                                                  .length = kRegion,
                                                  .capability = cap}});
      ASSERT_TRUE(batch->Wait(absl::Seconds(60)));
      ASSERT_TRUE(batch->status(0).ok()) << batch->status(0);
      EXPECT_EQ(Checksum64(all.data(), kRegion), Checksum64(shadow[p].data(), kRegion))
          << "peer " << p << " region " << t;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(requests.load(), kThreads * kRounds * kOpsPerBatch);
}

INSTANTIATE_TEST_SUITE_P(Transports, ConcurrencyTest,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) {
                           return std::string(TransportKindName(info.param));
                         });

TEST(TransportChoiceTest, SameHostUsesShmOtherHostUsesTcp) {
  auto proc = testing_util::SpawnPeer(7);
  ASSERT_NE(proc, nullptr);
  for (const auto& [host, expected] : {std::pair{std::string("local"), TransportKind::kShm},
                                       std::pair{std::string("elsewhere"), TransportKind::kTcp}}) {
    auto engine =
        TransferEngine::Create({.host_id = host, .secret = ClusterSecret(testing_util::kSecret)});
    ASSERT_TRUE(engine.ok());
    auto peer = (*engine)->OpenPeer(proc->spec());
    ASSERT_TRUE(peer.ok()) << peer.status();
    EXPECT_EQ((*peer)->transport(), expected) << "engine on host " << host;
    std::vector<uint8_t> buf(4096);
    auto batch = (*engine)->Submit(**peer, {{.op = OpKind::kRead,
                                             .local = buf.data(),
                                             .segment = "seg",
                                             .offset = 1000,
                                             .length = buf.size(),
                                             .capability = testing_util::WholeCap(Access::kRead)}});
    ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
    ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], PatternByte(7, 1000 + i));
  }
}

TEST(LocalSegmentTest, LocalBufferResolvedFromARegisteredSegment) {
  auto proc = testing_util::SpawnPeer(9, /*shm=*/false);
  ASSERT_NE(proc, nullptr);
  auto engine =
      TransferEngine::Create({.host_id = "x", .secret = ClusterSecret(testing_util::kSecret)});
  ASSERT_TRUE(engine.ok());
  std::vector<uint8_t> mem(1 << 16);
  ASSERT_TRUE((*engine)->segments().Register(Segment::Host("pool", mem.data(), mem.size())).ok());
  auto peer = (*engine)->OpenPeer(proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto batch = (*engine)->Submit(**peer, {{.op = OpKind::kRead,
                                           .local_segment = "pool",
                                           .local_offset = 100,
                                           .segment = "seg",
                                           .offset = 0,
                                           .length = 1000,
                                           .capability = testing_util::WholeCap()},
                                          {.op = OpKind::kRead,
                                           .local_segment = "pool",
                                           .local_offset = 65000,
                                           .segment = "seg",
                                           .offset = 0,
                                           .length = 1000,
                                           .capability = testing_util::WholeCap()}});
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
  EXPECT_TRUE(batch->status(0).ok()) << batch->status(0);
  EXPECT_TRUE(absl::IsOutOfRange(batch->status(1))) << batch->status(1);
  EXPECT_EQ(mem[100], PatternByte(9, 0));
  EXPECT_EQ(mem[1099], PatternByte(9, 999));
}

}  // namespace
}  // namespace strata::transfer
