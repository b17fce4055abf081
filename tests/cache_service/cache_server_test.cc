// The cache server over gRPC: the admin token is enforced, the control API round-trips blocks,
// and subscribers get a digest followed by KV events.
#include "cache_service/cache_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/checksum.h"
#include "common/metrics.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/cache_admin.grpc.pb.h"
#include "tests/cache_service/store_test_util.h"
#include "transfer/transfer_engine.h"

namespace strata::cache {
namespace {

using testing_util::Chain;
using testing_util::FreshDir;
using testing_util::Ns;
using testing_util::Payload;

constexpr size_t kBytes = 10000;

// The value of one series of the process's /metrics text (0 when absent): `name{labels}`, the
// labels given as they are rendered, e.g. `tier="dram"`.
double MetricValue(const std::string& name, const std::vector<std::string>& labels) {
  const std::string text = MetricsRegistry::Default().RenderPrometheus();
  size_t pos = 0;
  while ((pos = text.find(name + "{", pos)) != std::string::npos) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end;
    bool all = true;
    for (const auto& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

class CacheServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CacheServerOptions o;
    o.store.server_id = "srv";
    o.store.data_dir = FreshDir("server");
    o.store.slot_bytes = 16 << 10;
    o.store.dram_capacity_bytes = 64 * (16 << 10);
    o.store.ssd_capacity_bytes = 64 * (16 << 10);
    o.admin_token = "s3cret";
    o.host_id = "host-1";
    o.digest_interval = absl::Milliseconds(200);
    o.cluster_secret = "cluster-secret";
    o.shm_socket_path = o.store.data_dir + "/shm.sock";
    server_ = std::make_unique<CacheServer>(o);
    ASSERT_TRUE(server_->Start().ok());
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
    control_ = v1::CacheControl::NewStub(channel_);
    admin_ = v1::CacheAdmin::NewStub(channel_);
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status Stats(const std::string& auth, v1::GetStatsResponse* resp) {
    grpc::ClientContext ctx;
    if (!auth.empty()) ctx.AddMetadata("authorization", auth);
    return admin_->GetStats(&ctx, {}, resp);
  }

  // Stores the chain `keys` as a client on this host does: Reserve, a direct write of each payload
  // into its DRAM slot, Commit with the checksums.
  void PutChain(const Namespace& ns, const std::vector<BlockKey>& keys, const std::string& tenant,
                const std::string& client_id, v1::CommitResponse* mresp) {
    v1::ReserveRequest rreq;
    rreq.set_client_id(client_id);
    rreq.set_namespace_id(std::string(ns.View()));
    rreq.set_tenant(tenant);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto* b = rreq.add_blocks();
      b->set_key(std::string(keys[i].View()));
      if (i > 0) b->set_parent_key(std::string(keys[i - 1].View()));
      b->set_payload_bytes(kBytes);
    }
    grpc::ClientContext rctx;
    v1::ReserveResponse rresp;
    ASSERT_TRUE(control_->Reserve(&rctx, rreq, &rresp).ok());
    v1::CommitRequest commit;
    commit.set_lease_id(rresp.lease().lease_id());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(rresp.slots(i).status().code(), 0);
      const std::string data = Payload(keys[i], kBytes);
      std::memcpy(server_->store().dram().base() + rresp.slots(i).location().offset(), data.data(),
                  kBytes);
      auto* c = commit.add_blocks();
      c->set_key(std::string(keys[i].View()));
      c->set_checksum(Checksum64(data));
    }
    grpc::ClientContext mctx;
    ASSERT_TRUE(control_->Commit(&mctx, commit, mresp).ok());
  }

