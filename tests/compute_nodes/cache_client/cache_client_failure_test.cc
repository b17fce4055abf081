// The cache client when its server goes away or fills up: blocks read back from SSD after a
// restart, a client (and a fetch in place) finding a restarted server, a dead or unreachable
// server, the write-behind queue's byte bound, and a full cache storing what fits.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "cache_service/cache_server.h"
#include "common/strings.h"
#include "compute_nodes/cache_client/cache_client.h"
#include "tests/compute_nodes/cache_client/cache_client_test_util.h"

namespace strata::cache_client::testing_util {
namespace {

using transfer::TransportKind;

TEST_F(CacheClientTest, BlocksOnSsdAfterARestartArePromotedAndReadBack) {
  cache::CacheServerOptions o = ServerOptions("ssd", 64);
  o.store.ssd_capacity_bytes = 64 * 4096;
  StartServer(o);
  const Namespace ns = Ns("ssd");
  const Chain c = MakeChain(ns, 3, 15);
  {
    auto client = Connect(Options());
    ASSERT_NE(client, nullptr);
    absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->stored, 3);
  }
  // DRAM residency does not survive a restart; the SSD copies do.
  StartServer(o);
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_EQ(r.hit_blocks, 3);
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  // Lookup(promote) copies SSD hits to DRAM and serves them from there; they count as SSD hits.
  ExpectPayloads(r, c, 3, HitTier::kSsd);
  EXPECT_EQ(ActiveLeases(), 0u);
  // Now in DRAM: the next fetch is a DRAM hit.
  ExpectPayloads(FetchChain(*client, ns, c), c, 3, HitTier::kDram);
}

TEST_F(CacheClientTest, AClientFindsARestartedServerAgain) {
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    const std::string name(transfer::TransportKindName(kind));
    SCOPED_TRACE(name);
    cache::CacheServerOptions o = ServerOptions("restart-" + name, 256);
    StartServer(o);
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns("restart-" + name);
    ASSERT_TRUE(client->Save(ns, "t", Layout(), MakeChain(ns, 2, 20).blocks, "req").ok());

    // Same gRPC address; new transfer ports and a new DRAM arena.
    o.listen = "127.0.0.1:" + std::to_string(server_->grpc_port());
    StartServer(o);
    const Chain c = MakeChain(ns, 2, 21);
    // The first calls may fail while the client notices; bounded retries, no timing asserted.
    bool round_trip = false;
    for (int attempt = 0; attempt < 30 && !round_trip; ++attempt) {
      absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
      if (saved.ok() && saved->stored + saved->present == 2) {
        const FetchResult r = FetchChain(*client, ns, c);
        round_trip = r.blocks.size() == 2 &&
                     std::ranges::equal(r.blocks[0].payload, c.blocks[0].payload) &&
                     std::ranges::equal(r.blocks[1].payload, c.blocks[1].payload);
      }
      if (!round_trip) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    EXPECT_TRUE(round_trip);
    EXPECT_EQ(client->transport(), kind);
  }
}

// A fetch in place through a data path gone stale (the old arena is still mapped) finds the
// restarted server's new arena and reads there.
TEST_F(CacheClientTest, AFetchInPlaceFindsTheRestartedServersArena) {
  cache::CacheServerOptions o = ServerOptions("restart-in-place", 256);
  StartServer(o);
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("restart-in-place");
  const Chain before = MakeChain(ns, 2, 60);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), before.blocks, "req").ok());
  InPlace first;
  ASSERT_EQ(client->Fetch(ns, before.keys, before.tokens, Layout(), "req", {.in_place = first.Fn()})
                .blocks.size(),
            2u);

  o.listen = "127.0.0.1:" + std::to_string(server_->grpc_port());
  StartServer(o);
  const Chain c = MakeChain(ns, 3, 61);
  {
    auto other = Connect(Options(TransportKind::kShm));  // stores the blocks; `client` is stale
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(other->Save(ns, "t", Layout(), c.blocks, "req").ok());
  }
  InPlace again;
  bool equal = true;
  const FetchResult r = client->Fetch(
      ns, c.keys, c.tokens, Layout(), "req",
      {.on_blocks =
           [&](size_t first_block, std::span<const FetchedBlock> blocks) {
             for (size_t i = 0; i < blocks.size(); ++i) {
               equal &= std::ranges::equal(blocks[i].payload, c.blocks[first_block + i].payload);
             }
             return true;
           },
       .in_place = again.Fn()});
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  EXPECT_EQ(r.blocks.size(), 3u);
  EXPECT_TRUE(equal);
  EXPECT_NE(r.mapping, nullptr);
  EXPECT_EQ(again.asked, 2);  // the old arena, then the new one (maybe at the same address)
}

