// The rdma transport end to end — engine, side channel, QPs, MR cache, completions, deadlines,
// retries, reconnects — against the in-process fake NIC (fake_verbs.h). Everything but the
// ibverbs calls themselves runs here.
#include <gtest/gtest.h>

#include <random>

#include "common/checksum.h"
#include "tests/transfer/fake_verbs.h"
#include "transfer/transfer_engine.h"
#include "transfer/transfer_server.h"

namespace strata::transfer {
namespace {

using testing_util::FakeFabric;

constexpr uint64_t kSegBytes = 4 << 20;

class RdmaFakeNicTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_.resize(kSegBytes);
    std::mt19937_64 gen(42);
    for (auto& b : mem_) b = static_cast<uint8_t>(gen());
    ASSERT_TRUE(registry_.Register(Segment::Host("seg", mem_.data(), mem_.size())).ok());
    auto server = TransferServer::Start(
        &registry_, {.host_id = "owner", .secret = secret_, .rdma_context = fabric_->NewContext()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->has_rdma());
  }

  std::unique_ptr<TransferEngine> Engine(uint64_t max_msg = 1ull << 30) {
    auto fabric = fabric_;
    auto engine = TransferEngine::Create(
        {.host_id = "client",
         .secret = secret_,
         .rdma_context = [fabric,
                          max_msg]() -> absl::StatusOr<std::shared_ptr<rdma::VerbsContext>> {
           return fabric->NewContext(max_msg);
         }});
    EXPECT_TRUE(engine.ok()) << engine.status();
    return *std::move(engine);
  }

  std::shared_ptr<Peer> Open(TransferEngine& engine) {
    auto peer = engine.OpenPeer(server_->spec("owner"));
    EXPECT_TRUE(peer.ok()) << peer.status();
    EXPECT_EQ((*peer)->transport(), TransportKind::kRdma);
    return *peer;
  }

  std::string Cap(Access access = Access::kReadWrite, uint64_t offset = 0,
                  uint64_t length = kSegBytes, absl::Duration ttl = absl::Minutes(5)) {
    return *IssueCapability(secret_, {.segment = "seg",
                                      .offset = offset,
                                      .length = length,
                                      .access = access,
                                      .expires = absl::Now() + ttl});
  }

  // One read of [offset, offset + length) of "seg" into `local`, with a read capability.
  std::shared_ptr<Batch> ReadSeg(TransferEngine& engine, Peer& peer, void* local, uint64_t offset,
                                 uint64_t length, absl::Duration timeout) {
    return engine.Submit(peer,
                         {{.op = OpKind::kRead,
                           .local = local,
                           .segment = "seg",
                           .offset = offset,
                           .length = length,
                           .capability = Cap(Access::kRead)}},
                         {.timeout = timeout});
  }

  ClusterSecret secret_{"rdma-secret"};
  std::shared_ptr<FakeFabric> fabric_ = std::make_shared<FakeFabric>();
  std::vector<uint8_t> mem_;
  SegmentRegistry registry_;
  std::unique_ptr<TransferServer> server_;
};

TEST_F(RdmaFakeNicTest, RandomReadsAndWritesAcrossQpsAreExact) {
  // A small max message size so requests are split over several work requests and QPs.
  auto engine = Engine(/*max_msg=*/64 << 10);
  auto peer = Open(*engine);
  const std::string cap = Cap();
  std::mt19937_64 gen(7);
  std::vector<uint8_t> mirror = mem_;
  for (int round = 0; round < 20; ++round) {
    std::vector<std::vector<uint8_t>> bufs(16);
    std::vector<TransferOp> ops;
    // Disjoint ranges per round: writes and reads of one round never overlap.
    const uint64_t stripe = kSegBytes / bufs.size();
    for (size_t i = 0; i < bufs.size(); ++i) {
      const uint64_t len = 1 + gen() % (stripe / 2);
      const uint64_t off = i * stripe + gen() % (stripe - len);
      bufs[i].resize(len);
      const bool write = gen() % 2;
      if (write) {
        for (auto& b : bufs[i]) b = static_cast<uint8_t>(gen());
        std::memcpy(mirror.data() + off, bufs[i].data(), len);
      }
      ops.push_back(
          {.op = write ? OpKind::kWrite : OpKind::kRead,
           .local = bufs[i].data(),
           .segment = "seg",
           .offset = off,
           .length = len,
           .capability = cap,
           .checksum = write ? std::optional<uint64_t>(Checksum64(bufs[i].data(), len))
                             : std::optional<uint64_t>(Checksum64(mirror.data() + off, len))});
    }
    auto batch = engine->Submit(*peer, ops, {.timeout = absl::Seconds(20)});
    ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
    ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].op == OpKind::kRead) {
        ASSERT_EQ(0, std::memcmp(bufs[i].data(), mirror.data() + ops[i].offset, ops[i].length));
      }
    }
  }
  EXPECT_EQ(0, std::memcmp(mem_.data(), mirror.data(), mem_.size()));
  EXPECT_GT(fabric_->work_requests(), 320);  // requests really were split
}

