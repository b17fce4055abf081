#include "cache_service/remote_drain.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/grpc_status.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/cache_admin.grpc.pb.h"
#include "transfer/transfer_engine.h"

namespace strata::cache {
namespace {

// One block being moved: what the index says about it, and its local read lease.
struct Held {
  v1::BlockInfo info;
  uint64_t lease_id = 0;
  const std::byte* bytes = nullptr;  // the block's DRAM slot (held by the lease)
};

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout,
                                             const std::string& bearer = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  if (!bearer.empty()) ctx->AddMetadata("authorization", StrCat("Bearer ", bearer));
  return ctx;
}

void ReleaseLocal(BlockStore& store, std::vector<Held>& held) {
  for (Held& h : held) {
    if (h.lease_id != 0) (void)store.Release(h.lease_id);
    h.lease_id = 0;
  }
}

// Holds one DRAM block in place under a read lease; false when it is no longer in DRAM.
bool HoldLocal(BlockStore& store, const v1::BlockInfo& info, Held* out) {
  v1::LookupRequest req;
  req.set_client_id("cache-drain");
  req.set_namespace_id(info.namespace_id());
  req.add_keys(info.key());
  req.set_lease(true);
  req.set_promote(false);
  v1::LookupResponse resp;
  if (!store.Lookup(req, &resp).ok() || resp.hit_blocks() != 1) return false;
  out->lease_id = resp.lease().lease_id();
  const v1::BlockLocation& loc = resp.locations(0);
  if (loc.tier() != v1::TIER_DRAM) {
    (void)store.Release(out->lease_id);
    out->lease_id = 0;
    return false;
  }
  out->info = info;
  out->bytes = store.dram().base() + loc.offset();
  return true;
}

class Mover {
 public:
  Mover(BlockStore& store, const RemoteDrainOptions& options, v1::DrainResponse* resp)
      : store_(store), o_(options), resp_(resp) {}

  absl::Status Connect(const std::string& target) {
    channel_ = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    control_ = v1::CacheControl::NewStub(channel_);
    admin_ = v1::CacheAdmin::NewStub(channel_);
    v1::ConnectRequest req;
    req.set_client_id(o_.client_id);
    req.set_host_id(o_.host_id);
    v1::ConnectResponse resp;
    auto ctx = Context(o_.rpc_timeout);
    RETURN_IF_ERROR_WITH(FromGrpcStatus(control_->Connect(ctx.get(), req, &resp)), "drain target ",
                         target);
    if (resp.server_id() == store_.options().server_id) {
      return absl::InvalidArgumentError(
          StrCat("drain target ", target, " is this cache server (", resp.server_id(), ")"));
    }
    if (resp.segments_size() == 0) {
      return absl::FailedPreconditionError(
          StrCat("drain target ", target, " offers no data segment"));
    }
    transfer::PeerSpec spec{.name = StrCat("drain-target:", target), .host_id = resp.host_id()};
    for (const auto& ep : resp.segments(0).endpoints()) {
      spec.endpoints.push_back({.kind = static_cast<transfer::TransportKind>(ep.kind()),
                                .address = ep.address(),
                                .host_id = ep.host_id(),
                                .rdma_gid = ep.rdma_gid(),
                                .rdma_qp_count = ep.rdma_qp_count()});
    }
    ASSIGN_OR_RETURN(engine_, transfer::TransferEngine::Create(
                                  {.host_id = o_.host_id,
                                   .secret = transfer::ClusterSecret(o_.cluster_secret)}));
    ASSIGN_OR_RETURN_WITH(peer_, engine_->OpenPeer(spec), "drain target ", target);
    return absl::OkStatus();
  }

