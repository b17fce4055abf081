// Failures between two processes: a peer that dies mid-batch, a peer that freezes, capability
// and bounds violations, a client with the wrong cluster secret. Every request must end with a
// clear status within its deadline; refused requests must not disturb the connection.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/transfer/peer_fixture.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

using testing_util::Cap;
using testing_util::kSegmentBytes;
using testing_util::WholeCap;

std::unique_ptr<TransferEngine> Engine(TransportKind kind,
                                       std::string secret = testing_util::kSecret) {
  auto engine = TransferEngine::Create(
      {.host_id = "local", .secret = ClusterSecret(std::move(secret)), .force_transport = kind});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// Waits until every thread of `pid` is in the stopped state ('T' in /proc/<pid>/task/*/stat):
// kill(SIGSTOP) returns before a thread that is running takes the stop, and such a thread could
// still answer a request sent right after.
bool WaitUntilStopped(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (int attempt = 0; attempt < 500; ++attempt) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(dir)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') {
        all = false;
        break;
      }
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<TransferOp> Reads(std::vector<std::vector<uint8_t>>& bufs, int n, uint64_t len) {
  bufs.assign(n, std::vector<uint8_t>(len));
  std::vector<TransferOp> ops;
  for (int i = 0; i < n; ++i) {
    ops.push_back({.op = OpKind::kRead,
                   .local = bufs[i].data(),
                   .segment = "seg",
                   .offset = (i * len) % (kSegmentBytes - len),
                   .length = len,
                   .capability = WholeCap()});
  }
  return ops;
}

TEST(PeerFailureTest, PeerKilledMidBatchFailsEveryRequestWithUnavailable) {
  auto proc = testing_util::SpawnPeer(1, /*shm=*/false);
  ASSERT_NE(proc, nullptr);
  auto engine = Engine(TransportKind::kTcp);
  auto peer = engine->OpenPeer(proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();
  // Freeze the peer so the batch is certainly in flight, then kill it.
  proc->Signal(SIGSTOP);
  std::vector<std::vector<uint8_t>> bufs;
  const absl::Duration timeout = absl::Seconds(20);
  const absl::Time start = absl::Now();
  auto batch = engine->Submit(**peer, Reads(bufs, 64, 1 << 20), {.timeout = timeout});
  absl::SleepFor(absl::Milliseconds(100));
  proc->Signal(SIGKILL);
  ASSERT_TRUE(batch->Wait(timeout + absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, timeout) << "death must be noticed, not waited out";
  for (size_t i = 0; i < batch->size(); ++i) {
    EXPECT_TRUE(absl::IsUnavailable(batch->status(i))) << i << ": " << batch->status(i);
  }
  // Later requests fail fast and clearly too (the re-dial is refused).
  auto again = engine->Submit(**peer, Reads(bufs, 4, 4096), {.timeout = absl::Seconds(5)});
  ASSERT_TRUE(again->Wait(absl::Seconds(10)));
  for (size_t i = 0; i < again->size(); ++i) {
    EXPECT_TRUE(absl::IsUnavailable(again->status(i))) << again->status(i);
  }
}

TEST(PeerFailureTest, FrozenPeerTimesOutThenRecoversWithCorrectData) {
  auto proc = testing_util::SpawnPeer(2, /*shm=*/false);
  ASSERT_NE(proc, nullptr);
  auto engine = Engine(TransportKind::kTcp);
  auto peer = engine->OpenPeer(proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();
  proc->Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntilStopped(proc->pid())) << "the peer did not stop";
  std::vector<std::vector<uint8_t>> bufs;
  const absl::Time start = absl::Now();
  auto batch =
      engine->Submit(**peer, Reads(bufs, 32, 64 << 10), {.timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (size_t i = 0; i < batch->size(); ++i) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(batch->status(i)) || absl::IsUnavailable(batch->status(i)))
        << batch->status(i);
  }
  // The peer wakes up and answers the stale requests; those answers must not land anywhere,
  // and new requests must get their own, correct bytes.
  proc->Signal(SIGCONT);
  std::vector<std::vector<uint8_t>> fresh;
  std::vector<TransferOp> ops = Reads(fresh, 32, 64 << 10);
  for (auto& op : ops) op.offset += 17;
  auto later = engine->Submit(**peer, std::move(ops), {.timeout = absl::Seconds(20)});
  ASSERT_TRUE(later->Wait(absl::Seconds(30)));
  ASSERT_TRUE(later->FirstError().ok()) << later->FirstError();
  for (int i = 0; i < 32; ++i) {
    const uint64_t off = (i * (64 << 10)) % (kSegmentBytes - (64 << 10)) + 17;
    for (size_t j = 0; j < fresh[i].size(); j += 997) {
      ASSERT_EQ(fresh[i][j], PatternByte(2, off + j)) << "request " << i << " byte " << j;
    }
  }
}

class ViolationTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(ViolationTest, OutOfBoundsAndCapabilityViolationsAreRefused) {
  auto proc = testing_util::SpawnPeer(3);
  ASSERT_NE(proc, nullptr);
  auto engine = Engine(GetParam());
  auto peer = engine->OpenPeer(proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<uint8_t> buf(8192, 0xab);
  auto op = [&](OpKind kind, uint64_t offset, uint64_t len, std::string cap,
                std::string segment = "seg") {
    return TransferOp{.op = kind,
                      .local = buf.data(),
                      .segment = std::move(segment),
                      .offset = offset,
                      .length = len,
                      .capability = std::move(cap)};
  };
  const std::string other_secret_cap = *IssueCapability(
      ClusterSecret("not-the-cluster-secret"), {.segment = "seg",
                                                .offset = 0,
                                                .length = 4096,
                                                .access = Access::kReadWrite,
                                                .expires = absl::Now() + absl::Minutes(1)});
  std::vector<TransferOp> ops = {
      op(OpKind::kRead, 0, 4096, Cap(0, 4096, Access::kRead)),    // 0 ok
      op(OpKind::kRead, 4000, 200, Cap(0, 4096, Access::kRead)),  // 1 beyond grant
      op(OpKind::kWrite, 0, 100, Cap(0, 4096, Access::kRead)),    // 2 wrong access
      op(OpKind::kRead, 0, 100,
         Cap(0, 4096, Access::kRead, "seg", -absl::Seconds(1))),        // 3 expired
      op(OpKind::kRead, 0, 100, other_secret_cap),                      // 4 bad MAC
      op(OpKind::kRead, 0, 100, "garbage"),                             // 5 malformed
      op(OpKind::kRead, 0, 100, Cap(0, 4096, Access::kRead, "other")),  // 6 wrong segment
      op(OpKind::kRead, kSegmentBytes - 100, 200,
         Cap(0, 2 * kSegmentBytes, Access::kRead)),  // 7 out of bounds
      op(OpKind::kWrite, 0, 4096, Cap(0, 4096, Access::kWrite, "nope"),
         "nope"),                                                       // 8 no such segment
      op(OpKind::kWrite, 4096, 4096, Cap(4096, 4096, Access::kWrite)),  // 9 ok after refusals
  };
  std::vector<uint8_t> written(4096, 0xab);  // buf is also a read target in this batch
  ops[9].local = written.data();
  auto batch = engine->Submit(**peer, std::move(ops), {.timeout = absl::Seconds(20)});
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)));
  EXPECT_TRUE(batch->status(0).ok()) << batch->status(0);
  for (int i : {1, 2, 3, 4, 5, 6}) {
    EXPECT_TRUE(absl::IsPermissionDenied(batch->status(i))) << i << ": " << batch->status(i);
  }
  EXPECT_TRUE(absl::IsOutOfRange(batch->status(7))) << batch->status(7);
  EXPECT_TRUE(absl::IsNotFound(batch->status(8))) << batch->status(8);
  EXPECT_TRUE(batch->status(9).ok()) << batch->status(9);
  // The refused write (2) did not land; the allowed one (9) did.
  std::vector<uint8_t> check(8192);
  auto verify = engine->Submit(**peer, {{.op = OpKind::kRead,
                                         .local = check.data(),
                                         .segment = "seg",
                                         .offset = 0,
                                         .length = 8192,
                                         .capability = WholeCap()}});
  ASSERT_TRUE(verify->Wait(absl::Seconds(30)));
  ASSERT_TRUE(verify->FirstError().ok());
  EXPECT_EQ(check[0], PatternByte(3, 0));
  EXPECT_EQ(check[4096], 0xab);
}

INSTANTIATE_TEST_SUITE_P(Transports, ViolationTest,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) {
                           return std::string(TransportKindName(info.param));
                         });

TEST(AuthenticationTest, WrongClusterSecretCannotConnect) {
  auto proc = testing_util::SpawnPeer(4);
  ASSERT_NE(proc, nullptr);
  for (TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    auto engine = Engine(kind, "wrong-secret");
    auto peer = engine->OpenPeer(proc->spec());
    ASSERT_FALSE(peer.ok()) << TransportKindName(kind);
    EXPECT_TRUE(absl::IsUnavailable(peer.status())) << peer.status();
  }
}

}  // namespace
}  // namespace strata::transfer