TEST_F(RdmaFakeNicTest, LocalSegmentIsRegisteredOnceAndDroppedOnUnregister) {
  auto engine = Engine();
  auto peer = Open(*engine);
  std::vector<uint8_t> local(1 << 20);
  ASSERT_TRUE(engine->segments().Register(Segment::Host("local", local.data(), local.size())).ok());
  const std::string cap = Cap(Access::kRead);
  const int64_t before = fabric_->registrations();
  for (int i = 0; i < 16; ++i) {
    auto batch = engine->Submit(*peer, {{.op = OpKind::kRead,
                                         .local_segment = "local",
                                         .local_offset = static_cast<uint64_t>(i) << 16,
                                         .segment = "seg",
                                         .offset = static_cast<uint64_t>(i) << 16,
                                         .length = 64 << 10,
                                         .capability = cap}});
    ASSERT_TRUE(batch->Wait(absl::Seconds(20)));
    ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  }
  EXPECT_EQ(0, std::memcmp(local.data(), mem_.data(), local.size()));
  // One registration for the 16 local blocks, one for the remote segment.
  EXPECT_EQ(fabric_->registrations() - before, 2);
  const int64_t live = fabric_->live_regions();
  ASSERT_TRUE(engine->segments().Unregister("local").ok());
  EXPECT_EQ(fabric_->live_regions(), live - 1);
}

TEST_F(RdmaFakeNicTest, CapabilityAndBoundsViolationsAreRefused) {
  auto engine = Engine();
  auto peer = Open(*engine);
  std::vector<uint8_t> buf(8192);
  auto run = [&](OpKind op, uint64_t off, std::string cap, std::string seg = "seg") {
    auto batch = engine->Submit(*peer, {{.op = op,
                                         .local = buf.data(),
                                         .segment = std::move(seg),
                                         .offset = off,
                                         .length = buf.size(),
                                         .capability = std::move(cap)}});
    EXPECT_TRUE(batch->Wait(absl::Seconds(20)));
    return batch->status(0);
  };
  const int64_t refused = server_->requests_refused();
  EXPECT_TRUE(absl::IsPermissionDenied(run(OpKind::kWrite, 0, Cap(Access::kRead))));
  EXPECT_TRUE(absl::IsPermissionDenied(run(OpKind::kRead, 0, "forged")));
  EXPECT_TRUE(absl::IsPermissionDenied(
      run(OpKind::kRead, 0,
          *IssueCapability(ClusterSecret("other"), {.segment = "seg",
                                                    .offset = 0,
                                                    .length = kSegBytes,
                                                    .access = Access::kRead,
                                                    .expires = absl::Now() + absl::Minutes(1)}))));
  // A token for [0, 64K) does not cover [64K, +8K).
  EXPECT_TRUE(
      absl::IsPermissionDenied(run(OpKind::kRead, 64 << 10, Cap(Access::kRead, 0, 64 << 10))));
  // A token covering more than the segment: the owner refuses the range.
  EXPECT_FALSE(run(OpKind::kRead, kSegBytes, Cap(Access::kRead, 0, 2 * kSegBytes)).ok());
  EXPECT_TRUE(
      absl::IsNotFound(run(OpKind::kRead, 0,
                           *IssueCapability(secret_, {.segment = "nope",
                                                      .offset = 0,
                                                      .length = 1 << 20,
                                                      .access = Access::kRead,
                                                      .expires = absl::Now() + absl::Minutes(1)}),
                           "nope")));
  EXPECT_GE(server_->requests_refused() - refused, 4);
  EXPECT_TRUE(run(OpKind::kRead, 0, Cap(Access::kRead)).ok());
}

