// The tcp transport's lanes (transfer.tcp.threads_per_peer receiving threads, each owning a share
// of the connections): every layout moves every byte, each request's status lands at its own
// index in the batch, and light traffic next to bulk traffic still completes.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "common/checksum.h"
#include "tests/transfer/peer_fixture.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

using testing_util::kSegmentBytes;

struct Layout {
  int connections;
  int threads;
};

class TcpLanesTest : public ::testing::TestWithParam<Layout> {
 protected:
  // A peer process (segment "seg" holding PatternByte(seed, offset)) reached over tcp with this
  // test's lane layout.
  void Connect(uint64_t seed) {
    proc_ = testing_util::SpawnPeer(seed, /*shm=*/false);
    ASSERT_NE(proc_, nullptr);
    auto engine = TransferEngine::Create({.host_id = "local",
                                          .secret = ClusterSecret(testing_util::kSecret),
                                          .force_transport = TransportKind::kTcp,
                                          .tcp_connections_per_peer = GetParam().connections,
                                          .tcp_threads_per_peer = GetParam().threads});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto peer = engine_->OpenPeer(proc_->spec());
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = std::move(*peer);
  }
  std::unique_ptr<PeerProcess> proc_;
  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<Peer> peer_;
};

TEST_P(TcpLanesTest, MixedBatchesMoveEveryByteAndReportPerRequest) {
  ASSERT_NO_FATAL_FAILURE(Connect(7));
  const std::string cap = testing_util::WholeCap();

  // Eight 1 MiB slots: the first four are written, the last four read (and still hold the
  // peer's pattern); then everything is read back.
  constexpr uint64_t kSlot = kSegmentBytes / 8;
  std::mt19937_64 rng(GetParam().connections * 100 + GetParam().threads);
  std::vector<std::vector<uint8_t>> bufs(8);
  std::vector<TransferOp> ops;
  for (int k = 0; k < 8; ++k) {
    bufs[k].resize(k % 2 ? kSlot : 4096 + k);  // large and small requests interleaved
    const bool write = k < 4;
    if (write) {
      for (auto& b : bufs[k]) b = static_cast<uint8_t>(rng());
    }
    ops.push_back({.op = write ? OpKind::kWrite : OpKind::kRead,
                   .local = bufs[k].data(),
                   .segment = "seg",
                   .offset = k * kSlot,
                   .length = bufs[k].size(),
                   .capability = cap});
    if (k == 5) {  // a refused request in the middle of the batch: its error is its own
      ops.push_back({.op = OpKind::kRead,
                     .local = bufs[k].data(),
                     .segment = "no-such-segment",
                     .offset = 0,
                     .length = 16,
                     .capability = cap});
    }
  }
  auto batch = engine_->Submit(*peer_, std::move(ops), {.timeout = absl::Seconds(30)});
  ASSERT_TRUE(batch->Wait(absl::Seconds(60)));
  for (int i = 0; i < 9; ++i) {
    if (i == 6) {
      EXPECT_FALSE(batch->status(i).ok()) << "request " << i;
    } else {
      EXPECT_TRUE(batch->status(i).ok()) << "request " << i << ": " << batch->status(i);
    }
  }
  for (int k = 4; k < 8; ++k) {  // reads: the peer's pattern
    for (size_t i = 0; i < bufs[k].size(); i += 997) {
      ASSERT_EQ(bufs[k][i], PatternByte(7, k * kSlot + i)) << "slot " << k << " byte " << i;
    }
  }
  // Read the written slots back, split in 64 KiB requests that spread over every lane.
  for (int k = 0; k < 4; ++k) {
    std::vector<uint8_t> back(bufs[k].size());
    std::vector<TransferOp> reads;
    for (uint64_t off = 0; off < back.size(); off += 64 << 10) {
      const uint64_t len = std::min<uint64_t>(64 << 10, back.size() - off);
      reads.push_back({.op = OpKind::kRead,
                       .local = back.data() + off,
                       .segment = "seg",
                       .offset = k * kSlot + off,
                       .length = len,
                       .capability = cap,
                       .checksum = Checksum64(bufs[k].data() + off, len)});
    }
    auto rb = engine_->Submit(*peer_, std::move(reads));
    ASSERT_TRUE(rb->Wait(absl::Seconds(60)));
    EXPECT_TRUE(rb->FirstError().ok()) << rb->FirstError();
    EXPECT_EQ(back, bufs[k]) << "slot " << k;
  }
}

TEST_P(TcpLanesTest, SmallRequestsBesideBulkReadsAllComplete) {
  ASSERT_NO_FATAL_FAILURE(Connect(9));
  const std::string cap = testing_util::WholeCap(Access::kRead);
  std::atomic<int> bad{0};
  auto reader = [&](uint64_t length, int rounds) {
    std::vector<uint8_t> buf(length * 4);
    for (int r = 0; r < rounds; ++r) {
      std::vector<TransferOp> ops;
      for (int k = 0; k < 4; ++k) {
        const uint64_t off = (uint64_t(r * 4 + k) * length) % (kSegmentBytes - length);
        ops.push_back({.op = OpKind::kRead,
                       .local = buf.data() + k * length,
                       .segment = "seg",
                       .offset = off,
                       .length = length,
                       .capability = cap});
      }
      const std::vector<TransferOp> copy = ops;
      auto b = engine_->Submit(*peer_, std::move(ops));
      if (!b->Wait(absl::Seconds(60)) || !b->FirstError().ok()) {
        bad.fetch_add(1);
        return;
      }
      for (int k = 0; k < 4; ++k) {
        if (buf[k * length + length / 2] != PatternByte(9, copy[k].offset + length / 2)) {
          bad.fetch_add(1);
        }
      }
    }
  };
  std::thread bulk1(reader, 2 << 20, 20), bulk2(reader, 1 << 20, 40), small(reader, 512, 400);
  bulk1.join();
  bulk2.join();
  small.join();
  EXPECT_EQ(bad.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TcpLanesTest,
                         ::testing::Values(Layout{1, 1}, Layout{4, 4}, Layout{5, 3}, Layout{2, 8}),
                         [](const auto& info) {
                           return StrCat(info.param.connections, "conns_", info.param.threads,
                                         "threads");
                         });

}  // namespace
}  // namespace strata::transfer
