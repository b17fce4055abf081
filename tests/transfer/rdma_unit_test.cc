// The hardware-independent pieces of the rdma transport: side-channel messages, the MR cache,
// work-request splitting, completion classification and the QP state machine.
#include <gtest/gtest.h>

#include <map>

#include "transfer/rdma/mr_cache.h"
#include "transfer/rdma/rdma_plan.h"
#include "transfer/rdma/rdma_wire.h"

namespace strata::transfer::rdma {
namespace {

QpAddress Addr(uint32_t qpn) {
  QpAddress a{.qpn = qpn, .lid = 7, .psn = 0xabcdef, .mtu = 5};
  for (int i = 0; i < 16; ++i) a.gid[i] = static_cast<uint8_t>(i * 3 + qpn);
  return a;
}

TEST(RdmaWireTest, MessagesRoundTrip) {
  ConnectQps c{.qps = {Addr(1), Addr(2), Addr(3)}};
  auto c2 = DecodeConnectQps(Encode(c));
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(c2->qps, c.qps);

  ConnectQpsReply cr{.status = absl::OkStatus(), .qps = {Addr(9)}};
  auto cr2 = DecodeConnectQpsReply(Encode(cr));
  ASSERT_TRUE(cr2.ok());
  EXPECT_TRUE(cr2->status.ok());
  EXPECT_EQ(cr2->qps, cr.qps);

  Resolve r{.segment = "dram",
            .capability = std::string("\x01\x00\xff", 3),
            .access = Access::kWrite,
            .offset = 1ull << 40,
            .length = 4096};
  auto r2 = DecodeResolve(Encode(r));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->segment, "dram");
  EXPECT_EQ(r2->capability, r.capability);
  EXPECT_EQ(r2->access, Access::kWrite);
  EXPECT_EQ(r2->offset, r.offset);
  EXPECT_EQ(r2->length, 4096u);

  ResolveReply rr{.status = absl::PermissionDeniedError("expired"),
                  .addr = 0x7f0000001000,
                  .rkey = 0x1234,
                  .size = 1 << 20};
  auto rr2 = DecodeResolveReply(Encode(rr));
  ASSERT_TRUE(rr2.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(rr2->status));
  EXPECT_EQ(rr2->status.message(), "expired");
  EXPECT_EQ(rr2->addr, rr.addr);
  EXPECT_EQ(rr2->rkey, rr.rkey);
  EXPECT_EQ(rr2->size, rr.size);

  auto q2 = DecodeReconnectQp(Encode(ReconnectQp{.index = 3, .qp = Addr(4)}));
  ASSERT_TRUE(q2.ok());
  EXPECT_EQ(q2->index, 3u);
  EXPECT_EQ(q2->qp, Addr(4));
  auto qr2 = DecodeReconnectQpReply(Encode(ReconnectQpReply{.qp = Addr(5)}));
  ASSERT_TRUE(qr2.ok());
  EXPECT_EQ(qr2->qp, Addr(5));

  VerifyWrite v{.segment = "s", .capability = "c", .offset = 1, .length = 2, .checksum = 3};
  auto v2 = DecodeVerifyWrite(Encode(v));
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(v2->checksum, 3u);
  auto vr2 = DecodeVerifyReply(Encode(VerifyReply{absl::DataLossError("x")}));
  ASSERT_TRUE(vr2.ok());
  EXPECT_TRUE(absl::IsDataLoss(vr2->status));
}

TEST(RdmaWireTest, MalformedBodiesAreRefused) {
  const std::string good = Encode(ConnectQps{.qps = {Addr(1), Addr(2)}});
  // Every truncation fails, and so does trailing garbage.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodeConnectQps(good.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeConnectQps(good + "x").ok());
  // A QP count beyond the limit is refused before anything is allocated.
  std::string huge(4, '\xff');
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeConnectQps(huge).status()));
  // A string length pointing past the end.
  EXPECT_FALSE(DecodeResolve(std::string("\xff\x00seg", 5)).ok());
  // An access value that is not read/write/readwrite.
  std::string r = Encode(Resolve{.segment = "s", .capability = "c", .access = Access::kRead});
  r[2 + 1 + 2 + 1] = 9;  // access byte follows the two strings
  EXPECT_FALSE(DecodeResolve(r).ok());
  // A status code outside absl's range.
  std::string rr = Encode(ResolveReply{});
  rr[0] = 100;
  EXPECT_FALSE(DecodeResolveReply(rr).ok());
}