TEST_F(RdmaFakeNicTest, TransientErrorsAreRetriedOnRebuiltQps) {
  auto engine = Engine(/*max_msg=*/256 << 10);
  auto peer = Open(*engine);
  const int64_t qps = fabric_->qps_created();
  fabric_->FailNext(3, rdma::WcStatus::kRetryExceeded);
  std::vector<uint8_t> buf(1 << 20);
  auto batch = ReadSeg(*engine, *peer, buf.data(), 4096, buf.size(), absl::Seconds(20));
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
  ASSERT_TRUE(batch->FirstError().ok()) << batch->FirstError();
  EXPECT_EQ(0, std::memcmp(buf.data(), mem_.data() + 4096, buf.size()));
  EXPECT_GT(fabric_->qps_created(), qps);  // broken QPs were rebuilt (both ends)

  // More failures than attempts: a clear Unavailable, not a hang.
  fabric_->FailNext(1000, rdma::WcStatus::kRetryExceeded);
  auto bad = ReadSeg(*engine, *peer, buf.data(), 0, 4096, absl::Seconds(20));
  ASSERT_TRUE(bad->Wait(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsUnavailable(bad->status(0))) << bad->status(0);
  fabric_->FailNext(0, rdma::WcStatus::kRetryExceeded);
}

TEST_F(RdmaFakeNicTest, StalledNicEndsWithDeadlineAndNeverWritesTheBufferLate) {
  auto engine = Engine();
  auto peer = Open(*engine);
  fabric_->SetStalled(true);
  std::vector<uint8_t> buf(64 << 10, 0xEE);
  const absl::Time start = absl::Now();
  auto batch = ReadSeg(*engine, *peer, buf.data(), 0, buf.size(), absl::Milliseconds(300));
  ASSERT_TRUE(batch->Wait(absl::Seconds(20)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(batch->status(0))) << batch->status(0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  fabric_->SetStalled(false);
  // The held work request was flushed, not executed: the buffer is untouched.
  EXPECT_EQ(std::count(buf.begin(), buf.end(), 0xEE), static_cast<long>(buf.size()));
  // The channel recovers (QPs rebuilt) for the next request.
  auto again = ReadSeg(*engine, *peer, buf.data(), 0, buf.size(), absl::Seconds(20));
  ASSERT_TRUE(again->Wait(absl::Seconds(30)));
  ASSERT_TRUE(again->FirstError().ok()) << again->FirstError();
  EXPECT_EQ(0, std::memcmp(buf.data(), mem_.data(), buf.size()));
}

TEST_F(RdmaFakeNicTest, UnregisteredSegmentLosesItsRkey) {
  auto engine = Engine();
  auto peer = Open(*engine);
  std::vector<uint8_t> buf(4096);
  const std::string cap = Cap(Access::kRead);
  auto read = [&] {
    auto batch = engine->Submit(*peer,
                                {{.op = OpKind::kRead,
                                  .local = buf.data(),
                                  .segment = "seg",
                                  .offset = 0,
                                  .length = buf.size(),
                                  .capability = cap}},
                                {.timeout = absl::Seconds(20)});
    EXPECT_TRUE(batch->Wait(absl::Seconds(30)));
    return batch->status(0);
  };
  ASSERT_TRUE(read().ok());
  ASSERT_TRUE(registry_.Unregister("seg").ok());
  // The cached rkey is dead (the owner deregistered the region); the re-resolve finds no segment.
  const absl::Status st = read();
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  // Re-registered (new memory): the next read re-resolves and sees the new bytes.
  std::vector<uint8_t> fresh(kSegBytes, 0x5A);
  ASSERT_TRUE(registry_.Register(Segment::Host("seg", fresh.data(), fresh.size())).ok());
  ASSERT_TRUE(read().ok());
  EXPECT_EQ(buf[0], 0x5A);
  ASSERT_TRUE(registry_.Unregister("seg").ok());
}

TEST_F(RdmaFakeNicTest, CorruptWriteIsCaughtByTheOwnerAndCloseCancelsWhatTheNicHolds) {
  auto engine = Engine();
  auto peer = Open(*engine);
  std::vector<uint8_t> buf(8192, 1);
  auto batch = engine->Submit(*peer, {{.op = OpKind::kWrite,
                                       .local = buf.data(),
                                       .segment = "seg",
                                       .offset = 0,
                                       .length = buf.size(),
                                       .capability = Cap(Access::kWrite),
                                       .checksum = Checksum64(buf.data(), buf.size()) + 1}});
  ASSERT_TRUE(batch->Wait(absl::Seconds(20)));
  EXPECT_TRUE(absl::IsDataLoss(batch->status(0))) << batch->status(0);

  // Closing the engine's peer with requests stuck in the NIC cancels them promptly.
  fabric_->SetStalled(true);
  auto stuck = ReadSeg(*engine, *peer, buf.data(), 0, buf.size(), absl::Seconds(60));
  peer.reset();  // closes the channel
  ASSERT_TRUE(stuck->Wait(absl::Seconds(20)));
  EXPECT_TRUE(absl::IsCancelled(stuck->status(0))) << stuck->status(0);
  fabric_->SetStalled(false);
}

}  // namespace
}  // namespace strata::transfer