  std::unique_ptr<CacheServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CacheControl::Stub> control_;
  std::unique_ptr<v1::CacheAdmin::Stub> admin_;
};

TEST_F(CacheServerTest, AdminCallsNeedTheBearerToken) {
  v1::GetStatsResponse resp;
  EXPECT_EQ(Stats("", &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Stats("Bearer wrong", &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Stats("s3cret", &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Stats("Bearer s3cre", &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(Stats("Bearer s3cret", &resp).ok());
  EXPECT_EQ(resp.server_id(), "srv");
  ASSERT_EQ(resp.tiers_size(), 2);
  // Every admin method is guarded, not just stats.
  grpc::ClientContext ctx;
  v1::EvictRequest ev;
  ev.mutable_selector()->set_all(true);
  v1::EvictResponse eresp;
  EXPECT_EQ(admin_->Evict(&ctx, ev, &eresp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(CacheServerNoTokenTest, AdminIsRefusedWhenNoTokenIsConfigured) {
  CacheServerOptions o;
  o.store.data_dir = FreshDir("server-notoken");
  o.store.slot_bytes = 16 << 10;
  o.store.dram_capacity_bytes = 4 * (16 << 10);
  CacheServer server(o);
  ASSERT_TRUE(server.Start().ok());
  auto stub = v1::CacheAdmin::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server.grpc_port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer ");
  v1::GetStatsResponse resp;
  EXPECT_EQ(stub->GetStats(&ctx, {}, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  server.Shutdown();
}

TEST_F(CacheServerTest, ControlRoundTripAndEventStream) {
  grpc::ClientContext cctx;
  v1::ConnectRequest creq;
  creq.set_host_id("host-1");
  v1::ConnectResponse cresp;
  ASSERT_TRUE(control_->Connect(&cctx, creq, &cresp).ok());
  EXPECT_EQ(cresp.chosen_transport(), v1::TRANSPORT_SHM);
  ASSERT_EQ(cresp.segments_size(), 1);
  bool tcp = false, shm = false;
  for (const auto& ep : cresp.segments(0).endpoints()) {
    tcp |= ep.kind() == v1::TRANSPORT_TCP;
    shm |= ep.kind() == v1::TRANSPORT_SHM;
  }
  EXPECT_TRUE(tcp);
  EXPECT_TRUE(shm);

  grpc::ClientContext sctx;
  v1::SubscribeEventsRequest sreq;
  sreq.set_digest_interval_ms(200);
  auto reader = control_->SubscribeEvents(&sctx, sreq);
  v1::KvEventBatch batch;
  ASSERT_TRUE(reader->Read(&batch));  // a new subscriber starts with a digest
  ASSERT_GT(batch.events_size(), 0);
  EXPECT_TRUE(batch.events(0).has_digest());

  const Namespace ns = Ns("grpc");
  const auto keys = Chain(ns, 2, 1);
  v1::CommitResponse mresp;
  ASSERT_NO_FATAL_FAILURE(PutChain(ns, keys, /*tenant=*/"t", /*client_id=*/"", &mresp));
  EXPECT_TRUE(mresp.durable());

  grpc::ClientContext lctx;
  v1::LookupRequest lreq;
  lreq.set_namespace_id(std::string(ns.View()));
  for (const auto& k : keys) lreq.add_keys(std::string(k.View()));
  lreq.set_lease(true);
  v1::LookupResponse lresp;
  ASSERT_TRUE(control_->Lookup(&lctx, lreq, &lresp).ok());
  EXPECT_EQ(lresp.hit_blocks(), 2u);
  grpc::ClientContext kctx;
  v1::KeepAliveRequest kreq;
  kreq.add_lease_ids(lresp.lease().lease_id());
  v1::KeepAliveResponse kresp;
  ASSERT_TRUE(control_->KeepAlive(&kctx, kreq, &kresp).ok());
  EXPECT_GT(kresp.expires_unix_ms(0), 0);
  grpc::ClientContext relctx;
  v1::ReleaseRequest rel;
  rel.set_lease_id(lresp.lease().lease_id());
  v1::ReleaseResponse relresp;
  EXPECT_TRUE(control_->Release(&relctx, rel, &relresp).ok());
  grpc::ClientContext relctx2;
  EXPECT_EQ(control_->Release(&relctx2, rel, &relresp).error_code(), grpc::StatusCode::NOT_FOUND);

  // The stream carries `stored` for both tiers, then a digest naming the keys.
  bool stored_dram = false, stored_ssd = false, digest_has_keys = false;
  for (int reads = 0; reads < 50 && !(stored_dram && stored_ssd && digest_has_keys); ++reads) {
    ASSERT_TRUE(reader->Read(&batch));
    for (const auto& e : batch.events()) {
      if (e.has_stored() && e.stored().keys_size() == 2) {
        stored_dram |= e.stored().tier() == v1::TIER_DRAM;
        stored_ssd |= e.stored().tier() == v1::TIER_SSD;
        EXPECT_EQ(e.stored().parent_keys(1), keys[0].View());
      }
      if (e.has_digest() && e.digest().keys_size() == 2) digest_has_keys = true;
    }
  }
  EXPECT_TRUE(stored_dram);
  EXPECT_TRUE(stored_ssd);
  EXPECT_TRUE(digest_has_keys);
  sctx.TryCancel();
}

// The data path as workers use it: Reserve → write through the transfer engine (tcp, then shm)
// with the per-slot capability → Commit → Lookup → read into the client's own buffer → Release.
TEST_F(CacheServerTest, DataPathThroughTheTransferEngine) {
  grpc::ClientContext cctx;
  v1::ConnectRequest creq;
  creq.set_host_id("host-1");
  v1::ConnectResponse cresp;
  ASSERT_TRUE(control_->Connect(&cctx, creq, &cresp).ok());
  transfer::PeerSpec spec{.name = "cache", .host_id = cresp.host_id()};
  for (const auto& ep : cresp.segments(0).endpoints()) {
    spec.endpoints.push_back({.kind = static_cast<transfer::TransportKind>(ep.kind()),
                              .address = ep.address(),
                              .host_id = ep.host_id()});
  }
  for (const auto kind : {transfer::TransportKind::kTcp, transfer::TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto engine =
        transfer::TransferEngine::Create({.host_id = "host-1",
                                          .secret = transfer::ClusterSecret("cluster-secret"),
                                          .force_transport = kind,
                                          .enable_rdma = false});
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto peer = (*engine)->OpenPeer(spec);
    ASSERT_TRUE(peer.ok()) << peer.status();

    const Namespace ns = Ns(std::string("xfer-") + std::string(transfer::TransportKindName(kind)));
    const auto keys = Chain(ns, 3, 7);
    v1::ReserveRequest rreq;
    rreq.set_namespace_id(std::string(ns.View()));
    for (size_t i = 0; i < keys.size(); ++i) {
      auto* b = rreq.add_blocks();
      b->set_key(std::string(keys[i].View()));
      if (i > 0) b->set_parent_key(std::string(keys[i - 1].View()));
      b->set_payload_bytes(kBytes);
    }
    grpc::ClientContext rctx;
    v1::ReserveResponse rresp;
    ASSERT_TRUE(control_->Reserve(&rctx, rreq, &rresp).ok());
    std::vector<std::string> payloads;
    std::vector<transfer::TransferOp> writes;
    v1::CommitRequest commit;
    commit.set_lease_id(rresp.lease().lease_id());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(rresp.slots(i).status().code(), 0);
      const auto& loc = rresp.slots(i).location();
      ASSERT_FALSE(loc.capability().empty());
      payloads.push_back(Payload(keys[i], kBytes));
      writes.push_back({.op = transfer::OpKind::kWrite,
                        .local = payloads.back().data(),
                        .segment = loc.segment(),
                        .offset = loc.offset(),
                        .length = loc.length(),
                        .capability = loc.capability()});
      auto* c = commit.add_blocks();
      c->set_key(std::string(keys[i].View()));
      c->set_checksum(Checksum64(payloads.back()));
    }
    auto wbatch = (*engine)->Submit(**peer, writes);
    ASSERT_TRUE(wbatch->Wait(absl::Seconds(30)));
    ASSERT_TRUE(wbatch->FirstError().ok()) << wbatch->FirstError();
    grpc::ClientContext mctx;
    v1::CommitResponse mresp;
    ASSERT_TRUE(control_->Commit(&mctx, commit, &mresp).ok());
    for (const auto& r : mresp.results()) EXPECT_EQ(r.code(), 0) << r.message();

    grpc::ClientContext lctx;
    v1::LookupRequest lreq;
    lreq.set_namespace_id(std::string(ns.View()));
    for (const auto& k : keys) lreq.add_keys(std::string(k.View()));
    lreq.set_lease(true);
    lreq.set_promote(true);
    v1::LookupResponse lresp;
    ASSERT_TRUE(control_->Lookup(&lctx, lreq, &lresp).ok());
    ASSERT_EQ(lresp.hit_blocks(), 3u);
    std::vector<std::string> bufs(keys.size(), std::string(kBytes, '\0'));
    std::vector<transfer::TransferOp> reads;
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& loc = lresp.locations(i);
      reads.push_back({.op = transfer::OpKind::kRead,
                       .local = bufs[i].data(),
                       .segment = loc.segment(),
                       .offset = loc.offset(),
                       .length = loc.length(),
                       .capability = loc.capability()});
    }
    auto rbatch = (*engine)->Submit(**peer, reads);
    ASSERT_TRUE(rbatch->Wait(absl::Seconds(30)));
    ASSERT_TRUE(rbatch->FirstError().ok()) << rbatch->FirstError();
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(Checksum64(bufs[i]), lresp.locations(i).checksum());
      EXPECT_EQ(bufs[i], payloads[i]);
    }
    if (kind == transfer::TransportKind::kTcp) {
      // A read capability does not allow writing the block it names.
      transfer::TransferOp forged = reads[0];
      forged.op = transfer::OpKind::kWrite;
      auto fbatch = (*engine)->Submit(**peer, {forged});
      ASSERT_TRUE(fbatch->Wait(absl::Seconds(30)));
      EXPECT_TRUE(absl::IsPermissionDenied(fbatch->status(0))) << fbatch->status(0);
    }
    grpc::ClientContext relctx;
    v1::ReleaseRequest rel;
    rel.set_lease_id(lresp.lease().lease_id());
    v1::ReleaseResponse relresp;
    EXPECT_TRUE(control_->Release(&relctx, rel, &relresp).ok());
  }
}

// /metrics counts payload bytes per transport (the one Connect chose for the client) and per tier,
// and hits per tier.
TEST_F(CacheServerTest, MetricsCountBytesPerTransportAndTier) {
  grpc::ClientContext cctx;
  v1::ConnectRequest creq;
  creq.set_client_id("metrics-client");
  creq.set_host_id("host-1");  // same host: shm
  v1::ConnectResponse cresp;
  ASSERT_TRUE(control_->Connect(&cctx, creq, &cresp).ok());
  ASSERT_EQ(cresp.chosen_transport(), v1::TRANSPORT_SHM);
  const double shm_in =
      MetricValue("strata_cache_transport_bytes_total", {"transport=\"shm\"", "direction=\"in\""});
  const double shm_out =
      MetricValue("strata_cache_transport_bytes_total", {"transport=\"shm\"", "direction=\"out\""});
  const double dram_in =
      MetricValue("strata_cache_tier_bytes_total", {"tier=\"dram\"", "direction=\"in\""});
  const double dram_out =
      MetricValue("strata_cache_tier_bytes_total", {"tier=\"dram\"", "direction=\"out\""});
  const double dram_hits = MetricValue("strata_cache_hits_total", {"tier=\"dram\""});

  const Namespace ns = Ns("metrics");
  const auto keys = Chain(ns, 2, 9);
  v1::CommitResponse mresp;
  ASSERT_NO_FATAL_FAILURE(PutChain(ns, keys, /*tenant=*/"", "metrics-client", &mresp));
  grpc::ClientContext lctx;
  v1::LookupRequest lreq;
  lreq.set_client_id("metrics-client");
  lreq.set_namespace_id(std::string(ns.View()));
  for (const auto& k : keys) lreq.add_keys(std::string(k.View()));
  lreq.set_lease(true);
  v1::LookupResponse lresp;
  ASSERT_TRUE(control_->Lookup(&lctx, lreq, &lresp).ok());
  ASSERT_EQ(lresp.hit_blocks(), 2u);
  grpc::ClientContext relctx;
  v1::ReleaseRequest rel;
  rel.set_lease_id(lresp.lease().lease_id());
  v1::ReleaseResponse relresp;
  ASSERT_TRUE(control_->Release(&relctx, rel, &relresp).ok());

  EXPECT_EQ(
      MetricValue("strata_cache_transport_bytes_total", {"transport=\"shm\"", "direction=\"in\""}) -
          shm_in,
      2.0 * kBytes);
  EXPECT_EQ(MetricValue("strata_cache_transport_bytes_total",
                        {"transport=\"shm\"", "direction=\"out\""}) -
                shm_out,
            2.0 * kBytes);
  EXPECT_EQ(
      MetricValue("strata_cache_tier_bytes_total", {"tier=\"dram\"", "direction=\"in\""}) - dram_in,
      2.0 * kBytes);
  EXPECT_EQ(MetricValue("strata_cache_tier_bytes_total", {"tier=\"dram\"", "direction=\"out\""}) -
                dram_out,
            2.0 * kBytes);
  EXPECT_EQ(MetricValue("strata_cache_hits_total", {"tier=\"dram\""}) - dram_hits, 2.0);
  // The write-through copy counts as bytes into the SSD tier.
  EXPECT_GE(MetricValue("strata_cache_tier_bytes_total", {"tier=\"ssd\"", "direction=\"in\""}),
            2.0 * kBytes);
}

}  // namespace
}  // namespace strata::cache