// A registrar that records calls and hands out fake regions.
struct FakeRegion : MemoryRegion {
  FakeRegion(uint64_t a, uint64_t l, uint32_t k, int* live) : a(a), l(l), k(k), live(live) {
    ++*live;
  }
  ~FakeRegion() override { --*live; }
  uint64_t addr() const override { return a; }
  uint64_t length() const override { return l; }
  uint32_t lkey() const override { return k; }
  uint32_t rkey() const override { return k; }
  uint64_t a, l;
  uint32_t k;
  int* live;
};

struct Registrar {
  int calls = 0;
  int live = 0;
  bool fail = false;
  MrCache::RegisterFn fn() {
    return [this](void* addr, uint64_t len,
                  uint32_t) -> absl::StatusOr<std::shared_ptr<MemoryRegion>> {
      if (fail) return absl::ResourceExhaustedError("pinned memory limit");
      ++calls;
      return std::make_shared<FakeRegion>(reinterpret_cast<uint64_t>(addr), len, calls, &live);
    };
  }
};

char* At(uint64_t a) { return reinterpret_cast<char*>(a); }

TEST(MrCacheTest, ReusesCoveringRegistrationsAndRoundsToPages) {
  Registrar reg;
  MrCache cache(reg.fn());
  auto a = cache.Get(At(0x10010), 100, kLocalWrite);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->addr(), 0x10000u);
  EXPECT_EQ((*a)->length(), 4096u);
  auto b = cache.Get(At(0x10800), 0x800, kLocalWrite);  // inside the same page: a hit
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(reg.calls, 1);
  auto c = cache.Get(At(0x10800), 0x1000, kLocalWrite);  // crosses into the next page: miss
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(reg.calls, 2);
  // Stronger access than cached: a new registration.
  auto d = cache.Get(At(0x10010), 100, kLocalWrite | kRemoteRead);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(reg.calls, 3);
  const MrCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 3);
  EXPECT_EQ(s.entries, 3u);
  EXPECT_FALSE(cache.Get(nullptr, 10, 0).ok());
  EXPECT_FALSE(cache.Get(At(0x1000), 0, 0).ok());
}

TEST(MrCacheTest, WidensToTheEnclosingSegment) {
  Registrar reg;
  MrCache cache(reg.fn(), {}, [](void* addr, uint64_t) -> std::pair<void*, uint64_t> {
    return {At(0x100000), 1 << 20};  // the whole "segment"
  });
  for (uint64_t off = 0; off < (1 << 20); off += 64 << 10) {
    ASSERT_TRUE(cache.Get(At(0x100000 + off), 64 << 10, kLocalWrite).ok());
  }
  EXPECT_EQ(reg.calls, 1);  // one registration served all 16 blocks
}

TEST(MrCacheTest, BuffersOutsideKnownRegionsAreRegisteredPerRequestOnly) {
  Registrar reg;
  MrCache cache(reg.fn(), {}, [](void* addr, uint64_t) -> std::pair<void*, uint64_t> {
    return {nullptr, 0};  // not inside any segment
  });
  auto a = cache.Get(At(0x10000), 4096, kLocalWrite);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reg.live, 1);
  a->reset();  // the request is done: deregistered at once, nothing stale stays cached
  EXPECT_EQ(reg.live, 0);
  ASSERT_TRUE(cache.Get(At(0x10000), 4096, kLocalWrite).ok());
  EXPECT_EQ(reg.calls, 2);
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().uncached, 2);
}

TEST(MrCacheTest, BoundedByEntriesAndBytesLeastRecentlyUsedFirst) {
  Registrar reg;
  MrCache cache(reg.fn(), {.max_entries = 3, .max_bytes = 1 << 20});
  ASSERT_TRUE(cache.Get(At(0x1000), 4096, 0).ok());
  ASSERT_TRUE(cache.Get(At(0x3000), 4096, 0).ok());
  ASSERT_TRUE(cache.Get(At(0x5000), 4096, 0).ok());
  ASSERT_TRUE(cache.Get(At(0x1000), 4096, 0).ok());  // touch the first: now 0x3000 is LRU
  ASSERT_TRUE(cache.Get(At(0x7000), 4096, 0).ok());  // evicts 0x3000
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(reg.live, 3);
  const int calls = reg.calls;
  ASSERT_TRUE(cache.Get(At(0x1000), 4096, 0).ok());
  EXPECT_EQ(reg.calls, calls);  // still cached
  ASSERT_TRUE(cache.Get(At(0x3000), 4096, 0).ok());
  EXPECT_EQ(reg.calls, calls + 1);  // was evicted
  // Bytes: a 1 MiB registration pushes out everything older.
  ASSERT_TRUE(cache.Get(At(0x200000), 1 << 20, 0).ok());
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_LE(cache.stats().bytes, 1u << 20);
}

