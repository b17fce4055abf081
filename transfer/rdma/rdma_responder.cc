// The owner side of the rdma side channel (RdmaResponder, rdma_transport.h).
#include <random>

#include "common/checksum.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/rdma/rdma_plan.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/rdma/rdma_wire.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

using rdma::MsgType;

// QPs of one side-channel connection: the passive ends of the client's QPs.
struct PeerQps {
  std::shared_ptr<rdma::VerbsCq> cq;
  std::vector<std::unique_ptr<rdma::VerbsQp>> qps;
};

absl::StatusOr<std::pair<std::unique_ptr<rdma::VerbsQp>, rdma::QpAddress>> Accept(
    rdma::VerbsContext& ctx, const std::shared_ptr<rdma::VerbsCq>& cq,
    const rdma::QpAddress& client) {
  static thread_local std::mt19937 gen{std::random_device{}()};
  const rdma::PortInfo& port = ctx.port();
  ASSIGN_OR_RETURN(auto qp, ctx.CreateQp(cq, 1));  // never posts: one slot is enough
  rdma::QpConnectParams p;
  p.remote = client;
  p.local_psn = gen() & 0xffffff;
  p.mtu = std::min(client.mtu, port.active_mtu);
  p.max_rd_atomic = static_cast<uint8_t>(std::min<uint32_t>(p.max_rd_atomic, port.max_qp_rd_atom));
  RETURN_IF_ERROR(qp->ToInit());
  RETURN_IF_ERROR(qp->ToRtr(p));
  RETURN_IF_ERROR(qp->ToRts(p));
  rdma::QpAddress self{
      .qpn = qp->qpn(), .lid = port.lid, .gid = port.gid, .psn = p.local_psn, .mtu = p.mtu};
  return std::make_pair(std::move(qp), self);
}

}  // namespace

RdmaResponder::RdmaResponder(std::shared_ptr<rdma::VerbsContext> context,
                             const SegmentRegistry* segments, ClusterSecret secret)
    : context_(std::move(context)),
      segments_(segments),
      secret_(std::move(secret)),
      mrs_([ctx = context_](void* addr, uint64_t len, uint32_t access) {
        return ctx->RegisterMemory(addr, len, access);
      }) {
  listener_id_ = segments_->AddUnregisterListener([this](const Segment& s) {
    if (s.kind == MemoryKind::kHost) mrs_.Invalidate(s.base, s.size);
  });
}

RdmaResponder::~RdmaResponder() { segments_->RemoveUnregisterListener(listener_id_); }

