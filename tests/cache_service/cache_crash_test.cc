// Crash safety of the real daemon: `strata cache` is SIGKILLed again and again while clients
// write with write_through. After every restart, every block whose Commit was acknowledged as
// durable is served with its exact bytes, and every block the index lists reads back with a
// valid checksum.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/cache_admin.grpc.pb.h"
#include "tests/cache_service/daemon_util.h"
#include "tests/cache_service/store_test_util.h"

namespace strata::cache {
namespace {

using testing_util::Chain;
using testing_util::Daemon;
using testing_util::FreshDir;
using testing_util::Ns;
using testing_util::Payload;

constexpr size_t kBytes = 8000;
constexpr int kKills = 20;
// Chains one writer puts per round at most. The SSD tier (1 GiB of 8 KiB slots: ~31 k chains of
// 4 below its high watermark) must hold everything the test ever writes, 20 x 3 x 200 chains at
// most: an acknowledged block the tier evicted to make room would be a cache doing its job, not
// a crash losing data. The test checks that the tier never evicted.
constexpr int kChainsPerWriterPerRound = 200;

// A client of one daemon incarnation: gRPC stubs and the DRAM arena mapped over shm.
class Client {
 public:
  explicit Client(const std::string& address) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    control_ = v1::CacheControl::NewStub(channel);
    admin_ = v1::CacheAdmin::NewStub(channel);
    grpc::ClientContext ctx;
    v1::ConnectResponse resp;
    EXPECT_TRUE(control_->Connect(&ctx, {}, &resp).ok());
    const auto& seg = resp.segments(0);
    const int fd = open(seg.endpoints(0).address().c_str(), O_RDWR);
    EXPECT_GE(fd, 0) << seg.endpoints(0).address();
    size_ = seg.size_bytes();
    base_ =
        static_cast<std::byte*>(mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    EXPECT_NE(base_, MAP_FAILED);
  }
  ~Client() {
    if (base_ != MAP_FAILED) munmap(base_, size_);
  }

  // Puts one chain; true when the commit came back OK and durable.
  bool Put(const Namespace& ns, const std::vector<BlockKey>& keys) {
    v1::ReserveRequest req;
    req.set_namespace_id(std::string(ns.View()));
    req.set_tenant("crash");
    for (size_t i = 0; i < keys.size(); ++i) {
      auto* b = req.add_blocks();
      b->set_key(std::string(keys[i].View()));
      if (i > 0) b->set_parent_key(std::string(keys[i - 1].View()));
      b->set_payload_bytes(kBytes);
    }
    grpc::ClientContext rctx;
    rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReserveResponse resp;
    if (!control_->Reserve(&rctx, req, &resp).ok()) return false;
    v1::CommitRequest commit;
    commit.set_lease_id(resp.lease().lease_id());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (resp.slots(i).status().code() != 0) return false;
      const std::string data = Payload(keys[i], kBytes);
      std::memcpy(base_ + resp.slots(i).location().offset(), data.data(), kBytes);
      auto* c = commit.add_blocks();
      c->set_key(std::string(keys[i].View()));
      c->set_checksum(Checksum64(data));
    }
    grpc::ClientContext cctx;
    cctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CommitResponse cresp;
    if (!control_->Commit(&cctx, commit, &cresp).ok()) return false;
    for (const auto& r : cresp.results()) {
      if (r.code() != 0) return false;
    }
    return cresp.durable();
  }

