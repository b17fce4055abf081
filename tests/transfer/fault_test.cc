// The fault-injecting decorator between the engine and a real transport to a peer process:
// dropped, delayed, corrupted requests and cut links all end with a clear status in time.
#include <gtest/gtest.h>

#include "common/checksum.h"
#include "tests/transfer/peer_fixture.h"
#include "transfer/fault/fault_transport.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

using testing_util::WholeCap;

struct FaultSetup {
  std::unique_ptr<PeerProcess> proc;
  std::unique_ptr<TransferEngine> engine;
  std::shared_ptr<Peer> peer;
  std::shared_ptr<FaultCounters> counters = std::make_shared<FaultCounters>();
};

void Start(FaultSetup& s, TransportKind kind, FaultPolicy policy) {
  s.proc = testing_util::SpawnPeer(policy.seed);
  ASSERT_NE(s.proc, nullptr);
  auto counters = s.counters;
  auto engine = TransferEngine::Create(
      {.host_id = "local",
       .secret = ClusterSecret(testing_util::kSecret),
       .force_transport = kind,
       .wrap_transport = [policy, counters](std::unique_ptr<Transport> t) {
         return std::make_unique<FaultInjectingTransport>(std::move(t), policy, counters);
       }});
  ASSERT_TRUE(engine.ok()) << engine.status();
  s.engine = *std::move(engine);
  auto peer = s.engine->OpenPeer(s.proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();
  s.peer = *peer;
}

// n reads of `len` bytes, each with the checksum of the peer's initial pattern.
std::vector<TransferOp> CheckedReads(std::vector<std::vector<uint8_t>>& bufs, int n, uint64_t len,
                                     uint64_t seed) {
  bufs.assign(n, std::vector<uint8_t>(len));
  std::vector<TransferOp> ops;
  for (int i = 0; i < n; ++i) {
    const uint64_t off = i * len;
    std::vector<uint8_t> expected(len);
    for (uint64_t j = 0; j < len; ++j) expected[j] = PatternByte(seed, off + j);
    ops.push_back({.op = OpKind::kRead,
                   .local = bufs[i].data(),
                   .segment = "seg",
                   .offset = off,
                   .length = len,
                   .capability = WholeCap(),
                   .checksum = Checksum64(expected.data(), len)});
  }
  return ops;
}

class FaultTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(FaultTest, DroppedRequestsEndWithDeadlineExceeded) {
  FaultSetup s;
  ASSERT_NO_FATAL_FAILURE(Start(s, GetParam(), {.drop = 0.3, .seed = 21}));
  std::vector<std::vector<uint8_t>> bufs;
  const absl::Time start = absl::Now();
  auto batch = s.engine->Submit(*s.peer, CheckedReads(bufs, 40, 4096, 21),
                                {.timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  int ok = 0, timed_out = 0;
  for (size_t i = 0; i < batch->size(); ++i) {
    if (batch->status(i).ok()) ++ok;
    if (absl::IsDeadlineExceeded(batch->status(i))) ++timed_out;
  }
  EXPECT_EQ(ok + timed_out, 40);
  EXPECT_EQ(timed_out, s.counters->dropped.load());
  EXPECT_GT(timed_out, 0);
  EXPECT_GT(ok, 0);
}

TEST_P(FaultTest, DelayBeyondTheDeadlineTimesOutWithinTheDeadline) {
  FaultSetup s;
  ASSERT_NO_FATAL_FAILURE(
      Start(s, GetParam(), {.delay = 1.0, .delay_by = absl::Milliseconds(800), .seed = 22}));
  std::vector<std::vector<uint8_t>> bufs;
  auto batch = s.engine->Submit(*s.peer, CheckedReads(bufs, 10, 4096, 22),
                                {.timeout = absl::Milliseconds(200)});
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)));
  for (size_t i = 0; i < batch->size(); ++i) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(batch->status(i))) << batch->status(i);
  }
  // A short delay within the deadline is just slow, and correct.
  auto slow =
      s.engine->Submit(*s.peer, CheckedReads(bufs, 10, 4096, 22), {.timeout = absl::Seconds(20)});
  ASSERT_TRUE(slow->Wait(absl::Seconds(30)));
  EXPECT_TRUE(slow->FirstError().ok()) << slow->FirstError();
}