TEST(MrCacheTest, InvalidateDropsOverlapsButInFlightUsersKeepTheirRegion) {
  Registrar reg;
  MrCache cache(reg.fn());
  auto held = cache.Get(At(0x10000), 8192, 0);  // an in-flight request holds this one
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(cache.Get(At(0x20000), 4096, 0).ok());
  ASSERT_TRUE(cache.Get(At(0x40000), 4096, 0).ok());
  EXPECT_EQ(cache.Invalidate(At(0x11000), 0x10000), 2u);  // overlaps 0x10000.. and 0x20000..
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(reg.live, 2);  // 0x20000 deregistered; 0x10000 still held by the request
  held->reset();
  EXPECT_EQ(reg.live, 1);
  // The next Get of the invalidated range registers afresh.
  const int calls = reg.calls;
  ASSERT_TRUE(cache.Get(At(0x10000), 4096, 0).ok());
  EXPECT_EQ(reg.calls, calls + 1);
  // A failed registration is reported and not cached.
  reg.fail = true;
  EXPECT_TRUE(absl::IsResourceExhausted(cache.Get(At(0x90000), 4096, 0).status()));
}

TEST(RdmaPlanTest, SplitsByMaxMessageSize) {
  EXPECT_TRUE(SplitTransfer(0, 1024).empty());
  auto one = SplitTransfer(1000, 1024);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].length, 1000u);
  auto chunks = SplitTransfer((4 << 20) + 5, 1 << 20);
  ASSERT_EQ(chunks.size(), 5u);
  uint64_t next = 0;
  for (const Chunk& c : chunks) {
    EXPECT_EQ(c.offset, next);
    EXPECT_LE(c.length, 1u << 20);
    next += c.length;
  }
  EXPECT_EQ(next, (4u << 20) + 5);
  EXPECT_EQ(chunks.back().length, 5u);
  // The 32-bit sge length caps a chunk even if the port allows more.
  auto big = SplitTransfer(5ull << 30, 1ull << 40);
  ASSERT_EQ(big.size(), 3u);
  EXPECT_EQ(big[0].length, 1u << 31);
}

TEST(RdmaPlanTest, ClassifiesCompletions) {
  EXPECT_EQ(ClassifyCompletion(WcStatus::kSuccess).code, absl::StatusCode::kOk);
  for (WcStatus s : {WcStatus::kRetryExceeded, WcStatus::kRnrRetryExceeded, WcStatus::kFlushed,
                     WcStatus::kRemoteOperational}) {
    const auto v = ClassifyCompletion(s);
    EXPECT_EQ(v.code, absl::StatusCode::kUnavailable) << WcStatusName(s);
    EXPECT_TRUE(v.retry);
    EXPECT_TRUE(v.qp_broken);
    EXPECT_FALSE(v.reresolve);
  }
  const auto access = ClassifyCompletion(WcStatus::kRemoteAccess);
  EXPECT_EQ(access.code, absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(access.reresolve);
  EXPECT_FALSE(ClassifyCompletion(WcStatus::kLocalProtection).retry);
  EXPECT_FALSE(ClassifyCompletion(WcStatus::kRemoteInvalid).retry);
}

TEST(RdmaPlanTest, QpStateMachineAllowsOnlyTheConnectionPath) {
  QpStateMachine m;
  EXPECT_FALSE(m.CanPost());
  EXPECT_FALSE(m.Transition(QpState::kRts).ok());  // RESET → RTS skips INIT/RTR
  EXPECT_FALSE(m.Transition(QpState::kRtr).ok());
  EXPECT_EQ(m.state(), QpState::kReset);
  ASSERT_TRUE(m.Transition(QpState::kInit).ok());
  EXPECT_FALSE(m.Transition(QpState::kRts).ok());
  ASSERT_TRUE(m.Transition(QpState::kRtr).ok());
  EXPECT_FALSE(m.CanPost());
  ASSERT_TRUE(m.Transition(QpState::kRts).ok());
  EXPECT_TRUE(m.CanPost());
  EXPECT_FALSE(m.Transition(QpState::kInit).ok());
  ASSERT_TRUE(m.Transition(QpState::kError).ok());
  EXPECT_FALSE(m.CanPost());
  EXPECT_FALSE(m.Transition(QpState::kInit).ok());  // ERR must go through RESET
  ASSERT_TRUE(m.Transition(QpState::kReset).ok());
  ASSERT_TRUE(m.Transition(QpState::kInit).ok());
}

}  // namespace
}  // namespace strata::transfer::rdma
