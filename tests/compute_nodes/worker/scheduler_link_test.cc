// SchedulerLink against a scheduler stand-in that records what it is told: register, heartbeats
// with the worker's load, re-register when the scheduler asks, retry until it is reachable, and
// publish the worker's resident blocks (a digest, then changes in order; a digest again after a
// re-registration). (The real scheduler's side is tested in tests/scheduler; this checks the
// worker's side of the protocol.)
#include "compute_nodes/worker/scheduler_link.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

namespace strata::worker {
namespace {

class RecordingScheduler final : public v1::Scheduler::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    nodes_.push_back(req->node());
    resp->set_node_id(req->node().node_id());
    resp->set_heartbeat_interval_ms(20);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = *req;
    ++heartbeats_;
    resp->set_reregister(reregister_once_.exchange(false));
    resp->set_draining(draining_);
    return grpc::Status::OK;
  }

  grpc::Status PublishKvEvents(grpc::ServerContext*, grpc::ServerReader<v1::KvEventBatch>* reader,
                               v1::PublishKvEventsResponse*) override {
    v1::KvEventBatch batch;
    while (reader->Read(&batch)) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const v1::KvEvent& e : batch.events()) events_.push_back(e);
    }
    return grpc::Status::OK;
  }

  std::mutex mu_;
  std::vector<v1::KvEvent> events_;
  std::vector<v1::NodeInfo> nodes_;
  v1::HeartbeatRequest last_;
  int heartbeats_ = 0;
  std::atomic<bool> reregister_once_{false};
  bool draining_ = false;
};

template <typename F>
bool Eventually(F condition) {
  for (int i = 0; i < 1000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::unique_ptr<grpc::Server> Serve(RecordingScheduler* service, const std::string& address,
                                    int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

TEST(SchedulerLinkTest, RegistersHeartbeatsAndReregisters) {
  RecordingScheduler scheduler;
  int port = 0;
  auto server = Serve(&scheduler, "127.0.0.1:0", &port);
  ASSERT_NE(server, nullptr);
  v1::NodeInfo node;
  node.set_node_id("decode-7");
  node.set_role(v1::ROLE_DECODE);
  node.set_grpc_address("127.0.0.1:9999");
  std::atomic<uint32_t> queued{3};
  SchedulerLink link({.address = "127.0.0.1:" + std::to_string(port), .node = node, .load = [&] {
                        v1::WorkerLoad load;
                        load.set_queued_requests(queued.load());
                        load.set_total_kv_pages(256);
                        return load;
                      }});
  link.Start();
  ASSERT_TRUE(Eventually([&] { return link.heartbeats_sent() >= 3; }));
  EXPECT_TRUE(link.registered());
  {
    std::lock_guard<std::mutex> lock(scheduler.mu_);
    ASSERT_EQ(scheduler.nodes_.size(), 1u);
    EXPECT_EQ(scheduler.nodes_[0].role(), v1::ROLE_DECODE);
    EXPECT_EQ(scheduler.nodes_[0].grpc_address(), "127.0.0.1:9999");
    EXPECT_EQ(scheduler.last_.node_id(), "decode-7");
    EXPECT_EQ(scheduler.last_.load().total_kv_pages(), 256u);
  }
  queued = 9;
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(scheduler.mu_);
    return scheduler.last_.load().queued_requests() == 9u;
  }));
  // A scheduler that forgot the node (it restarted) gets a new Register.
  scheduler.reregister_once_ = true;
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(scheduler.mu_);
    return scheduler.nodes_.size() == 2u;
  }));
  {
    std::lock_guard<std::mutex> lock(scheduler.mu_);
    scheduler.draining_ = true;
  }
  EXPECT_TRUE(Eventually([&] { return link.draining(); }));
  link.Stop();
  server->Shutdown();
}

TEST(SchedulerLinkTest, RetriesUntilTheSchedulerIsUp) {
  // Learn a free port, then start the link before anything listens there.
  RecordingScheduler scheduler;
  int port = 0;
  auto probe = Serve(&scheduler, "127.0.0.1:0", &port);
  ASSERT_NE(probe, nullptr);
  probe->Shutdown();
  probe.reset();
  v1::NodeInfo node;
  node.set_node_id("prefill-1");
  SchedulerLink link({.address = "127.0.0.1:" + std::to_string(port),
                      .node = node,
                      .load = [] { return v1::WorkerLoad(); },
                      .rpc_timeout = absl::Milliseconds(200),
                      .max_backoff = absl::Milliseconds(200)});
  link.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(link.registered());
  int port2 = 0;
  auto server = Serve(&scheduler, "127.0.0.1:" + std::to_string(port), &port2);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Eventually([&] { return link.registered() && link.heartbeats_sent() > 0; }));
  link.Stop();
  server->Shutdown();
}

