// The generated v1 contracts compile, serialize, and carry statuses across a real gRPC channel.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/block_key.h"
#include "common/grpc_status.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/cache_admin.grpc.pb.h"
#include "strata/v1/scheduler.grpc.pb.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata {
namespace {

// Answers Lookup with the longest prefix of keys it was told about; NotFound on an empty list
// of keys — enough to prove requests, responses and statuses cross the wire intact.
class FakeCacheControl final : public v1::CacheControl::Service {
 public:
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* req,
                      v1::LookupResponse* resp) override {
    if (req->keys().empty()) return ToGrpcStatus(absl::InvalidArgumentError("no keys"));
    for (const auto& key : req->keys()) {
      if (key != known_) break;
      auto* loc = resp->add_locations();
      loc->set_key(key);
      loc->set_tier(v1::TIER_DRAM);
      loc->set_length(64 * 1152);
    }
    resp->set_hit_blocks(resp->locations_size());
    return grpc::Status::OK;
  }
  std::string known_;
};

TEST(GrpcContractTest, LookupAcrossAChannel) {
  FakeCacheControl service;
  const Namespace ns = MakeNamespace({}, {}, "");
  std::vector<uint32_t> tokens(128, 5);
  const auto keys = ComputeBlockKeys(ns, tokens);
  service.known_ = std::string(keys[0].View());

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = v1::CacheControl::NewStub(channel);

  v1::LookupRequest req;
  req.set_namespace_id(std::string(ns.View()));
  for (const auto& k : keys) req.add_keys(std::string(k.View()));
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Lookup(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.hit_blocks(), 1u);  // the second key differs (its parent differs)
  EXPECT_EQ(resp.locations(0).key(), keys[0].View());
  EXPECT_EQ(resp.locations(0).tier(), v1::TIER_DRAM);

  v1::LookupRequest empty;
  grpc::ClientContext ctx2;
  const absl::Status st = FromGrpcStatus(stub->Lookup(&ctx2, empty, &resp));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "no keys");
  server->Shutdown();
}

TEST(GrpcContractTest, MessagesRoundTrip) {
  v1::KvEvent event;
  event.set_sequence(7);
  auto* stored = event.mutable_stored();
  stored->add_keys(std::string(16, 'k'));
  stored->set_tier(v1::TIER_SSD);
  v1::KvEvent parsed;
  ASSERT_TRUE(parsed.ParseFromString(event.SerializeAsString()));
  EXPECT_EQ(parsed.event_case(), v1::KvEvent::kStored);
  EXPECT_EQ(parsed.stored().keys(0), std::string(16, 'k'));

  v1::BlockSelector selector;
  selector.set_tenant("acme");
  EXPECT_EQ(selector.selector_case(), v1::BlockSelector::kTenant);

  // Every service the architecture names exists with its methods. (Touching one message of
  // each file links its descriptors in.)
  for (const auto* d : {v1::ConnectRequest::descriptor(), v1::GetStatsRequest::descriptor(),
                        v1::WorkerStatus::descriptor(), v1::NodeInfo::descriptor()}) {
    ASSERT_NE(d, nullptr);
  }
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const char* method :
       {"strata.v1.CacheControl.Reserve", "strata.v1.CacheControl.SubscribeEvents",
        "strata.v1.CacheAdmin.Drain", "strata.v1.CacheAdmin.Verify", "strata.v1.Worker.Decode",
        "strata.v1.Scheduler.Heartbeat", "strata.v1.SchedulerAdmin.SetPolicy"}) {
    EXPECT_NE(pool->FindMethodByName(method), nullptr) << method;
  }
  EXPECT_TRUE(pool->FindMethodByName("strata.v1.Worker.Decode")->server_streaming());
}

}  // namespace
}  // namespace strata
