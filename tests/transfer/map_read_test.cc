// TransferEngine::MapReads: reads in place from a peer process whose memory is mapped (shm),
// checked as copied reads are, and refused as Unimplemented by transports that copy.
#include <gtest/gtest.h>

#include "common/checksum.h"
#include "tests/transfer/peer_fixture.h"
#include "transfer/fault/fault_transport.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

using testing_util::Cap;
using testing_util::kSegmentBytes;
using testing_util::WholeCap;

constexpr uint64_t kSeed = 31;

std::unique_ptr<TransferEngine> Engine(TransportKind kind, bool faulty = false) {
  EngineOptions o{
      .host_id = "local", .secret = ClusterSecret(testing_util::kSecret), .force_transport = kind};
  if (faulty) {
    o.wrap_transport = [](std::unique_ptr<Transport> t) {
      return std::make_unique<FaultInjectingTransport>(std::move(t), FaultPolicy{},
                                                       std::make_shared<FaultCounters>());
    };
  }
  auto engine = TransferEngine::Create(std::move(o));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

uint64_t PatternChecksum(uint64_t offset, uint64_t length) {
  std::vector<uint8_t> expected(length);
  for (uint64_t j = 0; j < length; ++j) expected[j] = PatternByte(kSeed, offset + j);
  return Checksum64(expected.data(), length);
}

TransferOp Read(uint64_t offset, uint64_t length, std::string capability = WholeCap()) {
  return {.op = OpKind::kRead,
          .segment = "seg",
          .offset = offset,
          .length = length,
          .capability = std::move(capability),
          .checksum = PatternChecksum(offset, length)};
}

TEST(MapReadTest, ShmReadsInPlaceWithEveryCheckOfACopiedRead) {
  auto proc = testing_util::SpawnPeer(kSeed);
  ASSERT_NE(proc, nullptr);
  auto engine = Engine(TransportKind::kShm);
  ASSERT_NE(engine, nullptr);
  auto peer = engine->OpenPeer(proc->spec());
  ASSERT_TRUE(peer.ok()) << peer.status();

  std::vector<TransferOp> ops = {Read(0, 3 << 20), Read(4 << 20, (1 << 20) + 4097),
                                 Read(4096, 4096), Read(kSegmentBytes - 100, 200),
                                 Read(8192, 4096, Cap(8192, 4096, Access::kWrite))};
  ops[2].checksum = *ops[2].checksum ^ 1;
  ops[3].checksum.reset();
  std::vector<absl::StatusOr<MappedBytes>> mapped = engine->MapReads(**peer, ops);
  ASSERT_EQ(mapped.size(), ops.size());
  for (size_t i : {0, 1}) {
    ASSERT_TRUE(mapped[i].ok()) << i << ": " << mapped[i].status();
    const MappedBytes& m = *mapped[i];
    ASSERT_EQ(m.bytes.size(), ops[i].length);
    EXPECT_GE(m.bytes.data(), m.region.data());
    EXPECT_LE(m.bytes.data() + m.bytes.size(), m.region.data() + m.region.size());
    EXPECT_EQ(m.region.size(), kSegmentBytes);
    EXPECT_EQ(m.bytes.data() - m.region.data(), static_cast<ptrdiff_t>(ops[i].offset));
    for (uint64_t j = 0; j < m.bytes.size(); j += 4093) {
      ASSERT_EQ(m.bytes[j], PatternByte(kSeed, ops[i].offset + j)) << "op " << i << " byte " << j;
    }
  }
  EXPECT_EQ(mapped[0]->region.data(), mapped[1]->region.data());  // one mapping per segment
  EXPECT_TRUE(absl::IsDataLoss(mapped[2].status())) << mapped[2].status();
  EXPECT_TRUE(absl::IsOutOfRange(mapped[3].status()) ||
              absl::IsPermissionDenied(mapped[3].status()))
      << mapped[3].status();
  EXPECT_TRUE(absl::IsPermissionDenied(mapped[4].status())) << mapped[4].status();

  // A write cannot be mapped; a deadline already passed is DeadlineExceeded.
  TransferOp write = Read(0, 64);
  write.op = OpKind::kWrite;
  EXPECT_TRUE(absl::IsInvalidArgument(engine->MapReads(**peer, {&write, 1})[0].status()));
  const TransferOp late = Read(0, 64);
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      engine->MapReads(**peer, {&late, 1}, absl::ZeroDuration())[0].status()));

  // The owner keeps the bytes mapped after the peer and the engine are gone.
  MappedBytes kept = *mapped[0];
  mapped.clear();
  peer->reset();
  engine.reset();
  for (uint64_t j = 0; j < kept.bytes.size(); j += 65537) {
    ASSERT_EQ(kept.bytes[j], PatternByte(kSeed, j)) << "byte " << j;
  }
}

TEST(MapReadTest, TransportsThatCopyRefuseToMap) {
  auto proc = testing_util::SpawnPeer(kSeed);
  ASSERT_NE(proc, nullptr);
  for (const auto& [kind, faulty] :
       {std::pair{TransportKind::kTcp, false}, std::pair{TransportKind::kShm, true}}) {
    SCOPED_TRACE(std::string(TransportKindName(kind)) +
                 (faulty ? " behind the fault decorator" : ""));
    auto engine = Engine(kind, faulty);
    ASSERT_NE(engine, nullptr);
    auto peer = engine->OpenPeer(proc->spec());
    ASSERT_TRUE(peer.ok()) << peer.status();
    const std::vector<TransferOp> ops = {Read(0, 4096), Read(4096, 4096)};
    for (const auto& m : engine->MapReads(**peer, ops)) {
      EXPECT_TRUE(absl::IsUnimplemented(m.status())) << m.status();
    }
  }
}

}  // namespace
}  // namespace strata::transfer
