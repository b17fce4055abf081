// ResidentSync against a real cache server's control service (CacheControlService over a
// BlockStore in this process) whose gRPC endpoint goes away and comes back: operator evictions
// made while the worker's event stream was down are replayed from the sequence it resumes at;
// when the server's event ring has moved past it, the digest stands in (a resync); a restarted
// server (a new store: a new epoch) is followed from its digest, and what it lost is to be saved
// again.
#include "compute_nodes/worker/resident_sync.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache_service/block_store.h"
#include "cache_service/cache_control_service.h"
#include "compute_nodes/runtime/kv_pool.h"
#include "tests/cache_service/store_test_util.h"

namespace strata::worker {
namespace {

using cache::testing_util::Chain;
using cache::testing_util::FreshDir;
using cache::testing_util::Ns;
using cache::testing_util::Put;

constexpr size_t kSlot = 4096;

runtime::KvLayout Layout() {
  return {.num_layers = 1, .block_tokens = 64, .latent_dim = 8, .rope_dim = 4};
}

// Waits up to 20 s for `done`.
template <typename Fn>
bool Eventually(Fn done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

class ResidentSyncTest : public ::testing::Test {
 protected:
  void SetUp() override { OpenStore(); }
  void TearDown() override {
    sync_.reset();
    Unserve();
  }

  void OpenStore() {
    cache::StoreOptions o;
    o.server_id = "cache";
    o.data_dir = FreshDir("resident-sync");
    o.slot_bytes = kSlot;
    o.dram_capacity_bytes = 256 * kSlot;
    o.event_capacity = 8;  // a few events only: an outage can outrun it
    auto store = cache::BlockStore::Open(std::move(o));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // The store's control service on the test's port (the same one each time once picked).
  void Serve() {
    service_ = std::make_unique<cache::CacheControlService>(
        *store_, cache::CacheControlService::Options{.server_id = "cache", .host_id = "h"});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port_),
                             grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }
  // The endpoint goes away (open event streams end); the store and its event log stay.
  void Unserve() {
    if (server_ == nullptr) return;
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    server_.reset();
    service_.reset();
  }

  // Blocks in the store (saved) and resident in the pool as saved; `unsaved` more resident only.
  std::vector<BlockKey> PutAndKeep(const std::vector<BlockKey>& keys, bool saved = true) {
    if (saved) {
      const auto put = Put(*store_, ns_, keys, kSlot);
      for (int code : put.codes) EXPECT_EQ(code, 0);
    }
    runtime::PageTable table;
    EXPECT_TRUE(resident_.EnsureCapacity(table, static_cast<int64_t>(keys.size()) * 64).ok());
    resident_.Release(keys, saved ? static_cast<int64_t>(keys.size()) : 0, table);
    return keys;
  }

  void EvictByOperator(const std::vector<BlockKey>& keys) {
    v1::EvictRequest req;
    for (const BlockKey& k : keys)
      req.mutable_selector()->mutable_keys()->add_keys(std::string(k.View()));
    v1::EvictResponse resp;
    ASSERT_TRUE(store_->Evict(req, &resp).ok());
    ASSERT_EQ(resp.evicted_blocks(), keys.size());
  }

  bool Resident(const BlockKey& key) {
    runtime::PageTable table;
    int64_t saved = 0;
    const bool hit = resident_.Acquire(std::span<const BlockKey>(&key, 1), &table, &saved) == 1;
    if (hit) resident_.Release(std::span<const BlockKey>(&key, 1), saved, table);
    return hit;
  }

  // How many of `keys`, from the first, are resident and known to be in the cache server.
  int64_t SavedRun(const std::vector<BlockKey>& keys) {
    runtime::PageTable table;
    int64_t saved = 0;
    const int64_t hit = resident_.Acquire(keys, &table, &saved);
    resident_.Release(std::span<const BlockKey>(keys).first(hit), saved, table);
    return saved;
  }

  void StartSync() {
    sync_ = std::make_unique<ResidentSync>(
        ResidentSyncOptions{.cache_address = "127.0.0.1:" + std::to_string(port_),
                            .client_id = "w-resident",
                            .touch_interval = absl::Hours(1)},
        &resident_);
    sync_->Start();
    ASSERT_TRUE(Eventually([&] { return sync_->subscriptions() >= 1; }));
  }

  Namespace ns_ = Ns("resident-sync");
  std::unique_ptr<cache::BlockStore> store_;
  std::unique_ptr<cache::CacheControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  runtime::HostKvPool pool_{Layout(), 64};
  ResidentBlocks resident_{pool_};
  std::unique_ptr<ResidentSync> sync_;
};

TEST_F(ResidentSyncTest, EvictionsDuringAnOutageAreReplayed) {
  Serve();
  const std::vector<BlockKey> a = PutAndKeep(Chain(ns_, 3, 1));
  const std::vector<BlockKey> b = PutAndKeep(Chain(ns_, 2, 2));
  StartSync();

  // Live: an operator eviction reaches the pool.
  EvictByOperator({b[1]});
  ASSERT_TRUE(Eventually([&] { return sync_->forgotten() == 1; }));
  EXPECT_FALSE(Resident(b[1]));

  // The stream goes down; the operator evicts a's tail meanwhile (2 events, fewer than the ring).
  Unserve();
  EvictByOperator({a[2]});
  EvictByOperator({a[1]});
  Serve();
  ASSERT_TRUE(Eventually([&] { return sync_->forgotten() == 3; })) << sync_->forgotten();
  EXPECT_EQ(sync_->resyncs(), 0) << "the server still had every event";
  EXPECT_GE(sync_->subscriptions(), 2);
  EXPECT_TRUE(Resident(a[0]));
  EXPECT_FALSE(Resident(a[1]));
  EXPECT_FALSE(Resident(a[2]));
  EXPECT_TRUE(Resident(b[0]));
}

TEST_F(ResidentSyncTest, AGapInTheServersLogIsHealedFromItsDigest) {
  Serve();
  const std::vector<BlockKey> a = PutAndKeep(Chain(ns_, 3, 1));
  const std::vector<BlockKey> b = PutAndKeep(Chain(ns_, 2, 2));
  const std::vector<BlockKey> unsaved = PutAndKeep(Chain(ns_, 2, 3), /*saved=*/false);
  StartSync();

  // Down, while an operator evicts a's tail and more than the ring's 8 events follow.
  Unserve();
  EvictByOperator({a[2]});
  for (uint32_t seed = 10; seed < 20; ++seed) {
    ASSERT_EQ(Put(*store_, ns_, Chain(ns_, 1, seed), kSlot).codes[0], 0);
  }
  Serve();
  ASSERT_TRUE(Eventually([&] { return sync_->resyncs() == 1; }));
  ASSERT_TRUE(Eventually([&] { return sync_->forgotten() == 1; }));
  EXPECT_FALSE(Resident(a[2])) << "not in the digest: forgotten";
  EXPECT_TRUE(Resident(a[0]));
  EXPECT_TRUE(Resident(a[1]));
  EXPECT_TRUE(Resident(b[0]));
  EXPECT_TRUE(Resident(b[1]));
  EXPECT_TRUE(Resident(unsaved[0])) << "never in the server: nothing to follow";

  // Following live events again from there.
  EvictByOperator({b[1]});
  ASSERT_TRUE(Eventually([&] { return sync_->forgotten() == 2; }));
  EXPECT_FALSE(Resident(b[1]));
  EXPECT_EQ(sync_->resyncs(), 1);
}

TEST_F(ResidentSyncTest, ARestartedServerIsFollowedFromItsDigest) {
  Serve();
  const std::vector<BlockKey> a = PutAndKeep(Chain(ns_, 3, 1));
  StartSync();
  EvictByOperator({a[2]});
  ASSERT_TRUE(Eventually([&] { return sync_->forgotten() == 1; }));

  // A new store on the same port: a new epoch, whose sequences start again from 1.
  Unserve();
  store_.reset();
  OpenStore();
  Serve();
  ASSERT_TRUE(Eventually([&] { return sync_->subscriptions() >= 3; }))
      << "the stream opened at the old sequence is re-opened from the new digest";
  // The new server has none of a's blocks: they are to be saved again when next used.
  EXPECT_EQ(sync_->unsaved(), 2);
  EXPECT_EQ(SavedRun({a[0], a[1]}), 0);
  const std::vector<BlockKey> c = PutAndKeep(Chain(ns_, 2, 4));
  EvictByOperator({c[1]});
  ASSERT_TRUE(Eventually([&] { return sync_->forgotten() == 2; }))
      << "an eviction at a low sequence of the new log must be seen";
  EXPECT_FALSE(Resident(c[1]));
  EXPECT_TRUE(Resident(a[0])) << "a restart alone forgets nothing";
  EXPECT_EQ(SavedRun({c[0]}), 1) << "put to the new server: saved";
  EXPECT_EQ(sync_->resyncs(), 0);
}

}  // namespace
}  // namespace strata::worker
