// Many clients reserving, committing, reading and evicting at once (run it under TSan too:
// -DSTRATA_SANITIZE=thread). Every hit must carry exactly the bytes that were committed.
#include <gtest/gtest.h>

#include <atomic>
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
  o.lease_ttl = absl::Milliseconds(200);  // the sweeper thread expires abandoned leases
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

}  // namespace
}  // namespace strata::cache
