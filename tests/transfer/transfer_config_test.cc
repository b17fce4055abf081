// `transfer.*` config keys → transfer::EngineOptions.
#include <gtest/gtest.h>

#include "cli/strata_config.h"

namespace strata {
namespace {

absl::StatusOr<transfer::EngineOptions> Load(std::vector<std::string> overrides,
                                             StrataConfig* config) {
  ConfigSchema schema;
  config->Register(schema);
  auto st = schema.Load({.overrides = std::move(overrides),
                         .getenv = [](const char*) -> const char* { return nullptr; }});
  if (!st.ok()) return st;
  return config->transfer.ToEngineOptions("host-a", transfer::ClusterSecret("k"));
}

TEST(TransferConfigTest, DefaultsChooseTheTransportPerPeer) {
  StrataConfig config;
  auto o = Load({}, &config);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->force_transport.has_value());
  EXPECT_EQ(o->host_id, "host-a");
  EXPECT_EQ(o->secret.key(), "k");
  EXPECT_EQ(o->tcp_connections_per_peer, 4);
  EXPECT_EQ(o->tcp_threads_per_peer, 4);
  EXPECT_TRUE(o->enable_rdma);
  EXPECT_EQ(o->rdma_qps_per_peer, 4);
  EXPECT_TRUE(o->enable_cuda);
  EXPECT_EQ(o->connect_timeout, absl::Seconds(5));
  EXPECT_EQ(config.transfer.request_timeout, absl::Seconds(10));
}

TEST(TransferConfigTest, EveryKeyReachesTheEngineOptions) {
  StrataConfig config;
  auto o = Load(
      {"transfer.transport=tcp", "transfer.tcp.connections_per_peer=2",
       "transfer.tcp.threads_per_peer=3", "transfer.rdma.enable=false", "transfer.rdma.qps_per_peer=8", "transfer.cuda.enable=false",
       "transfer.connect_timeout=750ms", "transfer.request_timeout=3s"},
      &config);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->force_transport.has_value());
  EXPECT_EQ(*o->force_transport, transfer::TransportKind::kTcp);
  EXPECT_EQ(o->tcp_connections_per_peer, 2);
  EXPECT_EQ(o->tcp_threads_per_peer, 3);
  EXPECT_FALSE(o->enable_rdma);
  EXPECT_EQ(o->rdma_qps_per_peer, 8);
  EXPECT_FALSE(o->enable_cuda);
  EXPECT_EQ(o->connect_timeout, absl::Milliseconds(750));
  EXPECT_EQ(config.transfer.request_timeout, absl::Seconds(3));
}

TEST(TransferConfigTest, BadValuesAreRefused) {
  StrataConfig config;
  EXPECT_FALSE(Load({"transfer.transport=carrier-pigeon"}, &config).ok());
  EXPECT_FALSE(Load({"transfer.tcp.connections_per_peer=0"}, &config).ok());
  EXPECT_FALSE(Load({"transfer.rdma.qps_per_peer=1000"}, &config).ok());
}

}  // namespace
}  // namespace strata
