#include "cache_service/cache_control_service.h"

#include <chrono>

#include "common/grpc_status.h"
#include "common/logging.h"

namespace strata::cache {
namespace {

class Timer {
 public:
  explicit Timer(Histogram& h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    h_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  Histogram& h_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

CacheControlService::CacheControlService(BlockStore& store, Options options)
    : store_(store),
      options_(std::move(options)),
      latency_(MetricsRegistry::Default().AddHistogram("strata_cache_request_seconds",
                                                       "Latency of cache control calls", {"method"},
                                                       ExponentialBuckets(10e-6, 2, 18))),
      transport_bytes_(MetricsRegistry::Default().AddCounter(
          "strata_cache_transport_bytes_total",
          "Payload bytes clients write (in) and read (out) per transport (shm, tcp, rdma), as "
          "granted by Reserve and Lookup leases",
          {"transport", "direction"})) {}

std::string CacheControlService::TransportOf(const std::string& client_id) {
  std::lock_guard<std::mutex> lock(clients_mu_);
  auto it = client_transport_.find(client_id);
  return it == client_transport_.end() ? "unknown" : it->second;
}

grpc::Status CacheControlService::Connect(grpc::ServerContext*, const v1::ConnectRequest* req,
                                          v1::ConnectResponse* resp) {
  resp->set_server_id(options_.server_id);
  resp->set_host_id(options_.host_id);
  DramTier& dram = store_.dram();
  auto* seg = resp->add_segments();
  seg->set_name(BlockStore::kDramSegment);
  seg->set_size_bytes(dram.arena_bytes());
  seg->set_tier(v1::TIER_DRAM);
  for (const auto& ep : options_.endpoints) *seg->add_endpoints() = ep;
  if (options_.endpoints.empty()) {
    auto* shm = seg->add_endpoints();
    shm->set_kind(v1::TRANSPORT_SHM);
    shm->set_address(dram.shm_path());
    shm->set_host_id(options_.host_id);
  }
  // The first of the client's transports (in its order of preference) that an endpoint offers;
  // shm only on the same host.
  const bool same_host = !req->host_id().empty() && req->host_id() == options_.host_id;
  std::vector<int> wanted(req->transports().begin(), req->transports().end());
  if (wanted.empty()) wanted = {v1::TRANSPORT_SHM, v1::TRANSPORT_RDMA, v1::TRANSPORT_TCP};
  for (int t : wanted) {
    bool offered = false;
    for (const auto& ep : seg->endpoints()) offered |= ep.kind() == t;
    if (offered && (t != v1::TRANSPORT_SHM || same_host)) {
      resp->set_chosen_transport(static_cast<v1::TransportKind>(t));
      break;
    }
  }
  resp->set_lease_ttl_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(store_.options().lease_ttl)));
  std::string name = "unknown";
  switch (resp->chosen_transport()) {
    case v1::TRANSPORT_SHM:
      name = "shm";
      break;
    case v1::TRANSPORT_TCP:
      name = "tcp";
      break;
    case v1::TRANSPORT_RDMA:
      name = "rdma";
      break;
    default:
      break;
  }
  {
    std::lock_guard<std::mutex> lock(clients_mu_);
    // Bounded: client ids are node ids; a map this large means ids are not being reused.
    if (client_transport_.size() >= 100000) client_transport_.clear();
    client_transport_[req->client_id()] = name;
  }
  return grpc::Status::OK;
}

grpc::Status CacheControlService::Lookup(grpc::ServerContext*, const v1::LookupRequest* req,
                                         v1::LookupResponse* resp) {
  Timer t(latency_.Labels({"lookup"}));
  ScopedRequestId rid(req->request_id());
  const absl::Status st = store_.Lookup(*req, resp);
  if (st.ok() && req->lease()) {
    uint64_t bytes = 0;
    for (const auto& loc : resp->locations()) {
      if (loc.tier() == v1::TIER_DRAM) bytes += loc.length();
    }
    if (bytes > 0) transport_bytes_.Labels({TransportOf(req->client_id()), "out"}).Increment(bytes);
  }
  return ToGrpcStatus(st);
}

grpc::Status CacheControlService::Reserve(grpc::ServerContext*, const v1::ReserveRequest* req,
                                          v1::ReserveResponse* resp) {
  Timer t(latency_.Labels({"reserve"}));
  ScopedRequestId rid(req->request_id());
  const absl::Status st = store_.Reserve(*req, resp);
  if (st.ok()) {
    uint64_t bytes = 0;
    for (const auto& slot : resp->slots()) {
      if (slot.status().code() == 0) bytes += slot.location().length();
    }
    if (bytes > 0) transport_bytes_.Labels({TransportOf(req->client_id()), "in"}).Increment(bytes);
  }
  return ToGrpcStatus(st);
}

grpc::Status CacheControlService::Commit(grpc::ServerContext*, const v1::CommitRequest* req,
                                         v1::CommitResponse* resp) {
  Timer t(latency_.Labels({"commit"}));
  return ToGrpcStatus(store_.Commit(*req, resp));
}

grpc::Status CacheControlService::Release(grpc::ServerContext*, const v1::ReleaseRequest* req,
                                          v1::ReleaseResponse*) {
  Timer t(latency_.Labels({"release"}));
  return ToGrpcStatus(store_.Release(req->lease_id()));
}

grpc::Status CacheControlService::Touch(grpc::ServerContext*, const v1::TouchRequest* req,
                                        v1::TouchResponse* resp) {
  Timer t(latency_.Labels({"touch"}));
  return ToGrpcStatus(store_.Touch(*req, resp));
}

grpc::Status CacheControlService::KeepAlive(grpc::ServerContext*, const v1::KeepAliveRequest* req,
                                            v1::KeepAliveResponse* resp) {
  const std::vector<uint64_t> ids(req->lease_ids().begin(), req->lease_ids().end());
  for (int64_t e : store_.KeepAlive(ids)) resp->add_expires_unix_ms(e);
  return grpc::Status::OK;
}

bool CacheControlService::SendDigest(grpc::ServerWriter<v1::KvEventBatch>* writer,
                                     uint64_t digest_id) {
  const auto resident = store_.ResidentKeys();
  // Every tier this server manages is announced, even an empty one (or one not configured), so
  // a subscriber can clear stale beliefs; a digest replaces only the tiers it names (the GPU
  // tier of the workers on this server is theirs to report).
  const std::vector<TierKind> tiers = {TierKind::kDram, TierKind::kSsd};
  for (size_t ti = 0; ti < tiers.size(); ++ti) {
    auto it = resident.find(tiers[ti]);
    const std::vector<BlockKey> empty;
    const std::vector<BlockKey>& keys = it == resident.end() ? empty : it->second;
    uint32_t page = 0;
    size_t i = 0;
    do {
      v1::KvEvent ev;
      auto* d = ev.mutable_digest();
      d->set_digest_id(digest_id);
      d->set_epoch(store_.events().epoch());
      d->set_page(page++);
      d->set_tier(static_cast<v1::Tier>(tiers[ti]));
      for (size_t n = 0; i < keys.size() && n < options_.digest_page_keys; ++i, ++n) {
        d->add_keys(std::string(keys[i].View()));
      }
      d->set_last_page(i >= keys.size() && ti + 1 == tiers.size());
      // Digests are stamped with the current sequence: they describe the state as of it.
      ev.set_sequence(store_.events().next_sequence() - 1);
      ev.set_unix_ms(absl::ToUnixMillis(absl::Now()));
      ev.set_source(store_.events().source());
      v1::KvEventBatch batch;
      *batch.add_events() = std::move(ev);
      if (!writer->Write(batch)) return false;
    } while (i < keys.size());
  }
  return true;
}

grpc::Status CacheControlService::SubscribeEvents(grpc::ServerContext* ctx,
                                                  const v1::SubscribeEventsRequest* req,
                                                  grpc::ServerWriter<v1::KvEventBatch>* writer) {
  uint64_t next =
      req->from_sequence() == 0 ? store_.events().next_sequence() : req->from_sequence();
  const absl::Duration interval = req->digest_interval_ms() > 0
                                      ? absl::Milliseconds(req->digest_interval_ms())
                                      : options_.digest_interval;
  // A new subscriber starts from a digest, then follows events.
  if (!SendDigest(writer, next_digest_.fetch_add(1))) return grpc::Status::OK;
  absl::Time next_digest = absl::Now() + interval;
  while (!ctx->IsCancelled() && !shutdown_.load()) {
    std::vector<v1::KvEvent> events =
        store_.events().Read(next, std::min(absl::Milliseconds(200), interval));
    if (!events.empty()) {
      v1::KvEventBatch batch;
      for (auto& e : events) *batch.add_events() = std::move(e);
      next = batch.events(batch.events_size() - 1).sequence() + 1;
      if (!writer->Write(batch)) break;
    }
    if (absl::Now() >= next_digest) {
      if (!SendDigest(writer, next_digest_.fetch_add(1))) break;
      next_digest = absl::Now() + interval;
    }
  }
  return grpc::Status::OK;
}

}  // namespace strata::cache
