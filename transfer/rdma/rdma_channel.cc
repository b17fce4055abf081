// The client side of the rdma transport: RdmaTransport::Connect and the channel's worker
// (see rdma_transport.h for the protocol and the failure rules).
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/rdma/rdma_plan.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/rdma/rdma_wire.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

using rdma::QpState;

constexpr absl::Duration kIdleWait = absl::Milliseconds(2);
constexpr absl::Duration kReconnectEvery = absl::Milliseconds(50);
constexpr absl::Duration kCloseDrain = absl::Seconds(1);

uint32_t RandomPsn() {
  static thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xffffff;
}

struct RemoteRef {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t size = 0;
  CapabilityGrant grant;
};

struct Req {
  TransferRequest r;
  size_t index = 0;
  std::shared_ptr<CompletionFn> done;
  std::shared_ptr<rdma::MemoryRegion> local_mr;
  RemoteRef remote;
  size_t chunks_left = 0;  // chunks not yet completed successfully
  int inflight = 0;        // chunks posted whose completion has not been polled
  absl::Status error;      // first final error; reported once inflight reaches 0
  bool completed = false;
  bool reresolved = false;
};
using ReqPtr = std::shared_ptr<Req>;

struct ChunkWr {
  ReqPtr req;
  rdma::Chunk chunk;
  int attempts = 0;
  size_t qp = 0;
};

struct ManagedQp {
  std::unique_ptr<rdma::VerbsQp> qp;
  rdma::QpStateMachine sm;
  uint32_t outstanding = 0;
  absl::Time last_reconnect = absl::InfinitePast();
};

class RdmaChannel : public Channel {
 public:
  RdmaChannel(const PeerSpec& peer, const Endpoint& endpoint, const RdmaTransportOptions& options)
      : peer_name_(peer.name.empty() ? endpoint.address : peer.name),
        address_(endpoint.address),
        options_(options),
        ctx_(options.context),
        max_chunk_(std::min<uint64_t>(options.max_chunk, ctx_->port().max_msg_size)) {}

  ~RdmaChannel() override {
    Close();
    if (side_fd_ >= 0) close(side_fd_);
  }

