// Drain to another cache server (admin Drain with a target address): two real cache servers in
// one process, the data plane over tcp (different host ids). Blocks arrive checksum-verified with
// namespace, tenant, chain and pins, and leave the source only once the target has them.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cache_service/cache_server.h"
#include "strata/v1/cache_admin.grpc.pb.h"
#include "tests/cache_service/store_test_util.h"

namespace strata::cache {
namespace {

using testing_util::Chain;
using testing_util::FreshDir;
using testing_util::Get;
using testing_util::Ns;
using testing_util::Put;

constexpr size_t kBytes = 10000;
constexpr char kToken[] = "drain-token";

std::unique_ptr<CacheServer> StartServer(const std::string& id, const std::string& host,
                                         std::map<std::string, uint64_t> quotas = {}) {
  CacheServerOptions o;
  o.store.server_id = id;
  o.store.data_dir = FreshDir("drain-" + id);
  o.store.slot_bytes = 16 << 10;
  o.store.dram_capacity_bytes = 32 * (16 << 10);
  o.store.ssd_capacity_bytes = 32 * (16 << 10);
  o.store.tenant_quota_bytes = std::move(quotas);
  o.admin_token = kToken;
  o.host_id = host;
  o.cluster_secret = "cluster-secret";
  o.http_listen = "";
  auto server = std::make_unique<CacheServer>(o);
  const absl::Status st = server->Start();
  EXPECT_TRUE(st.ok()) << st;
  return server;
}

grpc::Status DrainVia(const CacheServer& from, const std::string& target, v1::DrainResponse* resp) {
  auto stub = v1::CacheAdmin::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(const_cast<CacheServer&>(from).grpc_port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + kToken);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::DrainRequest req;
  req.set_target_address(target);
  return stub->Drain(&ctx, req, resp);
}

std::map<std::string, v1::BlockInfo> Blocks(BlockStore& store) {
  v1::ListBlocksRequest req;
  req.set_page_size(1000);
  v1::ListBlocksResponse resp;
  EXPECT_TRUE(store.ListBlocks(req, &resp).ok());
  std::map<std::string, v1::BlockInfo> out;
  for (const auto& b : resp.blocks()) out[b.key()] = b;
  return out;
}

void PinKeys(BlockStore& store, const std::vector<BlockKey>& keys, v1::PinKind kind,
             uint32_t ttl = 0) {
  v1::PinRequest req;
  for (const auto& k : keys)
    req.mutable_selector()->mutable_keys()->add_keys(std::string(k.View()));
  req.set_kind(kind);
  req.set_ttl_seconds(ttl);
  v1::PinResponse resp;
  ASSERT_TRUE(store.Pin(req, &resp).ok());
}

TEST(RemoteDrainTest, MovesEveryDramBlockWithItsMetadataAndDropsIt) {
  auto a = StartServer("cache-a", "host-a");
  auto b = StartServer("cache-b", "host-b");
  const Namespace ns1 = Ns("drain-1"), ns2 = Ns("drain-2");
  const auto chain1 = Chain(ns1, 5, 1);
  const auto chain2 = Chain(ns2, 3, 2);
  ASSERT_EQ(Put(a->store(), ns1, chain1, kBytes, "acme").codes, std::vector<int>(5, 0));
  ASSERT_EQ(Put(a->store(), ns2, chain2, kBytes, "beta").codes, std::vector<int>(3, 0));
  PinKeys(a->store(), {chain1[0]}, v1::PIN_HARD);
  PinKeys(a->store(), {chain1[1]}, v1::PIN_TTL, 600);
  const auto before = Blocks(a->store());
  ASSERT_EQ(before.size(), 8u);

  v1::DrainResponse resp;
  const grpc::Status st = DrainVia(*a, "127.0.0.1:" + std::to_string(b->grpc_port()), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.moved_blocks(), 8u);
  EXPECT_EQ(resp.moved_bytes(), 8 * kBytes);
  EXPECT_EQ(resp.failed_blocks(), 0u);

  // Gone here (every tier), there with the same metadata.
  EXPECT_TRUE(Blocks(a->store()).empty());
  const auto after = Blocks(b->store());
  ASSERT_EQ(after.size(), 8u);
  for (const auto& [key, was] : before) {
    ASSERT_TRUE(after.contains(key));
    const v1::BlockInfo& now = after.at(key);
    EXPECT_EQ(now.namespace_id(), was.namespace_id());
    EXPECT_EQ(now.tenant(), was.tenant());
    EXPECT_EQ(now.parent_key(), was.parent_key());
    EXPECT_EQ(now.checksum(), was.checksum());
    EXPECT_EQ(now.payload_bytes(), was.payload_bytes());
    EXPECT_EQ(now.pin(), was.pin());
  }
  const auto& ttl = after.at(std::string(chain1[1].View()));
  EXPECT_EQ(ttl.pin(), v1::PIN_TTL);
  EXPECT_GT(ttl.pin_expires_unix_ms(), absl::ToUnixMillis(absl::Now()) + 500 * 1000);
  // The bytes themselves: read back from the target's arena and checked against the payloads.
  const auto got1 = Get(b->store(), ns1, chain1, kBytes);
  EXPECT_EQ(got1.hits, 5u);
  EXPECT_TRUE(got1.all_valid);
  const auto got2 = Get(b->store(), ns2, chain2, kBytes);
  EXPECT_EQ(got2.hits, 3u);
  EXPECT_TRUE(got2.all_valid);
  b->Shutdown();
  a->Shutdown();
}

TEST(RemoteDrainTest, AnUnreachableTargetLosesNothing) {
  auto a = StartServer("cache-c", "host-c");
  const Namespace ns = Ns("drain-3");
  const auto chain = Chain(ns, 3, 3);
  ASSERT_EQ(Put(a->store(), ns, chain, kBytes).codes, std::vector<int>(3, 0));
  v1::DrainResponse resp;
  // Port 1: nothing listens there, the connection is refused at once.
  const grpc::Status st = DrainVia(*a, "127.0.0.1:1", &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_EQ(resp.moved_blocks(), 0u);
  const auto got = Get(a->store(), ns, chain, kBytes);
  EXPECT_EQ(got.hits, 3u);
  EXPECT_TRUE(got.all_valid);
  // Draining into itself is refused rather than deleting everything.
  v1::DrainResponse self;
  EXPECT_EQ(DrainVia(*a, "127.0.0.1:" + std::to_string(a->grpc_port()), &self).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Get(a->store(), ns, chain, kBytes).hits, 3u);
  a->Shutdown();
}

TEST(RemoteDrainTest, BlocksTheTargetRefusesStayHere) {
  auto a = StartServer("cache-d", "host-d");
  // The target takes only two of this tenant's blocks (quota), so the drain stops midway.
  auto b = StartServer("cache-e", "host-e", {{"acme", 2 * kBytes}});
  const Namespace ns = Ns("drain-4");
  const auto chain = Chain(ns, 5, 4);
  ASSERT_EQ(Put(a->store(), ns, chain, kBytes, "acme").codes, std::vector<int>(5, 0));
  v1::DrainResponse resp;
  const grpc::Status st = DrainVia(*a, "127.0.0.1:" + std::to_string(b->grpc_port()), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.moved_blocks(), 2u);
  EXPECT_EQ(resp.failed_blocks(), 3u);
  // Every block exists exactly once: on the target or still here, and intact either way.
  const auto here = Blocks(a->store());
  const auto there = Blocks(b->store());
  EXPECT_EQ(here.size(), 3u);
  EXPECT_EQ(there.size(), 2u);
  for (const auto& k : chain) {
    const std::string key(k.View());
    EXPECT_NE(here.contains(key), there.contains(key));
  }
  for (BlockStore* s : {&a->store(), &b->store()}) {
    for (size_t i = 0; i < chain.size(); ++i) {
      if (!Blocks(*s).contains(std::string(chain[i].View()))) continue;
      v1::LookupRequest req;
      req.set_namespace_id(std::string(ns.View()));
      req.add_keys(std::string(chain[i].View()));
      req.set_promote(true);
      v1::LookupResponse lresp;
      ASSERT_TRUE(s->Lookup(req, &lresp).ok());
      ASSERT_EQ(lresp.hit_blocks(), 1u);
      const std::string bytes(
          reinterpret_cast<const char*>(s->dram().base() + lresp.locations(0).offset()), kBytes);
      EXPECT_EQ(bytes, testing_util::Payload(chain[i], kBytes));
    }
  }
  b->Shutdown();
  a->Shutdown();
}

}  // namespace
}  // namespace strata::cache