  // Moves one batch of blocks of one namespace and tenant.
  void MoveBatch(std::vector<Held>& held) {
    const v1::BlockInfo& first = held[0].info;
    v1::ReserveRequest rreq;
    rreq.set_client_id(o_.client_id);
    rreq.set_namespace_id(first.namespace_id());
    rreq.set_tenant(first.tenant());
    for (const Held& h : held) {
      auto* b = rreq.add_blocks();
      b->set_key(h.info.key());
      b->set_parent_key(h.info.parent_key());
      b->set_payload_bytes(h.info.payload_bytes());
    }
    v1::ReserveResponse rresp;
    auto rctx = Context(o_.rpc_timeout);
    std::vector<bool> on_target(held.size(), false);
    if (const grpc::Status st = control_->Reserve(rctx.get(), rreq, &rresp);
        !st.ok() || rresp.slots_size() != static_cast<int>(held.size())) {
      spdlog::warn("drain: reserve on target failed: {}", st.error_message());
      Finish(held, on_target);
      return;
    }
    std::vector<transfer::TransferOp> ops;
    std::vector<size_t> op_block;
    for (size_t i = 0; i < held.size(); ++i) {
      const auto& slot = rresp.slots(static_cast<int>(i));
      if (slot.status().code() == static_cast<int>(absl::StatusCode::kAlreadyExists)) {
        on_target[i] = true;  // the target has this very block (same key, same namespace)
        continue;
      }
      if (slot.status().code() != 0) {
        spdlog::warn("drain: target refused a block: {}", slot.status().message());
        continue;
      }
      ops.push_back({.op = transfer::OpKind::kWrite,
                     .local = const_cast<std::byte*>(held[i].bytes),
                     .segment = slot.location().segment(),
                     .offset = slot.location().offset(),
                     .length = held[i].info.payload_bytes(),
                     .capability = slot.location().capability(),
                     .checksum = held[i].info.checksum()});
      op_block.push_back(i);
    }
    if (!ops.empty()) {
      auto batch = engine_->Submit(*peer_, std::move(ops), {.timeout = o_.transfer_timeout});
      // Every request has a deadline, so this ends; the local leases must outlive the reads of
      // our DRAM slots.
      while (!batch->Wait(absl::Seconds(5))) {
      }
      // Commit what arrived; the target checks every checksum against the bytes it holds.
      v1::CommitRequest creq;
      creq.set_lease_id(rresp.lease().lease_id());
      std::vector<size_t> committed_block;
      for (size_t j = 0; j < op_block.size(); ++j) {
        if (!batch->status(j).ok()) {
          spdlog::warn("drain: transfer to target failed: {}", batch->status(j).ToString());
          continue;
        }
        auto* cb = creq.add_blocks();
        cb->set_key(held[op_block[j]].info.key());
        cb->set_checksum(held[op_block[j]].info.checksum());
        committed_block.push_back(op_block[j]);
      }
      v1::CommitResponse cresp;
      auto cctx = Context(o_.rpc_timeout);
      // An empty commit still ends the target's lease (its slots go back at once).
      if (const grpc::Status st = control_->Commit(cctx.get(), creq, &cresp); st.ok()) {
        for (int j = 0; j < cresp.results_size() && j < static_cast<int>(committed_block.size());
             ++j) {
          if (cresp.results(j).code() == 0) on_target[committed_block[j]] = true;
        }
      } else {
        spdlog::warn("drain: commit on target failed: {}", st.error_message());
      }
    }
    PinOnTarget(held, on_target);
    Finish(held, on_target);
  }

 private:
  // Pins travel with their blocks; a block whose pin could not be set stays here too.
  void PinOnTarget(const std::vector<Held>& held, std::vector<bool>& on_target) {
    const int64_t now = absl::ToUnixMillis(absl::Now());
    for (size_t i = 0; i < held.size(); ++i) {
      const v1::BlockInfo& info = held[i].info;
      if (!on_target[i] || info.pin() == v1::PIN_NONE) continue;
      v1::PinRequest req;
      req.mutable_selector()->mutable_keys()->add_keys(info.key());
      req.set_kind(info.pin());
      if (info.pin() == v1::PIN_TTL) {
        const int64_t left_ms = info.pin_expires_unix_ms() - now;
        if (left_ms <= 0) continue;  // expired: nothing to carry over
        req.set_ttl_seconds(static_cast<uint32_t>((left_ms + 999) / 1000));
      }
      v1::PinResponse resp;
      auto ctx = Context(o_.rpc_timeout, o_.admin_token);
      const grpc::Status st = admin_->Pin(ctx.get(), req, &resp);
      if (!st.ok() || resp.pinned_blocks() != 1) {
        spdlog::warn("drain: pinning a block on the target failed ({}); it stays here",
                     st.ok() ? "not pinned" : st.error_message());
        on_target[i] = false;
      }
    }
  }