  absl::Status Start(absl::Duration timeout) {
    ASSIGN_OR_RETURN(side_fd_, wire::DialTcp(address_, timeout));
    wire::SetSocketTimeouts(side_fd_, timeout);
    RETURN_IF_ERROR_WITH(
        wire::ClientHandshake(side_fd_, options_.secret, wire::Purpose::kRdmaSideChannel),
        "rdma side channel to ", peer_name_);
    const size_t n = static_cast<size_t>(
        std::clamp<int>(options_.qps_per_peer, 1, static_cast<int>(rdma::kMaxQpsPerPeer)));
    ASSIGN_OR_RETURN(cq_, ctx_->CreateCq(static_cast<int>(n * options_.max_send_wr)));
    qps_.resize(n);
    rdma::ConnectQps hello;
    std::vector<uint32_t> psns(n);
    for (size_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(qps_[i].qp, ctx_->CreateQp(cq_, options_.max_send_wr));
      RETURN_IF_ERROR(ToInit(qps_[i]));
      psns[i] = RandomPsn();
      hello.qps.push_back(LocalAddress(qps_[i], psns[i]));
    }
    ASSIGN_OR_RETURN_WITH(std::string body,
                          rdma::Call(side_fd_, rdma::MsgType::kConnectQps, rdma::Encode(hello),
                                     rdma::MsgType::kConnectQpsReply),
                          "connecting QPs to ", peer_name_);
    ASSIGN_OR_RETURN(auto reply, rdma::DecodeConnectQpsReply(body));
    if (!reply.status.ok()) {
      return absl::UnavailableError(
          StrCat("rdma: ", peer_name_, " refused QPs: ", ToStd(reply.status.message())));
    }
    if (reply.qps.size() != n) {
      return absl::UnavailableError(
          StrCat("rdma: ", peer_name_, " answered ", reply.qps.size(), " QPs for ", n));
    }
    for (size_t i = 0; i < n; ++i) RETURN_IF_ERROR(ToRts(qps_[i], reply.qps[i], psns[i]));
    wire::SetSocketTimeouts(side_fd_, options_.side_channel_timeout);
    worker_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  void Submit(std::vector<TransferRequest> requests, CompletionFn done) override {
    auto shared_done = std::make_shared<CompletionFn>(std::move(done));
    std::vector<ReqPtr> reqs;
    reqs.reserve(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      TransferRequest& r = requests[i];
      if (r.local == nullptr || r.length == 0 || r.segment.empty()) {
        (*shared_done)(i, absl::InvalidArgumentError(
                              "rdma: request needs a local buffer, a length and a segment"));
        continue;
      }
      auto q = std::make_shared<Req>();
      q->r = std::move(r);
      q->index = i;
      q->done = shared_done;
      reqs.push_back(std::move(q));
    }
    if (reqs.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        for (auto& q : reqs) pending_.push_back(std::move(q));
        reqs.clear();
      }
    }
    for (auto& q : reqs) (*q->done)(q->index, absl::CancelledError("rdma channel closed"));
    cv_.notify_one();
  }

  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable()) worker_.join();
    std::vector<ReqPtr> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(pending_);
    }
    for (auto& q : left) (*q->done)(q->index, absl::CancelledError("rdma channel closed"));
  }

  void Disconnect() override {
    disconnect_.store(true);
    cv_.notify_one();
  }

 private:
  // ---- QP set-up -------------------------------------------------------------------------

  rdma::QpAddress LocalAddress(const ManagedQp& m, uint32_t psn) const {
    return {.qpn = m.qp->qpn(),
            .lid = ctx_->port().lid,
            .gid = ctx_->port().gid,
            .psn = psn,
            .mtu = ctx_->port().active_mtu};
  }

  static absl::Status ToInit(ManagedQp& m) {
    RETURN_IF_ERROR(m.sm.Transition(QpState::kInit));
    return m.qp->ToInit();
  }

  absl::Status ToRts(ManagedQp& m, const rdma::QpAddress& remote, uint32_t local_psn) {
    rdma::QpConnectParams p = options_.connect;
    p.remote = remote;
    p.local_psn = local_psn;
    p.mtu = std::min(remote.mtu, ctx_->port().active_mtu);
    p.max_rd_atomic =
        static_cast<uint8_t>(std::min<uint32_t>(p.max_rd_atomic, ctx_->port().max_qp_rd_atom));
    RETURN_IF_ERROR(m.sm.Transition(QpState::kRtr));
    RETURN_IF_ERROR(m.qp->ToRtr(p));
    RETURN_IF_ERROR(m.sm.Transition(QpState::kRts));
    return m.qp->ToRts(p);
  }

  void Break(size_t i, std::string_view why, bool quiet = false) {
    ManagedQp& m = qps_[i];
    if (m.sm.state() == QpState::kError) return;
    if (!quiet || m.outstanding > 0)
      spdlog::warn("rdma: QP {} to {} broken ({}); {} work requests to flush", i, peer_name_, why,
                   m.outstanding);
    (void)m.sm.Transition(QpState::kError);
    if (auto st = m.qp->ToError(); !st.ok()) spdlog::warn("rdma: {}", st.ToString());
  }

  // Replaces broken QPs whose work requests have all flushed.
  void ReconnectBroken() {
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < qps_.size(); ++i) {
      ManagedQp& m = qps_[i];
      if (m.sm.state() != QpState::kError || m.outstanding > 0 ||
          now - m.last_reconnect < kReconnectEvery) {
        continue;
      }
      m.last_reconnect = now;
      if (auto st = Reconnect(i); !st.ok()) {
        last_reconnect_error_ = st;
        spdlog::warn("rdma: reconnecting QP {} to {}: {}", i, peer_name_, st.ToString());
      } else {
        ++reconnects_;
        last_reconnect_error_.reset();
      }
    }
  }

  absl::Status Reconnect(size_t i) {
    ManagedQp fresh;
    fresh.last_reconnect = qps_[i].last_reconnect;
    ASSIGN_OR_RETURN(fresh.qp, ctx_->CreateQp(cq_, options_.max_send_wr));
    RETURN_IF_ERROR(ToInit(fresh));
    const uint32_t psn = RandomPsn();
    ASSIGN_OR_RETURN(std::string body,
                     rdma::Call(side_fd_, rdma::MsgType::kReconnectQp,
                                rdma::Encode(rdma::ReconnectQp{static_cast<uint32_t>(i),
                                                               LocalAddress(fresh, psn)}),
                                rdma::MsgType::kReconnectQpReply));
    ASSIGN_OR_RETURN(auto reply, rdma::DecodeReconnectQpReply(body));
    RETURN_IF_ERROR(reply.status);
    RETURN_IF_ERROR(ToRts(fresh, reply.qp, psn));
    qps_[i] = std::move(fresh);
    return absl::OkStatus();
  }

  // ---- requests --------------------------------------------------------------------------

  absl::StatusOr<RemoteRef> ResolveRemote(const Req& q, bool refresh) {
    const Access need = q.r.op == OpKind::kRead ? Access::kRead : Access::kWrite;
    const std::string key = StrCat(q.r.segment, "\n", static_cast<int>(need), "\n", q.r.capability);
    if (!refresh) {
      auto it = remotes_.find(key);
      if (it != remotes_.end()) return it->second;
    }
    remotes_.erase(key);
    ASSIGN_OR_RETURN_WITH(CapabilityGrant grant, DecodeCapability(q.r.capability),
                          "rdma: capability");
    rdma::Resolve ask{.segment = q.r.segment,
                      .capability = q.r.capability,
                      .access = need,
                      .offset = grant.offset,
                      .length = grant.length};
    auto body = rdma::Call(side_fd_, rdma::MsgType::kResolve, rdma::Encode(ask),
                           rdma::MsgType::kResolveReply);
    if (!body.ok()) {
      return absl::UnavailableError(
          StrCat("rdma: side channel to ", peer_name_, ": ", ToStd(body.status().message())));
    }
    ASSIGN_OR_RETURN(auto reply, rdma::DecodeResolveReply(*body));
    if (!reply.status.ok()) {
      return absl::Status(reply.status.code(),
                          StrCat("rdma peer ", peer_name_, ": ", ToStd(reply.status.message())));
    }
    RemoteRef ref{.addr = reply.addr, .rkey = reply.rkey, .size = reply.size, .grant = grant};
    remotes_[key] = ref;
    return ref;
  }

  // Everything that must hold before a request's first work request is posted.
  absl::Status Prepare(Req& q, bool refresh) {
    ASSIGN_OR_RETURN(q.remote, ResolveRemote(q, refresh));
    const CapabilityGrant& g = q.remote.grant;
    if (absl::Now() >= g.expires) {
      return absl::PermissionDeniedError("rdma: capability expired");
    }
    if (q.r.offset < g.offset || q.r.length > g.length ||
        q.r.offset - g.offset > g.length - q.r.length) {
      return absl::PermissionDeniedError(
          StrCat("rdma: [", q.r.offset, ", +", q.r.length, ") is outside the capability's range"));
    }
    if (q.r.offset > q.remote.size || q.r.length > q.remote.size - q.r.offset) {
      return absl::OutOfRangeError(StrCat("rdma: [", q.r.offset, ", +", q.r.length,
                                          ") is outside segment ", q.r.segment, " of ",
                                          q.remote.size, " bytes"));
    }
    if (!q.local_mr) {
      ASSIGN_OR_RETURN(q.local_mr,
                       options_.local_mrs->Get(q.r.local, q.r.length, rdma::kLocalWrite));
    }
    return absl::OkStatus();
  }

  void TakePending() {
    std::vector<ReqPtr> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh.swap(pending_);
    }
    for (ReqPtr& q : fresh) {
      active_.push_back(q);
      if (absl::Now() >= q->r.deadline) {
        q->error = absl::DeadlineExceededError("rdma: deadline passed before the request started");
      } else if (auto st = Prepare(*q, false); !st.ok()) {
        q->error = st;
      } else {
        const auto chunks = rdma::SplitTransfer(q->r.length, max_chunk_);
        q->chunks_left = chunks.size();
        for (const rdma::Chunk& c : chunks) ready_.push_back({q, c, 0, 0});
      }
      MaybeFinish(*q);
    }
  }

  bool Usable(size_t i) const {
    return qps_[i].sm.CanPost() && qps_[i].outstanding < options_.max_send_wr;
  }

  void PostReady() {
    if (ready_.empty()) return;
    std::vector<std::vector<rdma::WorkRequest>> batches(qps_.size());
    std::vector<std::vector<uint64_t>> ids(qps_.size());
    while (!ready_.empty()) {
      ChunkWr& front = ready_.front();
      Req& q = *front.req;
      if (q.completed || !q.error.ok()) {
        ready_.pop_front();
        continue;
      }
      size_t pick = SIZE_MAX;
      for (size_t k = 0; k < qps_.size(); ++k) {
        const size_t i = (next_qp_ + k) % qps_.size();
        if (Usable(i)) {
          pick = i;
          break;
        }
      }
      if (pick == SIZE_MAX) break;  // all QPs busy or broken: the rest waits
      next_qp_ = pick + 1;
      ChunkWr ch = std::move(front);
      ready_.pop_front();
      ch.qp = pick;
      ++ch.attempts;
      const uint64_t id = next_wr_id_++;
      batches[pick].push_back(
          {.wr_id = id,
           .op = q.r.op,
           .local_addr = reinterpret_cast<uint64_t>(q.r.local) + ch.chunk.offset,
           .lkey = q.local_mr->lkey(),
           .length = ch.chunk.length,
           .remote_addr = q.remote.addr + q.r.offset + ch.chunk.offset,
           .rkey = q.remote.rkey});
      ids[pick].push_back(id);
      ++qps_[pick].outstanding;
      ++q.inflight;
      inflight_.emplace(id, std::move(ch));
    }
    for (size_t i = 0; i < qps_.size(); ++i) {
      if (batches[i].empty()) continue;
      if (auto st = qps_[i].qp->PostSend(batches[i]); !st.ok()) {
        // Nothing of the chain is owned by the NIC we can rely on: treat as flushed.
        Break(i, ToStd(st.message()));
        for (uint64_t id : ids[i]) {
          OnCompletion({.wr_id = id, .status = rdma::WcStatus::kFlushed, .qpn = 0});
        }
      }
    }
  }

  void OnCompletion(const rdma::WorkCompletion& wc) {
    auto it = inflight_.find(wc.wr_id);
    if (it == inflight_.end()) return;
    ChunkWr ch = std::move(it->second);
    inflight_.erase(it);
    --qps_[ch.qp].outstanding;
    Req& q = *ch.req;
    --q.inflight;
    if (wc.status == rdma::WcStatus::kSuccess) {
      --q.chunks_left;
    } else {
      const rdma::CompletionVerdict v = rdma::ClassifyCompletion(wc.status);
      if (v.qp_broken) Break(ch.qp, rdma::WcStatusName(wc.status));
      if (q.error.ok() && !q.completed) {
        const bool in_time = absl::Now() < q.r.deadline;
        if (v.retry && in_time && !no_retry_ && ch.attempts < options_.max_attempts) {
          absl::Status again = absl::OkStatus();
          if (v.reresolve && !q.reresolved) {
            q.reresolved = true;
            again = Prepare(q, true);
          } else if (v.reresolve) {
            again = absl::PermissionDeniedError(StrCat("rdma: ", peer_name_, " refused access to ",
                                                       q.r.segment, " (remote access error)"));
          }
          if (again.ok()) {
            ready_.push_back(std::move(ch));
          } else {
            q.error = again;
          }
        } else {
          q.error = absl::Status(
              v.code, StrCat("rdma: ", rdma::WcStatusName(wc.status), " on QP ", ch.qp, " to ",
                             peer_name_, " after ", ch.attempts, " attempt(s)"));
        }
      }
    }
    MaybeFinish(q);
  }

  void MaybeFinish(Req& q) {
    if (q.completed || q.inflight > 0) return;
    if (q.error.ok() && q.chunks_left > 0) return;
    if (q.error.ok() && q.r.op == OpKind::kWrite && q.r.checksum) q.error = VerifyWrite(q);
    q.completed = true;
    q.local_mr.reset();  // the NIC is done with the buffer; the cache keeps the registration
    (*q.done)(q.index, q.error);
  }

  absl::Status VerifyWrite(const Req& q) {
    rdma::VerifyWrite ask{.segment = q.r.segment,
                          .capability = q.r.capability,
                          .offset = q.r.offset,
                          .length = q.r.length,
                          .checksum = *q.r.checksum};
    auto body = rdma::Call(side_fd_, rdma::MsgType::kVerifyWrite, rdma::Encode(ask),
                           rdma::MsgType::kVerifyReply);
    if (!body.ok()) return Annotate(body.status(), "rdma: verifying a write");
    ASSIGN_OR_RETURN(auto reply, rdma::DecodeVerifyReply(*body));
    return reply.status;
  }

  void CheckDeadlines() {
    const absl::Time now = absl::Now();
    std::vector<bool> stuck(qps_.size(), false);
    bool any_stuck = false;
    for (const ReqPtr& q : active_) {
      if (q->completed || now < q->r.deadline) continue;
      if (q->error.ok()) {
        q->error = absl::DeadlineExceededError(
            StrCat("rdma: no completion from ", peer_name_, " before the deadline"));
      }
      if (q->inflight == 0) {
        MaybeFinish(*q);
      } else {
        any_stuck = true;
      }
    }
    if (!any_stuck) return;
    // Flush the QPs that hold work requests of expired requests: their buffers must be
    // released by the NIC before the requests complete.
    for (const auto& [id, ch] : inflight_) {
      if (!ch.req->error.ok() && absl::IsDeadlineExceeded(ch.req->error)) stuck[ch.qp] = true;
    }
    for (size_t i = 0; i < qps_.size(); ++i) {
      if (stuck[i]) Break(i, "a request timed out");
    }
  }

  // When no QP can be used and reconnecting failed, queued work fails instead of waiting.
  void FailIfUnreachable() {
    if (ready_.empty() || !last_reconnect_error_.has_value()) return;
    for (const ManagedQp& m : qps_) {
      if (m.sm.CanPost()) return;
    }
    const absl::Status why = absl::UnavailableError(StrCat(
        "rdma: no usable QP to ", peer_name_, ": ", ToStd(last_reconnect_error_->message())));
    for (ChunkWr& ch : ready_) {
      if (ch.req->error.ok()) ch.req->error = why;
      MaybeFinish(*ch.req);
    }
    ready_.clear();
  }

  void Loop() {
    std::vector<rdma::WorkCompletion> wcs(32);
    absl::Time drain_until = absl::InfiniteFuture();
    while (true) {
      bool stop;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop = closed_;
      }
      if (stop && drain_until == absl::InfiniteFuture()) {
        // Close: fail everything, flush every QP, wait (bounded) for the NIC to let go.
        drain_until = absl::Now() + kCloseDrain;  // pending_ is cancelled by Close()
        for (const ReqPtr& q : active_) {
          if (q->error.ok()) q->error = absl::CancelledError("rdma channel closed");
        }
        ready_.clear();
        for (size_t i = 0; i < qps_.size(); ++i) Break(i, "channel closed", /*quiet=*/true);
      }
      if (disconnect_.exchange(false)) {
        no_retry_ = true;  // link cut: in-flight requests fail (Unavailable), later ones retry
        for (size_t i = 0; i < qps_.size(); ++i) Break(i, "link cut");
      }
      if (!stop) TakePending();
      const int n = cq_->Poll(wcs);
      for (int i = 0; i < n; ++i) OnCompletion(wcs[i]);
      if (no_retry_ && inflight_.empty()) no_retry_ = false;
      if (!stop) {
        PostReady();
        CheckDeadlines();
        ReconnectBroken();
        FailIfUnreachable();
      }
      std::erase_if(active_, [](const ReqPtr& q) { return q->completed; });
      if (stop) {
        if (inflight_.empty() || absl::Now() >= drain_until) break;
        std::this_thread::yield();
        continue;
      }
      if (n > 0) continue;
      if (inflight_.empty()) {
        // Idle (or only waiting for a reconnect): sleep until a Submit, Close or Disconnect.
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, absl::ToChronoNanoseconds(kIdleWait),
                     [this] { return closed_ || !pending_.empty() || disconnect_.load(); });
      } else {
        std::this_thread::yield();  // busy-poll the CQ while the NIC works
      }
    }
    if (!inflight_.empty()) {
      spdlog::error("rdma: {} work requests to {} did not flush within {}; completing anyway",
                    inflight_.size(), peer_name_, absl::FormatDuration(kCloseDrain));
      for (auto& [id, ch] : inflight_) ch.req->inflight = 0;
      inflight_.clear();
    }
    for (const ReqPtr& q : active_) {
      if (q->error.ok()) q->error = absl::CancelledError("rdma channel closed");
      MaybeFinish(*q);
    }
    active_.clear();
  }

  const std::string peer_name_;
  const std::string address_;
  const RdmaTransportOptions options_;
  const std::shared_ptr<rdma::VerbsContext> ctx_;
  const uint64_t max_chunk_;
  int side_fd_ = -1;
  std::thread worker_;
  std::atomic<bool> disconnect_{false};

  // Worker-thread state (Start() fills it before the worker exists).
  std::shared_ptr<rdma::VerbsCq> cq_;
  std::vector<ManagedQp> qps_;
  size_t next_qp_ = 0;
  uint64_t next_wr_id_ = 1;
  std::deque<ChunkWr> ready_;
  absl::flat_hash_map<uint64_t, ChunkWr> inflight_;
  std::vector<ReqPtr> active_;
  absl::flat_hash_map<std::string, RemoteRef> remotes_;
  std::optional<absl::Status> last_reconnect_error_;
  bool no_retry_ = false;
  int64_t reconnects_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;          // guarded by mu_
  std::vector<ReqPtr> pending_;  // guarded by mu_
};

}  // namespace