TEST_P(FaultTest, CorruptedReadsAndWritesAreCaughtByChecksums) {
  FaultSetup s;
  ASSERT_NO_FATAL_FAILURE(Start(s, GetParam(), {.corrupt = 1.0, .seed = 23}));
  std::vector<std::vector<uint8_t>> bufs;
  auto reads =
      s.engine->Submit(*s.peer, CheckedReads(bufs, 10, 8192, 23), {.timeout = absl::Seconds(20)});
  ASSERT_TRUE(reads->Wait(absl::Seconds(30)));
  for (size_t i = 0; i < reads->size(); ++i) {
    EXPECT_TRUE(absl::IsDataLoss(reads->status(i))) << reads->status(i);
  }
  std::vector<uint8_t> data(8192, 0x11);
  auto writes = s.engine->Submit(*s.peer,
                                 {{.op = OpKind::kWrite,
                                   .local = data.data(),
                                   .segment = "seg",
                                   .offset = 0,
                                   .length = data.size(),
                                   .capability = WholeCap(),
                                   .checksum = Checksum64(data.data(), data.size())}},
                                 {.timeout = absl::Seconds(20)});
  ASSERT_TRUE(writes->Wait(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsDataLoss(writes->status(0))) << writes->status(0);
  EXPECT_EQ(data[0], 0x11) << "the caller's buffer is never the one corrupted";
  EXPECT_EQ(s.counters->corrupted.load(), 11);
}

TEST_P(FaultTest, KilledLinksFailInFlightRequestsAndRecover) {
  FaultSetup s;
  ASSERT_NO_FATAL_FAILURE(Start(s, GetParam(), {.kill = 0.05, .seed = 24}));
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<uint8_t>> bufs;
    auto batch = s.engine->Submit(*s.peer, CheckedReads(bufs, 60, 32 << 10, 24),
                                  {.timeout = absl::Seconds(20)});
    ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
    for (size_t i = 0; i < batch->size(); ++i) {
      const absl::Status st = batch->status(i);
      EXPECT_TRUE(st.ok() || absl::IsUnavailable(st)) << st;
    }
    absl::SleepFor(absl::Milliseconds(120));  // let the channel re-dial (rate-limited)
  }
  EXPECT_GT(s.counters->killed.load(), 0);
}

// Without the decorator: shm verifies reads while it copies, tcp leaves it to the engine; either
// way a read whose bytes do not match the checksum asked for ends with DataLoss, and one that
// matches (a length of many copy pieces plus a ragged tail) arrives intact.
TEST_P(FaultTest, ReadsAreCheckedAgainstTheirChecksumInTransitOrAfter) {
  auto proc = testing_util::SpawnPeer(24);
  ASSERT_NE(proc, nullptr);
  auto engine = TransferEngine::Create({.host_id = "local",
                                        .secret = ClusterSecret(testing_util::kSecret),
                                        .force_transport = GetParam()});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto peer = (*engine)->OpenPeer(proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TransferOp> ops = CheckedReads(bufs, 2, (1 << 20) + 4097, 24);
  ops[1].checksum = *ops[1].checksum ^ 1;
  auto batch = (*engine)->Submit(**peer, std::move(ops), {.timeout = absl::Seconds(20)});
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
  EXPECT_TRUE(batch->status(0).ok()) << batch->status(0);
  EXPECT_TRUE(absl::IsDataLoss(batch->status(1))) << batch->status(1);
  for (uint64_t j = 0; j < bufs[0].size(); j += 4093) {
    ASSERT_EQ(bufs[0][j], PatternByte(24, j)) << "byte " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, FaultTest,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) {
                           return std::string(TransportKindName(info.param));
                         });

}  // namespace
}  // namespace strata::transfer