TEST_F(CacheClientTest, ADeadServerEndsFetchesAndFailsSaves) {
  CacheClientOptions o = Options();
  o.rpc_timeout = absl::Seconds(2);
  o.transfer_timeout = absl::Seconds(2);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("dead");
  const Chain c = MakeChain(ns, 3, 10);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  server_->Shutdown();

  const auto start = std::chrono::steady_clock::now();
  const FetchResult r = FetchChain(*client, ns, c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(r.blocks.empty());
  EXPECT_TRUE(absl::IsUnavailable(r.first_failure) || absl::IsDeadlineExceeded(r.first_failure))
      << r.first_failure;
  // Bounded by the RPC and transfer timeouts, with generous slack for a loaded machine.
  EXPECT_LT(seconds, 30.0);

  absl::StatusOr<SaveResult> saved =
      client->Save(ns, "t", Layout(), MakeChain(ns, 2, 11).blocks, "req");
  EXPECT_FALSE(saved.ok());
  std::atomic<int> calls{0};
  absl::Status async_status;
  client->SaveAsync(ns, "t", Layout(), MakeChain(ns, 2, 12).blocks, "req",
                    [&](absl::StatusOr<SaveResult> result) {
                      async_status = result.status();
                      calls.fetch_add(1);
                    });
  client->FlushSaves();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(async_status.ok());
}

TEST(CacheClientConnectTest, UnreachableServerIsUnavailableAndNamesTheAddress) {
  CacheClientOptions o;
  o.address = "127.0.0.1:1";
  o.client_id = "w";
  o.host_id = kHost;
  o.rpc_timeout = absl::Seconds(2);
  auto client = CacheClient::Connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_NE(client.status().message().find("127.0.0.1:1"), absl::string_view::npos);
}

TEST_F(CacheClientTest, SaveAsyncCompletesEveryBatchWithinTheByteBound) {
  constexpr int kThreads = 2;
  constexpr int kBatchesPerThread = 12;
  constexpr int kBlocks = 2;
  const uint64_t batch_bytes = kBlocks * (Layout().PayloadBytes() + 4ull * Layout().block_tokens);
  // Smaller than one batch (batches go one at a time, none deadlocks), then room for two and a
  // half (callers and the save thread overlap).
  for (const uint64_t bound : {uint64_t{1000}, batch_bytes * 5 / 2}) {
    SCOPED_TRACE(bound);
    CacheClientOptions o = Options(TransportKind::kShm);
    o.max_pending_save_bytes = bound;
    auto client = Connect(o);
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns(StrCat("async-", bound));
    std::vector<Chain> chains;
    for (int i = 0; i < kThreads * kBatchesPerThread; ++i) {
      chains.push_back(MakeChain(ns, kBlocks, 100 + i));
    }
    std::vector<std::atomic<int>> calls(chains.size());
    std::vector<std::atomic<int64_t>> stored(chains.size());
    std::atomic<uint64_t> max_pending{0};
    auto observe_pending = [&] {
      const uint64_t p = client->pending_save_bytes();
      uint64_t seen = max_pending.load();
      while (p > seen && !max_pending.compare_exchange_weak(seen, p)) {
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int b = 0; b < kBatchesPerThread; ++b) {
          const size_t i = t * kBatchesPerThread + b;
          client->SaveAsync(ns, "t", Layout(), chains[i].blocks, "req",
                            [&, i](absl::StatusOr<SaveResult> r) {
                              calls[i].fetch_add(1);
                              stored[i].store(r.ok() ? r->stored : -1);
                              observe_pending();
                            });
          observe_pending();
        }
      });
    }
    for (auto& th : threads) th.join();
    client->FlushSaves();
    EXPECT_EQ(client->pending_save_bytes(), 0u);
    for (size_t i = 0; i < chains.size(); ++i) {
      EXPECT_EQ(calls[i].load(), 1) << "batch " << i;
      EXPECT_EQ(stored[i].load(), kBlocks) << "batch " << i;
    }
    EXPECT_LE(max_pending.load(), std::max(bound, batch_bytes));
    for (const Chain& c : chains) ExpectPayloads(FetchChain(*client, ns, c), c, kBlocks);

    // The destructor drains what is still queued.
    std::atomic<int> late{0};
    for (int i = 0; i < 4; ++i) {
      client->SaveAsync(ns, "t", Layout(), MakeChain(ns, 1, 500 + i).blocks, "req",
                        [&](absl::StatusOr<SaveResult> r) { late.fetch_add(r.ok() ? 1 : 100); });
    }
    client.reset();
    EXPECT_EQ(late.load(), 4);
  }
}

TEST_F(CacheClientTest, AFullCacheRefusesSomeBlocksAndStoresTheRest) {
  StartServer(4);
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("full");
  const Chain c = MakeChain(ns, 8, 13);
  absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_GT(saved->failed, 0);
  EXPECT_GT(saved->stored, 0);
  EXPECT_EQ(saved->stored + saved->failed, 8);
  EXPECT_TRUE(absl::IsResourceExhausted(saved->first_error)) << saved->first_error;
  ASSERT_EQ(saved->keys_in_cache.size(), static_cast<size_t>(saved->stored));
  EXPECT_EQ(saved->keys_in_cache[0], c.keys[0]);
  EXPECT_EQ(ActiveLeases(), 0u);
  // Whatever prefix is still resident reads back intact.
  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  ExpectPayloads(r, c, r.blocks.size());
}

}  // namespace
}  // namespace strata::cache_client::testing_util
