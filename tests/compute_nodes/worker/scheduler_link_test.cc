// SchedulerLink against a scheduler stand-in that records what it is told: register, heartbeats
// with the worker's load, re-register when the scheduler asks, and retry until it is reachable.
// (The real scheduler service is issue #7; this checks the worker's side of the protocol.)
#include "compute_nodes/worker/scheduler_link.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
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

  std::mutex mu_;
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

}  // namespace
}  // namespace strata::worker
