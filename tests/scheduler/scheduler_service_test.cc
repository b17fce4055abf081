// The Scheduler and SchedulerAdmin gRPC services of a SchedulerServer, driven over loopback as
// workers and operators call them: registration (and its refusals), heartbeats, re-registration
// after a restart, liveness, KV events pushed by a node, and the admin calls with their token.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/paths.h"
#include "scheduler/server/scheduler_server.h"
#include "strata/v1/scheduler.grpc.pb.h"
#include "tests/common/grpc_reflection_client.h"

namespace strata::scheduler {
namespace {

class SchedulerServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    SchedulerServerOptions o;
    o.model_dir = DeepSeekV3TokenizerDir();
    o.model_id = "dsv3";
    o.http_listen = "";
    o.admin_token = "s3cret";
    o.scheduler.heartbeat_interval = absl::Milliseconds(200);
    o.scheduler.missed_heartbeats_limit = 3;
    server_ = std::make_unique<SchedulerServer>(o);
    ASSERT_TRUE(server_->Start().ok());
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->grpc_port()),
                                       grpc::InsecureChannelCredentials());
    stub_ = v1::Scheduler::NewStub(channel);
    admin_ = v1::SchedulerAdmin::NewStub(channel);
  }

  static v1::NodeInfo Node(const std::string& id, char fingerprint_byte = 'f') {
    v1::NodeInfo n;
    n.set_node_id(id);
    n.set_role(v1::ROLE_BOTH);
    n.set_host_id("host-1");
    n.set_grpc_address("127.0.0.1:1");
    n.set_model("dsv3");
    n.mutable_kv_format()->set_block_tokens(64);
    n.set_model_fingerprint(std::string(32, fingerprint_byte));
    return n;
  }

  grpc::Status Register(const v1::NodeInfo& node, v1::RegisterResponse* resp) {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    *req.mutable_node() = node;
    return stub_->Register(&ctx, req, resp);
  }

  v1::HeartbeatResponse Heartbeat(const std::string& id, uint32_t queued = 0) {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    req.set_node_id(id);
    req.mutable_load()->set_queued_requests(queued);
    v1::HeartbeatResponse resp;
    EXPECT_TRUE(stub_->Heartbeat(&ctx, req, &resp).ok());
    return resp;
  }

  // An admin context carrying `token` ("" for none).
  static std::unique_ptr<grpc::ClientContext> Admin(const std::string& token = "s3cret") {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  v1::ListNodesResponse List() {
    v1::ListNodesResponse resp;
    EXPECT_TRUE(admin_->ListNodes(Admin().get(), {}, &resp).ok());
    return resp;
  }

  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<v1::SchedulerAdmin::Stub> admin_;
};