RdmaTransport::RdmaTransport(RdmaTransportOptions options) : options_(std::move(options)) {
  if (!options_.local_mrs) {
    auto ctx = options_.context;
    const SegmentRegistry* local = options_.local_segments;
    options_.local_mrs = std::make_shared<rdma::MrCache>(
        [ctx](void* addr, uint64_t len, uint32_t access) {
          return ctx->RegisterMemory(addr, len, access);
        },
        rdma::MrCacheOptions{},
        [local](void* addr, uint64_t len) -> std::pair<void*, uint64_t> {
          if (local == nullptr) return {nullptr, 0};
          auto seg = local->FindContaining(addr, len);
          if (!seg) return {nullptr, 0};
          return {seg->base, seg->size};
        });
  }
}

absl::StatusOr<std::unique_ptr<Channel>> RdmaTransport::Connect(const PeerSpec& peer,
                                                                const Endpoint& endpoint,
                                                                absl::Duration timeout) {
  if (endpoint.kind != TransportKind::kRdma) {
    return absl::InvalidArgumentError("rdma transport given a non-rdma endpoint");
  }
  if (!options_.context) return absl::FailedPreconditionError("rdma: no device");
  auto channel = std::make_unique<RdmaChannel>(peer, endpoint, options_);
  if (auto st = channel->Start(timeout); !st.ok()) {
    return absl::UnavailableError(st.message());
  }
  return channel;
}

}  // namespace strata::transfer
