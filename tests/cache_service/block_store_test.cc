// The block store as its users rely on it: round trips, checksums, warm restart, corruption,
// eviction (LRU, prefix-aware, pins, demotion), leases, tenancy and quotas, full tiers.
#include "cache_service/block_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "tests/cache_service/store_test_util.h"

namespace strata::cache {
namespace {

using testing_util::Chain;
using testing_util::FreshDir;
using testing_util::Get;
using testing_util::Ns;
using testing_util::Payload;
using testing_util::Put;

constexpr uint64_t kSlot = 64 << 10;
constexpr size_t kBytes = 60000;  // not a multiple of 4096: exercises padding
constexpr int kOk = 0;
constexpr int kDataLoss = static_cast<int>(absl::StatusCode::kDataLoss);
constexpr int kExhausted = static_cast<int>(absl::StatusCode::kResourceExhausted);
constexpr int kExists = static_cast<int>(absl::StatusCode::kAlreadyExists);

class BlockStoreTest : public ::testing::Test {
 protected:
  StoreOptions Options(uint32_t dram_slots, uint32_t ssd_slots,
                       WritePolicy policy = WritePolicy::kWriteThrough) {
    StoreOptions o;
    o.server_id = "test";
    o.data_dir = dir_;
    o.slot_bytes = kSlot;
    o.dram_capacity_bytes = dram_slots * kSlot;
    o.ssd_capacity_bytes = ssd_slots * kSlot;
    o.ssd_slots_per_file = 4;
    o.write_policy = policy;
    o.dram_high_watermark = o.dram_low_watermark = 1.0;
    o.ssd_high_watermark = o.ssd_low_watermark = 1.0;
    o.lease_ttl = absl::Seconds(10);
    o.now_ms = [this] { return now_.load(); };
    o.background_sweeper = false;
    return o;
  }
  std::unique_ptr<BlockStore> OpenStore(StoreOptions o) {
    auto store = BlockStore::Open(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  v1::GetStatsResponse Stats(BlockStore& s) {
    v1::GetStatsResponse r;
    s.GetStats(&r);
    return r;
  }
  const v1::TierStats& TierOf(const v1::GetStatsResponse& s, v1::Tier t) {
    for (const auto& ts : s.tiers()) {
      if (ts.tier() == t) return ts;
    }
    static v1::TierStats none;
    return none;
  }
  void Tick(int64_t ms = 1) { now_ += ms; }

  std::string dir_ = FreshDir("store");
  std::atomic<int64_t> now_{1'700'000'000'000};
  const Namespace ns_ = Ns("tenant-a");
};

// Regression: a fresh host has no data directory; Open must create it with its parents.
TEST_F(BlockStoreTest, OpenCreatesAMissingDataDirectory) {
  StoreOptions o = Options(4, 4);
  o.data_dir = dir_ + "/not/yet/there";
  auto store = OpenStore(std::move(o));
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/not/yet/there/index"));
}

TEST_F(BlockStoreTest, PutThenLookupReturnsLongestPrefixWithCorrectBytes) {
  auto store = OpenStore(Options(16, 0));
  const auto keys = Chain(ns_, 6, 1);
  const auto put = Put(*store, ns_, {keys.begin(), keys.begin() + 4}, kBytes);
  EXPECT_EQ(put.codes, std::vector<int>(4, kOk));
  EXPECT_FALSE(put.durable);  // no SSD tier
  const auto got = Get(*store, ns_, keys, kBytes);
  EXPECT_EQ(got.hits, 4u);
  EXPECT_TRUE(got.all_valid);
  // A chain whose first block is missing hits nothing, even if later blocks exist.
  const std::vector<BlockKey> gap = {keys[5], keys[0]};
  EXPECT_EQ(Get(*store, ns_, gap, kBytes).hits, 0u);
  // Storing it again is refused per block, not as a whole.
  EXPECT_EQ(Put(*store, ns_, {keys[0]}, kBytes).codes, std::vector<int>{kExists});
}

TEST_F(BlockStoreTest, CommitWithWrongChecksumIsDataLossAndFreesTheSlot) {
  auto store = OpenStore(Options(4, 0));
  const auto keys = Chain(ns_, 1, 2);
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns_.View()));
  auto* b = req.add_blocks();
  b->set_key(std::string(keys[0].View()));
  b->set_payload_bytes(kBytes);
  v1::ReserveResponse resp;
  ASSERT_TRUE(store->Reserve(req, &resp).ok());
  ASSERT_EQ(resp.slots(0).status().code(), kOk);
  EXPECT_EQ(store->dram().used_slots(), 1u);
  v1::CommitRequest commit;
  commit.set_lease_id(resp.lease().lease_id());
  auto* c = commit.add_blocks();
  c->set_key(std::string(keys[0].View()));
  c->set_checksum(12345);  // the arena holds zeros
  v1::CommitResponse cresp;
  ASSERT_TRUE(store->Commit(commit, &cresp).ok());
  EXPECT_EQ(cresp.results(0).code(), kDataLoss);
  EXPECT_EQ(store->dram().used_slots(), 0u);
  EXPECT_EQ(Get(*store, ns_, keys, kBytes).hits, 0u);
  // The lease is gone after Commit.
  EXPECT_TRUE(absl::IsNotFound(store->Commit(commit, &cresp)));
}

TEST_F(BlockStoreTest, WarmRestartServesEverySsdBlockAndDropsDramOnlyOnes) {
  const auto durable_keys = Chain(ns_, 5, 3);
  const auto volatile_keys = Chain(ns_, 2, 4);
  {
    auto store = OpenStore(Options(16, 16));
    const auto put = Put(*store, ns_, durable_keys, kBytes);
    EXPECT_TRUE(put.durable);
  }
  {
    auto store = OpenStore(Options(16, 16, WritePolicy::kNever));
    const auto stats = Stats(*store);
    EXPECT_EQ(stats.blocks(), 5u);
    EXPECT_EQ(TierOf(stats, v1::TIER_DRAM).blocks(), 0u);  // DRAM residency cleared on start
    EXPECT_EQ(TierOf(stats, v1::TIER_SSD).blocks(), 5u);
    const auto put = Put(*store, ns_, volatile_keys, kBytes);
    EXPECT_FALSE(put.durable);
    const auto got = Get(*store, ns_, durable_keys, kBytes);
    EXPECT_EQ(got.hits, 5u);
    EXPECT_TRUE(got.all_valid);
    EXPECT_EQ(TierOf(Stats(*store), v1::TIER_SSD).promotions(), 5u);
  }
  auto store = OpenStore(Options(16, 16));
  EXPECT_EQ(Get(*store, ns_, durable_keys, kBytes).hits, 5u);
  EXPECT_EQ(Get(*store, ns_, volatile_keys, kBytes).hits, 0u);
}

TEST_F(BlockStoreTest, FlippedSsdBytesAreQuarantinedAsAMissAndServingContinues) {
  const auto keys = Chain(ns_, 3, 5);
  const auto other = Chain(ns_, 2, 6);
  {
    auto store = OpenStore(Options(16, 16));
    ASSERT_TRUE(Put(*store, ns_, keys, kBytes).durable);
    ASSERT_TRUE(Put(*store, ns_, other, kBytes).durable);
  }
  // Slots are handed out lowest first: keys[i] is in SSD slot i, 4 slots per file.
  {
    const int fd = open((dir_ + "/ssd/slots-0.dat").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, kSlot * 1 + 777), 1);
    byte ^= 0x5a;
    ASSERT_EQ(pwrite(fd, &byte, 1, kSlot * 1 + 777), 1);
    close(fd);
  }
  auto store = OpenStore(Options(16, 16));
  v1::KvEvent seen;
  const uint64_t from = store->events().next_sequence();
  const auto got = Get(*store, ns_, keys, kBytes);
  EXPECT_EQ(got.hits, 1u);  // the prefix ends before the corrupt block
  EXPECT_TRUE(got.all_valid);
  EXPECT_EQ(Stats(*store).quarantined(), 1u);
  bool quarantine_event = false;
  for (const auto& e : store->events().Read(from, absl::ZeroDuration())) {
    quarantine_event |= e.has_quarantined() && e.quarantined().key() == keys[1].View();
  }
  EXPECT_TRUE(quarantine_event);
  EXPECT_EQ(Get(*store, ns_, keys, kBytes).hits, 1u);  // still a miss, never wrong bytes
  const auto rest = Get(*store, ns_, other, kBytes);
  EXPECT_EQ(rest.hits, 2u);
  EXPECT_TRUE(rest.all_valid);
  // The block can be written again.
  EXPECT_EQ(Put(*store, ns_, {keys[1]}, kBytes).codes, std::vector<int>{kOk});
}

TEST_F(BlockStoreTest, TruncatedSlotFileIsDetectedByVerifyAndLookup) {
  const auto keys = Chain(ns_, 4, 7);
  {
    auto store = OpenStore(Options(16, 16));
    ASSERT_TRUE(Put(*store, ns_, keys, kBytes).durable);
  }
  std::filesystem::resize_file(dir_ + "/ssd/slots-0.dat", kSlot * 2 + 100);
  auto store = OpenStore(Options(16, 16));
  v1::VerifyRequest vreq;
  v1::VerifyResponse vresp;
  ASSERT_TRUE(store->Verify(vreq, &vresp).ok());
  EXPECT_EQ(vresp.checked_blocks(), 4u);
  EXPECT_EQ(vresp.corrupt_blocks(), 2u);  // slots 2 and 3 read short
  const auto got = Get(*store, ns_, keys, kBytes);
  EXPECT_EQ(got.hits, 2u);
  EXPECT_TRUE(got.all_valid);
  EXPECT_EQ(Stats(*store).quarantined(), 2u);
}

TEST_F(BlockStoreTest, EvictionTakesTheLeastRecentlyUsedChainFromItsTail) {
  auto store = OpenStore(Options(8, 0, WritePolicy::kNever));
  const auto a = Chain(ns_, 4, 8);
  const auto b = Chain(ns_, 4, 9);
  Put(*store, ns_, a, kBytes);
  Tick();
  Put(*store, ns_, b, kBytes);
  Tick();
  Get(*store, ns_, b, kBytes);  // b is the most recently used
  Tick();
  const auto c = Chain(ns_, 2, 10);
  const uint64_t from = store->events().next_sequence();
  EXPECT_EQ(Put(*store, ns_, c, kBytes).codes, std::vector<int>(2, kOk));
  int evicted_events = 0;
  for (const auto& e : store->events().Read(from, absl::ZeroDuration())) {
    if (!e.has_evicted()) continue;
    ++evicted_events;
    EXPECT_FALSE(e.evicted().by_operator()) << "eviction to make room";
  }
  EXPECT_EQ(evicted_events, 2);
  // Two slots were needed: a's last two blocks went, a's prefix and all of b stayed.
  EXPECT_EQ(Get(*store, ns_, a, kBytes).hits, 2u);
  EXPECT_EQ(Get(*store, ns_, b, kBytes).hits, 4u);
  EXPECT_EQ(Get(*store, ns_, c, kBytes).hits, 2u);
  EXPECT_EQ(TierOf(Stats(*store), v1::TIER_DRAM).evictions(), 2u);
}

// A touch (a worker served the blocks from its own pool) makes them recent for eviction without
// reading them or counting a hit.
TEST_F(BlockStoreTest, TouchedBlocksAreEvictedLast) {
  auto store = OpenStore(Options(8, 0, WritePolicy::kNever));
  const auto a = Chain(ns_, 4, 30);
  const auto b = Chain(ns_, 4, 31);
  Put(*store, ns_, a, kBytes);
  Tick();
  Put(*store, ns_, b, kBytes);
  Tick();
  const uint64_t hits_before = TierOf(Stats(*store), v1::TIER_DRAM).hits();
  v1::TouchRequest touch;
  for (const BlockKey& k : a) touch.add_keys(std::string(k.View()));
  touch.add_keys(std::string(16, '\x7f'));  // not held: ignored
  v1::TouchResponse touched;
  ASSERT_TRUE(store->Touch(touch, &touched).ok());
  EXPECT_EQ(touched.touched(), 4u);
  EXPECT_EQ(TierOf(Stats(*store), v1::TIER_DRAM).hits(), hits_before);
  Tick();
  EXPECT_EQ(Put(*store, ns_, Chain(ns_, 2, 32), kBytes).codes, std::vector<int>(2, kOk));
  // Room came from b (now the least recent), not from a.
  EXPECT_EQ(Get(*store, ns_, a, kBytes).hits, 4u);
  EXPECT_EQ(Get(*store, ns_, b, kBytes).hits, 2u);
  touch.add_keys("short");
  EXPECT_TRUE(absl::IsInvalidArgument(store->Touch(touch, &touched)));
}

TEST_F(BlockStoreTest, OnEvictPolicyDemotesToSsdInsteadOfDropping) {
  auto store = OpenStore(Options(4, 16, WritePolicy::kOnEvict));
  const auto a = Chain(ns_, 4, 11);
  EXPECT_FALSE(Put(*store, ns_, a, kBytes).durable);
  Tick();
  const auto b = Chain(ns_, 4, 12);
  EXPECT_EQ(Put(*store, ns_, b, kBytes).codes, std::vector<int>(4, kOk));
  const auto stats = Stats(*store);
  EXPECT_EQ(TierOf(stats, v1::TIER_SSD).blocks(), 4u);
  const auto got = Get(*store, ns_, a, kBytes);  // promoted back, checksums verified
  EXPECT_EQ(got.hits, 4u);
  EXPECT_TRUE(got.all_valid);
}

TEST_F(BlockStoreTest, HardPinsAreNeverEvictedAndTtlPinsExpire) {
  auto store = OpenStore(Options(4, 0, WritePolicy::kNever));
  const auto a = Chain(ns_, 4, 13);
  Put(*store, ns_, a, kBytes);
  v1::PinRequest pin;
  pin.mutable_selector()->set_all(true);
  pin.set_kind(v1::PIN_HARD);
  v1::PinResponse presp;
  ASSERT_TRUE(store->Pin(pin, &presp).ok());
  EXPECT_EQ(presp.pinned_blocks(), 4u);
  const auto b = Chain(ns_, 1, 14);
  EXPECT_EQ(Put(*store, ns_, b, kBytes).codes, std::vector<int>{kExhausted});
  Tick(1'000'000'000);  // a hard pin does not age
  EXPECT_EQ(Put(*store, ns_, b, kBytes).codes, std::vector<int>{kExhausted});

  pin.set_kind(v1::PIN_TTL);
  pin.set_ttl_seconds(60);
  ASSERT_TRUE(store->Pin(pin, &presp).ok());
  Tick(59'000);
  EXPECT_EQ(Put(*store, ns_, b, kBytes).codes, std::vector<int>{kExhausted});
  Tick(2'000);
  EXPECT_EQ(Put(*store, ns_, b, kBytes).codes, std::vector<int>{kOk});
  EXPECT_EQ(Get(*store, ns_, a, kBytes).hits, 3u);  // the tail of the chain went
}

TEST_F(BlockStoreTest, ExpiredLeasesGiveTheirSlotsBackAndReadLeasesHoldBlocks) {
  auto store = OpenStore(Options(2, 0, WritePolicy::kNever));
  const auto keys = Chain(ns_, 1, 15);
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns_.View()));
  auto* b = req.add_blocks();
  b->set_key(std::string(keys[0].View()));
  b->set_payload_bytes(kBytes);
  v1::ReserveResponse resp;
  ASSERT_TRUE(store->Reserve(req, &resp).ok());
  EXPECT_EQ(store->dram().used_slots(), 1u);
  Tick(5'000);
  EXPECT_NE(store->KeepAlive({resp.lease().lease_id()})[0], 0);
  Tick(9'000);
  EXPECT_EQ(store->SweepLeases(), 0u);  // renewed
  Tick(2'000);
  EXPECT_EQ(store->SweepLeases(), 1u);  // the client died
  EXPECT_EQ(store->dram().used_slots(), 0u);
  EXPECT_EQ(store->KeepAlive({resp.lease().lease_id()})[0], 0);
  EXPECT_EQ(Stats(*store).lease_expiries(), 1u);

  // A read lease keeps its blocks in place even when the tier is full.
  const auto a = Chain(ns_, 2, 16);
  Put(*store, ns_, a, kBytes);
  v1::LookupRequest lreq;
  lreq.set_namespace_id(std::string(ns_.View()));
  for (const auto& k : a) lreq.add_keys(std::string(k.View()));
  lreq.set_lease(true);
  v1::LookupResponse lresp;
  ASSERT_TRUE(store->Lookup(lreq, &lresp).ok());
  ASSERT_EQ(lresp.hit_blocks(), 2u);
  EXPECT_EQ(Put(*store, ns_, Chain(ns_, 1, 17), kBytes).codes, std::vector<int>{kExhausted});
  ASSERT_TRUE(store->Release(lresp.lease().lease_id()).ok());
  EXPECT_EQ(Put(*store, ns_, Chain(ns_, 1, 17), kBytes).codes, std::vector<int>{kOk});
}

TEST_F(BlockStoreTest, ABlockIsNeverReturnedUnderAnotherNamespace) {
  auto store = OpenStore(Options(8, 8));
  const Namespace other = Ns("tenant-b");
  const auto keys = Chain(ns_, 3, 18);
  Put(*store, ns_, keys, kBytes, "a");
  // The same keys asked for under tenant b's namespace: a miss.
  EXPECT_EQ(Get(*store, other, keys, kBytes).hits, 0u);
  // Tenant b's own keys for the same tokens are different keys.
  EXPECT_EQ(Get(*store, other, Chain(other, 3, 18), kBytes).hits, 0u);
  // And b cannot overwrite a's block by presenting its key.
  const auto put = Put(*store, other, {keys[0]}, kBytes, "b");
  EXPECT_EQ(put.codes, std::vector<int>{static_cast<int>(absl::StatusCode::kFailedPrecondition)});
  EXPECT_EQ(Get(*store, ns_, keys, kBytes).hits, 3u);
}

TEST_F(BlockStoreTest, TenantQuotaEvictsOnlyThatTenantsBlocks) {
  auto o = Options(16, 0, WritePolicy::kNever);
  o.tenant_quota_bytes["small"] = 2 * kBytes;
  auto store = OpenStore(std::move(o));
  const Namespace small_ns = Ns("small");
  const auto big = Chain(ns_, 4, 19);
  Put(*store, ns_, big, kBytes, "big");
  const auto s1 = Chain(small_ns, 2, 20);
  EXPECT_EQ(Put(*store, small_ns, s1, kBytes, "small").codes, std::vector<int>(2, kOk));
  Tick();
  const auto s2 = Chain(small_ns, 1, 21);
  EXPECT_EQ(Put(*store, small_ns, s2, kBytes, "small").codes, std::vector<int>{kOk});
  EXPECT_EQ(Get(*store, small_ns, s1, kBytes).hits, 1u);  // its own tail made room
  EXPECT_EQ(Get(*store, ns_, big, kBytes).hits, 4u);      // nobody else's
  // Pinned so nothing of its own can go: a clean refusal.
  v1::PinRequest pin;
  pin.mutable_selector()->set_tenant("small");
  pin.set_kind(v1::PIN_HARD);
  v1::PinResponse presp;
  ASSERT_TRUE(store->Pin(pin, &presp).ok());
  EXPECT_EQ(Put(*store, small_ns, Chain(small_ns, 1, 22), kBytes, "small").codes,
            std::vector<int>{kExhausted});
}

TEST_F(BlockStoreTest, FullSsdTierEvictsLruAndNeverServesAWrongBlock) {
  auto store = OpenStore(Options(3, 4));
  std::vector<std::vector<BlockKey>> chains;
  for (uint32_t i = 0; i < 10; ++i) {
    chains.push_back(Chain(ns_, 1, 100 + i));
    const auto put = Put(*store, ns_, chains.back(), kBytes);
    EXPECT_EQ(put.codes, std::vector<int>{kOk});
    Tick();
  }
  const auto stats = Stats(*store);
  EXPECT_LE(TierOf(stats, v1::TIER_SSD).blocks(), 4u);
  EXPECT_LE(TierOf(stats, v1::TIER_DRAM).blocks(), 3u);
  size_t hits = 0;
  for (const auto& c : chains) {
    const auto got = Get(*store, ns_, c, kBytes);
    EXPECT_TRUE(got.all_valid);
    hits += got.hits;
  }
  EXPECT_GE(hits, 3u);
  // The newest block is always there.
  EXPECT_EQ(Get(*store, ns_, chains.back(), kBytes).hits, 1u);
}

TEST_F(BlockStoreTest, OversizedPayloadAndMalformedKeysAreRejected) {
  auto store = OpenStore(Options(4, 0));
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns_.View()));
  auto* b = req.add_blocks();
  b->set_key(std::string(Chain(ns_, 1, 23)[0].View()));
  b->set_payload_bytes(kSlot + 1);
  v1::ReserveResponse resp;
  EXPECT_TRUE(absl::IsInvalidArgument(store->Reserve(req, &resp)));
  b->set_payload_bytes(100);
  b->set_key("short");
  EXPECT_TRUE(absl::IsInvalidArgument(store->Reserve(req, &resp)));
  req.set_namespace_id("x");
  v1::LookupRequest lreq;
  lreq.set_namespace_id("x");
  v1::LookupResponse lresp;
  EXPECT_TRUE(absl::IsInvalidArgument(store->Lookup(lreq, &lresp)));
}

TEST_F(BlockStoreTest, AdminEvictFlushDrainAndCapacity) {
  auto store = OpenStore(Options(8, 16, WritePolicy::kNever));
  const auto a = Chain(ns_, 4, 24);
  Put(*store, ns_, a, kBytes);
  v1::FlushResponse fresp;
  ASSERT_TRUE(store->Flush(&fresp).ok());
  EXPECT_EQ(fresp.flushed_blocks(), 4u);
  v1::DrainResponse dresp;
  ASSERT_TRUE(store->Drain({}, &dresp).ok());
  EXPECT_EQ(dresp.moved_blocks(), 4u);
  EXPECT_EQ(store->dram().used_slots(), 0u);
  EXPECT_EQ(Get(*store, ns_, a, kBytes).hits, 4u);  // from SSD, promoted back

  v1::SetTierCapacityRequest cap;
  cap.set_tier(v1::TIER_DRAM);
  cap.set_capacity_bytes(2 * kSlot);
  v1::SetTierCapacityResponse cresp;
  ASSERT_TRUE(store->SetTierCapacity(cap, &cresp).ok());
  EXPECT_EQ(cresp.tier().capacity_bytes(), 2 * kSlot);
  EXPECT_LE(store->dram().used_slots(), 2u);
  cap.set_capacity_bytes(100 * kSlot);  // beyond the arena
  EXPECT_TRUE(absl::IsInvalidArgument(store->SetTierCapacity(cap, &cresp)));

  // Evict by token prefix: the chain's blocks, all tiers.
  v1::EvictRequest ev;
  std::vector<uint32_t> tokens(2 * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 24 * 100003u + static_cast<uint32_t>(i);
  ev.mutable_selector()->mutable_token_prefix()->set_namespace_id(std::string(ns_.View()));
  for (uint32_t t : tokens) ev.mutable_selector()->mutable_token_prefix()->add_tokens(t);
  v1::EvictResponse eresp;
  const uint64_t from = store->events().next_sequence();
  ASSERT_TRUE(store->Evict(ev, &eresp).ok());
  EXPECT_EQ(eresp.evicted_blocks(), 4u);  // the 2 prefix blocks and their descendants
  // Each left every tier at an operator's request: what tells workers to drop their copies.
  int by_operator = 0;
  for (const auto& e : store->events().Read(from, absl::ZeroDuration())) {
    by_operator +=
        e.has_evicted() && e.evicted().by_operator() && e.evicted().tier() == v1::TIER_UNSPECIFIED;
  }
  EXPECT_EQ(by_operator, 4);
  EXPECT_EQ(Get(*store, ns_, a, kBytes).hits, 0u);
  EXPECT_EQ(Stats(*store).blocks(), 0u);
}

TEST_F(BlockStoreTest, ListBlocksPagesThroughEverything) {
  auto store = OpenStore(Options(16, 0));
  Put(*store, ns_, Chain(ns_, 5, 25), kBytes, "x");
  Put(*store, Ns("y"), Chain(Ns("y"), 2, 26), kBytes, "y");
  v1::ListBlocksRequest req;
  req.set_page_size(2);
  size_t seen = 0;
  do {
    v1::ListBlocksResponse resp;
    ASSERT_TRUE(store->ListBlocks(req, &resp).ok());
    seen += resp.blocks_size();
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  EXPECT_EQ(seen, 7u);
  req.Clear();
  req.set_tenant("y");
  v1::ListBlocksResponse resp;
  ASSERT_TRUE(store->ListBlocks(req, &resp).ok());
  EXPECT_EQ(resp.blocks_size(), 2);
}

}  // namespace
}  // namespace strata::cache
