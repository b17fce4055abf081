// Many clients reserving, committing, reading and evicting at once (run it under TSan too:
// -DSTRATA_SANITIZE=thread). Every hit must carry exactly the bytes that were committed.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "cache_service/block_store.h"
#include "tests/cache_service/store_test_util.h"

namespace strata::cache {
namespace {

using testing_util::Chain;
using testing_util::FreshDir;
using testing_util::Get;
using testing_util::Ns;
using testing_util::Put;

TEST(CacheConcurrencyTest, ReadersWritersAndEvictorsAgreeOnEveryByte) {
  StoreOptions o;
  o.data_dir = FreshDir("concurrency");
  o.slot_bytes = 16 << 10;
  o.dram_capacity_bytes = 48 * o.slot_bytes;  // small: eviction runs all the time
  o.ssd_capacity_bytes = 96 * o.slot_bytes;
  o.ssd_slots_per_file = 16;
  o.write_policy = WritePolicy::kOnEvict;
  // The sweeper thread expires abandoned leases; long enough that a put preempted for a while on
  // a loaded machine still commits in time.
  o.lease_ttl = absl::Seconds(1);
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockStore& store = **opened;

  constexpr int kClients = 6;
  constexpr int kRounds = 40;
  constexpr size_t kBytes = 12000;
  std::atomic<int> bad{0};
  std::atomic<int> hits{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      const Namespace ns = Ns("tenant-" + std::to_string(c % 3));
      for (int r = 0; r < kRounds; ++r) {
        // Overlapping chains across clients of one namespace: races on the same keys.
        const auto keys = Chain(ns, 3, static_cast<uint32_t>(r % 12));
        Put(store, ns, keys, kBytes, "tenant-" + std::to_string(c % 3));
        const auto got = Get(store, ns, keys, kBytes);
        if (!got.all_valid) ++bad;
        hits += got.hits;
        if (r % 7 == c) {
          // An abandoned reservation: the lease must expire and give the slot back.
          v1::ReserveRequest req;
          req.set_namespace_id(std::string(ns.View()));
          auto* b = req.add_blocks();
          b->set_key(std::string(Chain(ns, 1, 1000 + c * 100 + r)[0].View()));
          b->set_payload_bytes(kBytes);
          v1::ReserveResponse resp;
          (void)store.Reserve(req, &resp);
        }
      }
    });
  }
  threads.emplace_back([&] {  // an operator evicting, verifying and resizing meanwhile
    int i = 0;
    while (!done.load()) {
      v1::EvictRequest ev;
      ev.mutable_selector()->set_tenant("tenant-" + std::to_string(i % 3));
      ev.set_tier(i % 2 ? v1::TIER_DRAM : v1::TIER_UNSPECIFIED);
      v1::EvictResponse eresp;
      EXPECT_TRUE(store.Evict(ev, &eresp).ok());
      v1::VerifyResponse vresp;
      EXPECT_TRUE(store.Verify({}, &vresp).ok());
      EXPECT_EQ(vresp.corrupt_blocks(), 0u);
      // Bulk DRAM -> SSD copies racing with everything else (SSD full is a clean error).
      v1::FlushResponse fresp;
      (void)store.Flush(&fresp);
      if (i % 4 == 3) {
        v1::DrainResponse dresp;
        EXPECT_TRUE(store.Drain({}, &dresp).ok());
      }
      v1::GetStatsResponse stats;
      store.GetStats(&stats);
      v1::ListBlocksResponse list;
      EXPECT_TRUE(store.ListBlocks({}, &list).ok());
      ++i;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  for (int c = 0; c < kClients; ++c) threads[c].join();
  done = true;
  threads.back().join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(hits.load(), 0);
  // Abandoned leases expire; then no slot is held by anybody but resident blocks.
  for (int i = 0; i < 100 && store.dram().used_slots() > 0; ++i) {
    v1::EvictRequest ev;
    ev.mutable_selector()->set_all(true);
    v1::EvictResponse eresp;
    ASSERT_TRUE(store.Evict(ev, &eresp).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(store.dram().used_slots(), 0u);
  v1::GetStatsResponse stats;
  store.GetStats(&stats);
  EXPECT_EQ(stats.blocks(), 0u);
  EXPECT_EQ(stats.active_leases(), 0u);
}

// Flush, drain and demotion copy DRAM blocks to SSD without holding the store's lock: while a
// copy is parked between "slots reserved" and "bytes written" (the test hook), the same blocks
// read back intact, new blocks are stored, and the admin API answers. Were the lock held, these
// calls would block until the copy finished, which the hook only lets happen afterwards.
TEST(CacheConcurrencyTest, SsdCopiesRunOutsideTheStoreLock) {
  std::promise<void> entered, proceed;
  std::shared_future<void> proceed_f = proceed.get_future().share();
  std::atomic<int> copies{0};
  StoreOptions o;
  o.data_dir = FreshDir("nolock");
  o.slot_bytes = 16 << 10;
  o.dram_capacity_bytes = 8 * o.slot_bytes;
  o.ssd_capacity_bytes = 32 * o.slot_bytes;
  o.ssd_slots_per_file = 16;
  o.write_policy = WritePolicy::kOnEvict;
  o.before_ssd_copy_io = [&] {
    if (copies++ == 0) {
      entered.set_value();
      proceed_f.wait_for(std::chrono::seconds(120));  // bounded even if the test fails
    }
  };
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockStore& store = **opened;
  const Namespace ns = Ns("nolock");
  const auto keys = Chain(ns, 4, 1);
  constexpr size_t kBytes = 9000;
  ASSERT_EQ(Put(store, ns, keys, kBytes).codes, std::vector<int>(4, 0));

  std::thread flusher([&] {
    v1::FlushResponse resp;
    EXPECT_TRUE(store.Flush(&resp).ok());
    EXPECT_EQ(resp.flushed_blocks(), 4u);
  });
  ASSERT_EQ(entered.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  // The copy is parked outside the lock: everything else goes on.
  auto others = std::async(std::launch::async, [&] {
    const auto got = Get(store, ns, keys, kBytes);
    EXPECT_EQ(got.hits, 4u);
    EXPECT_TRUE(got.all_valid);
    const auto more = Chain(ns, 2, 2);
    EXPECT_EQ(Put(store, ns, more, kBytes).codes, std::vector<int>(2, 0));
    v1::GetStatsResponse stats;
    store.GetStats(&stats);
    EXPECT_EQ(stats.blocks(), 6u);
    // Blocks being copied are held in place: neither evicted nor dropped by a drain.
    v1::EvictRequest ev;
    ev.mutable_selector()->mutable_keys()->add_keys(std::string(keys[0].View()));
    v1::EvictResponse eresp;
    EXPECT_TRUE(store.Evict(ev, &eresp).ok());
    EXPECT_EQ(eresp.evicted_blocks(), 0u);
  });
  const bool finished = others.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  EXPECT_TRUE(finished) << "store calls blocked while an SSD copy was in flight";
  proceed.set_value();
  flusher.join();
  others.wait();
  // The copy committed: every block now also has its SSD copy and still reads back intact.
  v1::ListBlocksRequest lreq;
  lreq.set_tier(v1::TIER_SSD);
  v1::ListBlocksResponse list;
  ASSERT_TRUE(store.ListBlocks(lreq, &list).ok());
  EXPECT_EQ(list.blocks_size(), 4);
  v1::DrainResponse dresp;
  ASSERT_TRUE(store.Drain({}, &dresp).ok());
  EXPECT_EQ(dresp.failed_blocks(), 0u);
  const auto got = Get(store, ns, keys, kBytes);  // promoted back from SSD, checksum-verified
  EXPECT_EQ(got.hits, 4u);
  EXPECT_TRUE(got.all_valid);
}

// Demotion (eviction of DRAM-only blocks under pressure) copies outside the lock too, and a block
// quarantined while its copy is in flight is not resurrected by the copy's commit.
TEST(CacheConcurrencyTest, DemotionAndQuarantineDuringACopy) {
  std::atomic<BlockStore*> store_ptr{nullptr};
  std::atomic<int> copies{0};
  StoreOptions o;
  o.data_dir = FreshDir("demote");
  o.slot_bytes = 16 << 10;
  o.dram_capacity_bytes = 4 * o.slot_bytes;
  o.dram_high_watermark = 1.0;
  o.dram_low_watermark = 0.5;
  o.ssd_capacity_bytes = 32 * o.slot_bytes;
  o.ssd_slots_per_file = 16;
  o.write_policy = WritePolicy::kOnEvict;
  const Namespace ns = Ns("demote");
  const auto first = Chain(ns, 4, 3);
  constexpr size_t kBytes = 7000;
  o.before_ssd_copy_io = [&] {
    if (copies++ != 0) return;
    // Corrupt one block being copied and scrub: it is quarantined mid-copy.
    BlockStore* s = store_ptr.load();
    v1::ListBlocksResponse list;
    ASSERT_TRUE(s->ListBlocks({}, &list).ok());
    for (const auto& b : list.blocks()) {
      if (b.key() != std::string(first[3].View())) continue;
      v1::LookupRequest lreq;
      lreq.set_namespace_id(std::string(ns.View()));
      for (const auto& k : first) lreq.add_keys(std::string(k.View()));
      v1::LookupResponse lresp;
      ASSERT_TRUE(s->Lookup(lreq, &lresp).ok());
      ASSERT_EQ(lresp.hit_blocks(), 4u);
      s->dram().base()[lresp.locations(3).offset()] ^= std::byte{0xff};
    }
    v1::VerifyRequest vreq;
    vreq.set_tier(v1::TIER_DRAM);
    v1::VerifyResponse vresp;
    ASSERT_TRUE(s->Verify(vreq, &vresp).ok());
    EXPECT_EQ(vresp.corrupt_blocks(), 1u);
  };
  auto opened = BlockStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BlockStore& store = **opened;
  store_ptr = &store;
  ASSERT_EQ(Put(store, ns, first, kBytes).codes, std::vector<int>(4, 0));
  // DRAM is full of DRAM-only blocks: the next reservation demotes (copy outside the lock).
  const auto second = Chain(ns, 2, 4);
  ASSERT_EQ(Put(store, ns, second, kBytes).codes, std::vector<int>(2, 0));
  EXPECT_GE(copies.load(), 1);
  // The quarantined block is gone for good (a miss, never the corrupt bytes); the others read
  // back intact from wherever they are now.
  const auto got = Get(store, ns, first, kBytes);
  EXPECT_EQ(got.hits, 3u);
  EXPECT_TRUE(got.all_valid);
  v1::LookupRequest lreq;
  lreq.set_namespace_id(std::string(ns.View()));
  lreq.add_keys(std::string(first[3].View()));
  v1::LookupResponse lresp;
  ASSERT_TRUE(store.Lookup(lreq, &lresp).ok());
  EXPECT_EQ(lresp.hit_blocks(), 0u);
  const auto got2 = Get(store, ns, second, kBytes);
  EXPECT_EQ(got2.hits, 2u);
  EXPECT_TRUE(got2.all_valid);
  v1::GetStatsResponse stats;
  store.GetStats(&stats);
  EXPECT_EQ(stats.quarantined(), 1u);
  EXPECT_EQ(stats.blocks(), 5u);
}

}  // namespace
}  // namespace strata::cache