  // Number of leading blocks served, each read into a private buffer and checked against
  // `expected` (the payload) or, when null, against the location's checksum only.
  uint32_t Get(const Namespace& ns, const std::vector<BlockKey>& keys, bool check_payload,
               bool* all_valid) {
    v1::LookupRequest req;
    req.set_namespace_id(std::string(ns.View()));
    for (const auto& k : keys) req.add_keys(std::string(k.View()));
    req.set_lease(true);
    req.set_promote(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::LookupResponse resp;
    const grpc::Status st = control_->Lookup(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    std::string buf;
    for (uint32_t i = 0; i < resp.hit_blocks(); ++i) {
      const auto& loc = resp.locations(i);
      buf.assign(reinterpret_cast<const char*>(base_ + loc.offset()), loc.length());
      if (loc.tier() != v1::TIER_DRAM || Checksum64(buf) != loc.checksum() ||
          (check_payload && buf != Payload(keys[i], kBytes))) {
        *all_valid = false;
      }
    }
    if (resp.lease().lease_id() != 0) {
      grpc::ClientContext rctx;
      v1::ReleaseRequest rel;
      rel.set_lease_id(resp.lease().lease_id());
      v1::ReleaseResponse rresp;
      control_->Release(&rctx, rel, &rresp);
    }
    return resp.hit_blocks();
  }

  // SSD evictions since this incarnation started.
  uint64_t SsdEvictions() {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer crash-token");
    v1::GetStatsResponse resp;
    const grpc::Status st = admin_->GetStats(&ctx, {}, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    for (const auto& t : resp.tiers()) {
      if (t.tier() == v1::TIER_SSD) return t.evictions();
    }
    ADD_FAILURE() << "no SSD tier in the stats";
    return 0;
  }

  std::vector<v1::BlockInfo> ListAll() {
    std::vector<v1::BlockInfo> out;
    v1::ListBlocksRequest req;
    req.set_page_size(5000);
    do {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", "Bearer crash-token");
      v1::ListBlocksResponse resp;
      const grpc::Status st = admin_->ListBlocks(&ctx, req, &resp);
      EXPECT_TRUE(st.ok()) << st.error_message();
      if (!st.ok()) break;
      for (auto& b : resp.blocks()) out.push_back(b);
      req.set_page_token(resp.next_page_token());
    } while (!req.page_token().empty());
    return out;
  }

 private:
  std::unique_ptr<v1::CacheControl::Stub> control_;
  std::unique_ptr<v1::CacheAdmin::Stub> admin_;
  std::byte* base_ = static_cast<std::byte*>(MAP_FAILED);
  size_t size_ = 0;
};

TEST(CacheCrashTest, SigkillDuringWriteThroughLosesNoAcknowledgedBlock) {
  const std::string dir = FreshDir("crash");
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "crash-token\n";
  Daemon daemon(dir + "/data", token_file, {"cache.ssd.capacity=1GiB"});
  const Namespace ns = Ns("crash");

  std::mutex mu;
  std::vector<std::vector<BlockKey>> acked;  // chains acknowledged durable
  std::atomic<uint32_t> next_seed{1};
  std::mt19937 rng(42);
  size_t total_listed = 0;

  for (int round = 0; round < kKills; ++round) {
    daemon.Start();
    if (HasFatalFailure()) return;
    {
      Client client(daemon.address());
      // Everything acknowledged before any earlier kill is served, byte for byte.
      std::vector<std::vector<BlockKey>> snapshot;
      {
        std::lock_guard<std::mutex> lock(mu);
        snapshot = acked;
      }
      for (const auto& chain : snapshot) {
        bool valid = true;
        ASSERT_EQ(client.Get(ns, chain, true, &valid), chain.size())
            << "round " << round << ": an acknowledged durable chain is missing";
        ASSERT_TRUE(valid) << "round " << round << ": wrong bytes for an acknowledged chain";
      }
      // Every block the index lists reads back with a valid checksum.
      const auto listed = client.ListAll();
      total_listed = listed.size();
      for (const auto& info : listed) {
        BlockKey key;
        std::memcpy(key.bytes.data(), info.key().data(), key.bytes.size());
        bool valid = true;
        ASSERT_EQ(client.Get(ns, {key}, true, &valid), 1u) << "listed block not served";
        ASSERT_TRUE(valid) << "listed block with a bad checksum";
      }
    }
    // Heavy writes from 3 clients, then SIGKILL at a random moment.
    std::atomic<bool> stop{false};
    std::vector<std::thread> writers;
    for (int w = 0; w < 3; ++w) {
      writers.emplace_back([&] {
        Client client(daemon.address());
        for (int n = 0; n < kChainsPerWriterPerRound && !stop.load(); ++n) {
          const auto chain = Chain(ns, 4, next_seed.fetch_add(1));
          if (client.Put(ns, chain)) {
            std::lock_guard<std::mutex> lock(mu);
            acked.push_back(chain);
          } else if (stop.load()) {
            break;
          }
        }
      });
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(100, 400)(rng)));
    const uint64_t ssd_evictions = Client(daemon.address()).SsdEvictions();
    daemon.Kill();
    stop = true;
    for (auto& t : writers) t.join();
    ASSERT_EQ(ssd_evictions, 0u) << "round " << round
                                 << ": the SSD tier evicted; the test writes more than it holds";
  }
  daemon.Start();
  Client client(daemon.address());
  EXPECT_GT(acked.size(), static_cast<size_t>(kKills));  // the writes were real
  const size_t listed = client.ListAll().size();
  EXPECT_GE(listed, acked.size() * 4);
  std::cout << kKills << " kills; " << acked.size() << " chains acknowledged durable; " << listed
            << " blocks listed at the end (last round checked " << total_listed << ")\n";
  daemon.Kill();
}

}  // namespace
}  // namespace strata::cache