TEST_F(SchedulerServiceTest, RegisterHeartbeatAndRefusals) {
  v1::RegisterResponse resp;
  ASSERT_TRUE(Register(Node("w0"), &resp).ok());
  EXPECT_EQ(resp.node_id(), "w0");
  EXPECT_EQ(resp.heartbeat_interval_ms(), 200u);
  ASSERT_TRUE(server_->directory().Reference().has_value());
  EXPECT_EQ(server_->directory().Reference()->block_tokens, 64u);

  // Another model (fingerprint) or block size would never share a block: refused.
  EXPECT_EQ(Register(Node("w1", 'g'), &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::NodeInfo odd = Node("w1");
  odd.mutable_kv_format()->set_block_tokens(32);
  EXPECT_EQ(Register(odd, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(server_->directory().Reference()->kv_bytes_per_token, 0) << "no geometry reported";
  v1::NodeInfo fp8 = Node("w1");  // fp8 blocks live in another namespace than bf16 ones
  fp8.mutable_kv_format()->set_codec(v1::CODEC_FP8_E4M3);
  EXPECT_EQ(Register(fp8, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(server_->directory().Reference()->codec, KvCodec::kBf16);
  v1::NodeInfo bad = Node("w1");
  bad.mutable_kv_format()->set_codec(static_cast<v1::Codec>(9));
  EXPECT_EQ(Register(bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = Node("w1");
  bad.set_model_fingerprint("short");
  EXPECT_EQ(Register(bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = Node("w1");
  bad.set_role(v1::ROLE_CACHE);
  EXPECT_EQ(Register(bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = Node("w1");
  bad.clear_grpc_address();
  EXPECT_EQ(Register(bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The same worker re-registering (it restarted) is fine, and its KV geometry prices its blocks:
  // DeepSeek-V3 (61 layers of 512 + 64) in bf16 is 70,272 bytes a token.
  v1::NodeInfo v3 = Node("w0");
  v3.mutable_kv_format()->set_num_layers(61);
  v3.mutable_kv_format()->set_kv_lora_rank(512);
  v3.mutable_kv_format()->set_rope_dim(64);
  ASSERT_TRUE(Register(v3, &resp).ok());
  EXPECT_EQ(server_->directory().Get(server_->directory().Reference()->index)->kv_bytes_per_token,
            70272);
  ASSERT_TRUE(Register(Node("w0"), &resp).ok());
  EXPECT_FALSE(Heartbeat("w0", 7).reregister());
  EXPECT_TRUE(Heartbeat("never-registered").reregister());
  const v1::ListNodesResponse list = List();
  ASSERT_EQ(list.nodes_size(), 1);
  EXPECT_EQ(list.nodes(0).node().node_id(), "w0");
  EXPECT_EQ(list.nodes(0).node().grpc_address(), "127.0.0.1:1");
  EXPECT_EQ(list.nodes(0).load().queued_requests(), 7u);
  EXPECT_TRUE(list.nodes(0).alive());
  EXPECT_EQ(list.policy(), "strata");
}

// Operators reach the admin API with grpcurl, which needs server reflection (as on the cache and
// worker daemons).
TEST_F(SchedulerServiceTest, ListsItsServicesThroughReflection) {
  absl::StatusOr<std::vector<std::string>> names =
      grpc_test::ListGrpcServices("127.0.0.1:" + std::to_string(server_->grpc_port()));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ::testing::IsSupersetOf({"strata.v1.Scheduler", "strata.v1.SchedulerAdmin"}));
}

TEST_F(SchedulerServiceTest, ANodeThatStopsHeartbeatingIsMarkedDead) {
  v1::RegisterResponse resp;
  ASSERT_TRUE(Register(Node("w0"), &resp).ok());
  bool dead = false;
  for (int i = 0; i < 200 && !dead; ++i) {  // limit: 3 × 200 ms; polled for up to 20 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    dead = !List().nodes(0).alive();
  }
  EXPECT_TRUE(dead);
  Heartbeat("w0");
  EXPECT_TRUE(List().nodes(0).alive());
}

TEST_F(SchedulerServiceTest, AdminCallsNeedTheToken) {
  v1::ListNodesResponse list;
  EXPECT_EQ(admin_->ListNodes(Admin("").get(), {}, &list).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(admin_->ListNodes(Admin("wrong").get(), {}, &list).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::SetPolicyRequest set;
  set.set_policy("random");
  v1::SetPolicyResponse set_resp;
  EXPECT_EQ(admin_->SetPolicy(Admin("s3cre").get(), set, &set_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server_->scheduler().policy_name(), "strata");
}

TEST_F(SchedulerServiceTest, DrainSetPolicyAndIndexStats) {
  v1::RegisterResponse resp;
  ASSERT_TRUE(Register(Node("w0"), &resp).ok());

  v1::DrainNodeRequest drain;
  drain.set_node_id("w0");
  v1::DrainNodeResponse drained;
  ASSERT_TRUE(admin_->DrainNode(Admin().get(), drain, &drained).ok());
  EXPECT_TRUE(drained.node().draining());
  EXPECT_TRUE(Heartbeat("w0").draining());  // the worker hears it
  drain.set_undrain(true);
  ASSERT_TRUE(admin_->DrainNode(Admin().get(), drain, &drained).ok());
  EXPECT_FALSE(Heartbeat("w0").draining());
  drain.set_node_id("nobody");
  EXPECT_EQ(admin_->DrainNode(Admin().get(), drain, &drained).error_code(),
            grpc::StatusCode::NOT_FOUND);

  v1::SetPolicyRequest set;
  set.set_policy("least_loaded");
  v1::SetPolicyResponse set_resp;
  ASSERT_TRUE(admin_->SetPolicy(Admin().get(), set, &set_resp).ok());
  EXPECT_EQ(set_resp.previous(), "strata");
  EXPECT_EQ(server_->scheduler().policy_name(), "least_loaded");
  set.set_policy("no-such-policy");
  EXPECT_EQ(admin_->SetPolicy(Admin().get(), set, &set_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // A node pushes KV events: they land in the index under it.
  {
    grpc::ClientContext ctx;
    v1::PublishKvEventsResponse pub;
    auto writer = stub_->PublishKvEvents(&ctx, &pub);
    v1::KvEventBatch batch;
    v1::KvEvent* e = batch.add_events();
    e->set_sequence(1);
    e->set_source("w0");
    e->mutable_stored()->add_keys(std::string(16, 'k'));
    e->mutable_stored()->add_keys(std::string(16, 'l'));
    e->mutable_stored()->set_tier(v1::TIER_DRAM);
    v1::KvEvent* stranger = batch.add_events();  // an unregistered source is ignored
    *stranger = *e;
    stranger->set_source("unknown");
    ASSERT_TRUE(writer->Write(batch));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    EXPECT_EQ(pub.accepted(), 1u);
  }
  v1::GetIndexStatsResponse stats;
  ASSERT_TRUE(admin_->GetIndexStats(Admin().get(), {}, &stats).ok());
  EXPECT_EQ(stats.indexed_blocks(), 2u);
  EXPECT_GT(stats.capacity_blocks(), 0u);
  EXPECT_EQ(List().nodes(0).indexed_blocks(), 2u);
}

TEST_F(SchedulerServiceTest, WithoutATokenAdminIsRefused) {
  SchedulerServerOptions o;
  o.model_dir = DeepSeekV3TokenizerDir();
  o.http_listen = "";
  SchedulerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  auto admin = v1::SchedulerAdmin::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server.grpc_port()), grpc::InsecureChannelCredentials()));
  v1::ListNodesResponse list;
  EXPECT_EQ(admin->ListNodes(Admin("").get(), {}, &list).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(admin->ListNodes(Admin("anything").get(), {}, &list).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace strata::scheduler