void RdmaResponder::Serve(int fd, const std::string& peer_name, TcpServeCounters* counters) {
  wire::SetSocketTimeouts(fd, absl::ZeroDuration());
  PeerQps peer;
  auto refuse = [&](const absl::Status& st, std::string_view what) {
    counters->refused.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("transfer server: refused rdma {} from {}: {}", what, peer_name, st.ToString());
  };
  while (true) {
    auto frame = rdma::RecvFrame(fd);
    if (!frame.ok()) return;  // peer gone or server stopping
    const auto& [type, body] = *frame;
    absl::Status sent;
    switch (type) {
      case MsgType::kConnectQps: {
        rdma::ConnectQpsReply reply;
        auto ask = rdma::DecodeConnectQps(body);
        if (!ask.ok()) {
          reply.status = ask.status();
        } else if (!peer.qps.empty() || ask->qps.empty()) {
          reply.status = absl::FailedPreconditionError("rdma: QPs already connected or none asked");
        } else {
          auto cq = context_->CreateCq(16);
          reply.status = cq.status();
          if (cq.ok()) peer.cq = *cq;
          for (size_t i = 0; reply.status.ok() && i < ask->qps.size(); ++i) {
            auto qp = Accept(*context_, peer.cq, ask->qps[i]);
            if (!qp.ok()) {
              reply.status = qp.status();
              break;
            }
            peer.qps.push_back(std::move(qp->first));
            reply.qps.push_back(qp->second);
          }
          if (!reply.status.ok()) {
            peer.qps.clear();
            reply.qps.clear();
            spdlog::warn("transfer server: rdma QPs for {}: {}", peer_name,
                         reply.status.ToString());
          }
        }
        sent = rdma::SendFrame(fd, MsgType::kConnectQpsReply, rdma::Encode(reply));
        break;
      }
      case MsgType::kReconnectQp: {
        rdma::ReconnectQpReply reply;
        auto ask = rdma::DecodeReconnectQp(body);
        if (!ask.ok()) {
          reply.status = ask.status();
        } else if (ask->index >= peer.qps.size()) {
          reply.status = absl::InvalidArgumentError("rdma: no such QP");
        } else {
          auto qp = Accept(*context_, peer.cq, ask->qp);
          reply.status = qp.status();
          if (qp.ok()) {
            peer.qps[ask->index] = std::move(qp->first);  // the old QP is destroyed here
            reply.qp = qp->second;
          }
        }
        sent = rdma::SendFrame(fd, MsgType::kReconnectQpReply, rdma::Encode(reply));
        break;
      }
      case MsgType::kResolve: {
        rdma::ResolveReply reply;
        auto ask = rdma::DecodeResolve(body);
        reply.status = ask.status();
        if (ask.ok()) {
          reply.status = VerifyCapability(secret_, ask->capability, ask->segment, ask->offset,
                                          ask->length, ask->access);
        }
        void* address = nullptr;
        std::shared_ptr<const Segment> seg;
        if (reply.status.ok()) {
          auto resolved = segments_->Resolve(ask->segment, ask->offset, ask->length, &address);
          reply.status = resolved.status();
          if (resolved.ok()) seg = *resolved;
        }
        if (reply.status.ok() && seg->kind != MemoryKind::kHost) {
          reply.status = absl::FailedPreconditionError(
              StrCat("segment ", ask->segment, " is device memory; rdma serves host memory only"));
        }
        if (reply.status.ok()) {
          auto mr = mrs_.Get(seg->base, seg->size,
                             rdma::kLocalWrite | rdma::kRemoteRead | rdma::kRemoteWrite);
          reply.status = mr.status();
          if (mr.ok()) {
            reply.addr = reinterpret_cast<uint64_t>(seg->base);
            reply.rkey = (*mr)->rkey();
            reply.size = seg->size;
            counters->served.fetch_add(1, std::memory_order_relaxed);
          }
        }
        if (!reply.status.ok()) refuse(reply.status, "rkey request");
        sent = rdma::SendFrame(fd, MsgType::kResolveReply, rdma::Encode(reply));
        break;
      }
      case MsgType::kVerifyWrite: {
        rdma::VerifyReply reply;
        auto ask = rdma::DecodeVerifyWrite(body);
        reply.status = ask.status();
        if (ask.ok()) {
          reply.status = VerifyCapability(secret_, ask->capability, ask->segment, ask->offset,
                                          ask->length, Access::kWrite);
        }
        void* address = nullptr;
        if (reply.status.ok()) {
          reply.status =
              segments_->Resolve(ask->segment, ask->offset, ask->length, &address).status();
        }
        if (reply.status.ok() && Checksum64(address, ask->length) != ask->checksum) {
          reply.status =
              absl::DataLossError(StrCat("rdma write to ", ask->segment, " [", ask->offset, ", +",
                                         ask->length, ") arrived corrupted (checksum mismatch)"));
          spdlog::warn("transfer server: {} (from {})", reply.status.ToString(), peer_name);
        } else if (!reply.status.ok()) {
          refuse(reply.status, "write verification");
        }
        sent = rdma::SendFrame(fd, MsgType::kVerifyReply, rdma::Encode(reply));
        break;
      }
      default:
        spdlog::warn("transfer server: rdma protocol error from {}; closing", peer_name);
        return;
    }
    if (!sent.ok()) return;
  }
}

}  // namespace strata::transfer