  // Drops what the target holds now; the rest stays (and is counted as failed).
  void Finish(std::vector<Held>& held, const std::vector<bool>& on_target) {
    ReleaseLocal(store_, held);
    v1::EvictRequest ev;
    ev.set_include_pinned(true);
    for (size_t i = 0; i < held.size(); ++i) {
      if (on_target[i]) {
        ev.mutable_selector()->mutable_keys()->add_keys(held[i].info.key());
        resp_->set_moved_blocks(resp_->moved_blocks() + 1);
        resp_->set_moved_bytes(resp_->moved_bytes() + held[i].info.payload_bytes());
      } else {
        resp_->set_failed_blocks(resp_->failed_blocks() + 1);
      }
    }
    if (ev.selector().keys().keys_size() > 0) {
      v1::EvictResponse eresp;
      if (const absl::Status st = store_.Evict(ev, &eresp); !st.ok()) {
        spdlog::warn("drain: dropping moved blocks here: {}", st.ToString());
      }
    }
  }

  BlockStore& store_;
  const RemoteDrainOptions& o_;
  v1::DrainResponse* resp_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CacheControl::Stub> control_;
  std::unique_ptr<v1::CacheAdmin::Stub> admin_;
  std::unique_ptr<transfer::TransferEngine> engine_;
  std::shared_ptr<transfer::Peer> peer_;
};

}  // namespace

absl::Status DrainToRemote(BlockStore& store, const std::string& target_address,
                           const RemoteDrainOptions& options, v1::DrainResponse* resp) {
  Mover mover(store, options, resp);
  RETURN_IF_ERROR(mover.Connect(target_address));
  // Everything in DRAM now (blocks stored later stay: a drain empties, it does not fence).
  std::vector<v1::BlockInfo> blocks;
  v1::ListBlocksRequest list;
  list.set_tier(v1::TIER_DRAM);
  list.set_page_size(10000);
  for (;;) {
    v1::ListBlocksResponse page;
    RETURN_IF_ERROR(store.ListBlocks(list, &page));
    for (auto& b : *page.mutable_blocks()) blocks.push_back(std::move(b));
    if (page.next_page_token().empty()) break;
    list.set_page_token(page.next_page_token());
  }
  // Batches of one namespace and tenant (one Reserve each), parents before children where the
  // listing allows (the target does not require it).
  std::map<std::pair<std::string, std::string>, std::vector<v1::BlockInfo>> groups;
  for (auto& b : blocks) {
    auto group = std::make_pair(b.namespace_id(), b.tenant());
    groups[std::move(group)].push_back(std::move(b));
  }
  const size_t per_batch = std::max<uint32_t>(1, options.batch_blocks);
  for (auto& [group, infos] : groups) {
    for (size_t from = 0; from < infos.size(); from += per_batch) {
      std::vector<Held> held;
      for (size_t i = from; i < std::min(infos.size(), from + per_batch); ++i) {
        Held h;
        if (HoldLocal(store, infos[i], &h)) held.push_back(std::move(h));
        // Not in DRAM any more (evicted or demoted meanwhile): nothing to drain.
      }
      if (!held.empty()) mover.MoveBatch(held);
    }
  }
  spdlog::info("drain to {}: {} blocks moved, {} stayed", target_address, resp->moved_blocks(),
               resp->failed_blocks());
  return absl::OkStatus();
}

}  // namespace strata::cache