TEST(SchedulerLinkTest, PublishesResidentBlocksAsGpuTierEvents) {
  RecordingScheduler scheduler;
  int port = 0;
  auto server = Serve(&scheduler, "127.0.0.1:0", &port);
  ASSERT_NE(server, nullptr);
  runtime::HostKvPool pool({.num_layers = 1, .block_tokens = 4, .latent_dim = 8, .rope_dim = 4}, 4);
  ResidentBlocks resident(pool);
  v1::NodeInfo node;
  node.set_node_id("both-3");
  SchedulerLink link({.address = "127.0.0.1:" + std::to_string(port),
                      .node = node,
                      .load = [] { return v1::WorkerLoad(); },
                      .resident = &resident,
                      .publish_interval = absl::Milliseconds(20),
                      .digest_page_keys = 2});
  link.Start();
  auto events = [&] {
    std::lock_guard<std::mutex> lock(scheduler.mu_);
    return scheduler.events_;
  };
  // First an (empty) digest.
  ASSERT_TRUE(Eventually([&] { return !events().empty(); }));
  ASSERT_TRUE(events()[0].has_digest());
  EXPECT_EQ(events()[0].source(), "both-3");
  EXPECT_EQ(events()[0].digest().tier(), v1::TIER_GPU);
  EXPECT_TRUE(events()[0].digest().last_page());

  // Three blocks kept, then one of them taken back: stored, then evicted, numbered in order.
  std::vector<BlockKey> keys(3);
  for (int i = 0; i < 3; ++i) keys[i].bytes[0] = static_cast<uint8_t>(i + 1);
  runtime::PageTable table;
  ASSERT_TRUE(resident.EnsureCapacity(table, 12).ok());
  resident.Release(keys, 0, table);
  ASSERT_TRUE(Eventually([&] { return events().size() >= 2; }));
  ASSERT_TRUE(resident.EnsureCapacity(table, 8).ok());  // one free page + the tail block's
  ASSERT_TRUE(Eventually([&] { return events().size() >= 3; }));
  std::vector<v1::KvEvent> seen = events();
  ASSERT_TRUE(seen[1].has_stored());
  EXPECT_EQ(seen[1].stored().tier(), v1::TIER_GPU);
  ASSERT_EQ(seen[1].stored().keys_size(), 3);
  EXPECT_EQ(seen[1].stored().keys(2), std::string(keys[0].View()));  // released tail first
  EXPECT_EQ(seen[1].stored().parent_keys(2), "");
  EXPECT_EQ(seen[1].stored().parent_keys(0), std::string(keys[1].View()));
  ASSERT_TRUE(seen[2].has_evicted());
  ASSERT_EQ(seen[2].evicted().keys_size(), 1);
  EXPECT_EQ(seen[2].evicted().keys(0), std::string(keys[2].View()));
  EXPECT_EQ(seen[2].sequence(), seen[1].sequence() + 1);

  // After a re-registration the state comes again as a digest: two blocks, in pages of two keys.
  const int64_t digests = link.digests_sent();
  scheduler.reregister_once_ = true;
  // The link counts a digest page when it sends it; wait until the scheduler has received the
  // last page too (checking right after the count raced with the delivery).
  ASSERT_TRUE(Eventually([&] {
    if (link.digests_sent() <= digests) return false;
    const std::vector<v1::KvEvent> now = events();
    for (size_t i = 3; i < now.size(); ++i) {
      if (now[i].has_digest() && now[i].digest().last_page()) return true;
    }
    return false;
  }));
  seen = events();
  std::set<std::string> digested;
  bool last = false;
  for (size_t i = 3; i < seen.size(); ++i) {
    if (!seen[i].has_digest()) continue;
    for (const std::string& k : seen[i].digest().keys()) digested.insert(k);
    last = seen[i].digest().last_page();
  }
  EXPECT_TRUE(last);
  EXPECT_EQ(digested,
            (std::set<std::string>{std::string(keys[0].View()), std::string(keys[1].View())}));
  link.Stop();
  resident.Discard(table);
  server->Shutdown();
}

}  // namespace
}  // namespace strata::worker
