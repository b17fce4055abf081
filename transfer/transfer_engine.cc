#include "transfer/transfer_engine.h"

#include <thread>

#include "common/checksum.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/rdma/rdma_transport.h"
#include "transfer/shm/shm_transport.h"
#include "transfer/tcp/tcp_transport.h"
#if STRATA_WITH_CUDA
#include "transfer/cuda/cuda_transport.h"
#endif

namespace strata::transfer {
namespace {

// How long after a deadline the watchdog steps in for a transport that did not report.
constexpr absl::Duration kWatchdogGrace = absl::Milliseconds(250);
constexpr absl::Duration kWatchdogTick = absl::Milliseconds(20);

class PeerImpl : public Peer {
 public:
  PeerImpl(PeerSpec spec, TransportKind kind, TransportCapabilities caps,
           std::unique_ptr<Channel> channel)
      : spec_(std::move(spec)), kind_(kind), caps_(caps), channel_(std::move(channel)) {}
  ~PeerImpl() override { channel_->Close(); }
  const PeerSpec& spec() const override { return spec_; }
  TransportKind transport() const override { return kind_; }
  Channel& channel() { return *channel_; }
  const TransportCapabilities& capabilities() const { return caps_; }

 private:
  PeerSpec spec_;
  TransportKind kind_;
  TransportCapabilities caps_;
  std::unique_ptr<Channel> channel_;
};

}  // namespace

// Completes requests of a batch exactly once each (transport or watchdog, whichever is first).
class BatchCompleter {
 public:
  struct Check {
    OpKind op;
    void* local;
    uint64_t length;
    std::optional<uint64_t> checksum;
  };

  static void Complete(const std::shared_ptr<Batch>& batch, const std::vector<Check>& checks,
                       size_t i, absl::Status status) {
    if (status.ok() && checks[i].op == OpKind::kRead && checks[i].checksum &&
        Checksum64(checks[i].local, checks[i].length) != *checks[i].checksum) {
      status = absl::DataLossError(
          StrCat("read of ", checks[i].length, " bytes does not match its checksum"));
    }
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(batch->mu_);
      if (batch->done_[i]) return;
      batch->done_[i] = true;
      batch->statuses_[i] = std::move(status);
      last = batch->remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1;
      if (last) batch->cv_.notify_all();
    }
    if (last && batch->on_done_) batch->on_done_(*batch);
  }
};

bool Batch::Wait(absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return Poll(); });
  return Poll();
}

absl::Status Batch::status(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_[i]) return absl::UnavailableError("pending");
  return statuses_[i];
}

absl::Status Batch::FirstError() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < statuses_.size(); ++i) {
    if (!done_[i]) return absl::UnavailableError(StrCat("request ", i, " pending"));
    if (!statuses_[i].ok()) return Annotate(statuses_[i], StrCat("request ", i));
  }
  return absl::OkStatus();
}

int64_t Batch::bytes_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (size_t i = 0; i < statuses_.size(); ++i) {
    if (done_[i] && statuses_[i].ok()) total += static_cast<int64_t>(lengths_[i]);
  }
  return total;
}

struct TransferEngine::Impl {
  std::unique_ptr<Transport> shm;
  std::unique_ptr<Transport> tcp;
  std::unique_ptr<Transport> rdma;  // null: see rdma_unavailable
  std::string rdma_unavailable;
  std::unique_ptr<Transport> cuda;  // null: see cuda_unavailable
  std::string cuda_unavailable = "cuda: not built (STRATA_WITH_CUDA=OFF)";
  std::shared_ptr<rdma::MrCache> rdma_local_mrs;  // registrations of local buffers
  int segment_listener = 0;

  struct Watched {
    absl::Time deadline;
    std::weak_ptr<Batch> batch;
    std::shared_ptr<const std::vector<BatchCompleter::Check>> checks;
  };
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;             // guarded by mu
  std::vector<Watched> watched;  // guarded by mu
  std::thread watchdog;

  void Watchdog() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, absl::ToChronoNanoseconds(kWatchdogTick), [this] { return stop; });
      const absl::Time now = absl::Now();
      std::vector<Watched> expired;
      std::vector<Watched> keep;
      for (Watched& w : watched) {
        auto batch = w.batch.lock();
        if (!batch || batch->Poll()) continue;
        (now >= w.deadline ? expired : keep).push_back(std::move(w));
      }
      watched.swap(keep);
      if (expired.empty()) continue;
      lock.unlock();
      for (Watched& w : expired) {
        auto batch = w.batch.lock();
        if (!batch) continue;
        spdlog::error("transfer: a transport missed the deadline of a batch; failing it");
        for (size_t i = 0; i < batch->size(); ++i) {
          BatchCompleter::Complete(batch, *w.checks, i,
                                   absl::DeadlineExceededError("transfer: no completion before "
                                                               "the deadline (watchdog)"));
        }
      }
      lock.lock();
    }
  }

  Transport* Get(TransportKind kind) {
    switch (kind) {
      case TransportKind::kShm:
        return shm.get();
      case TransportKind::kTcp:
        return tcp.get();
      case TransportKind::kRdma:
        return rdma.get();
      case TransportKind::kCuda:
        return cuda.get();
      default:
        return nullptr;
    }
  }
};

TransferEngine::TransferEngine(EngineOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

TransferEngine::~TransferEngine() {
  if (impl_->segment_listener != 0) segments_.RemoveUnregisterListener(impl_->segment_listener);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
}

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(EngineOptions options) {
  std::unique_ptr<TransferEngine> engine(new TransferEngine(std::move(options)));
  Impl& impl = *engine->impl_;
  const EngineOptions& o = engine->options_;
  auto wrap = [&](std::unique_ptr<Transport> t) {
    return o.wrap_transport ? o.wrap_transport(std::move(t)) : std::move(t);
  };
  impl.shm = wrap(std::make_unique<ShmTransport>(ShmTransportOptions{.secret = o.secret}));
  impl.tcp = wrap(std::make_unique<TcpTransport>(
      TcpTransportOptions{.secret = o.secret,
                          .connections_per_peer = o.tcp_connections_per_peer,
                          .threads_per_peer = o.tcp_threads_per_peer}));
  if (o.enable_rdma) {
    auto ctx = o.rdma_context ? o.rdma_context() : rdma::OpenIbvContext();
    if (ctx.ok()) {
      RdmaTransportOptions ro{.secret = o.secret,
                              .context = *ctx,
                              .qps_per_peer = o.rdma_qps_per_peer,
                              .local_segments = &engine->segments_};
      auto transport = std::make_unique<RdmaTransport>(std::move(ro));
      impl.rdma_local_mrs = transport->local_mrs();
      // A local segment that goes away must not keep a registration (and its pinned pages).
      std::weak_ptr<rdma::MrCache> mrs = impl.rdma_local_mrs;
      impl.segment_listener = engine->segments_.AddUnregisterListener([mrs](const Segment& s) {
        if (auto m = mrs.lock(); m && s.kind == MemoryKind::kHost) m->Invalidate(s.base, s.size);
      });
      spdlog::info("transfer: rdma on {} port {}", (*ctx)->port().device, (*ctx)->port().port);
      impl.rdma = wrap(std::move(transport));
    } else {
      impl.rdma_unavailable = std::string(ToStd(ctx.status().message()));
    }
  } else {
    impl.rdma_unavailable = "rdma: disabled by configuration";
  }
#if STRATA_WITH_CUDA
  if (o.enable_cuda) {
    auto cuda = CudaTransport::Create({.secret = o.secret, .segments = &engine->segments_});
    if (cuda.ok()) {
      impl.cuda = wrap(*std::move(cuda));
    } else {
      impl.cuda_unavailable = std::string(ToStd(cuda.status().message()));
    }
  } else {
    impl.cuda_unavailable = "cuda: disabled by configuration";
  }
#endif
  if (!impl.rdma) spdlog::info("transfer: {}; peers use tcp instead", impl.rdma_unavailable);
  impl.watchdog = std::thread([&impl] { impl.Watchdog(); });
  return engine;
}

std::vector<TransportKind> TransferEngine::available_transports() const {
  std::vector<TransportKind> out = {TransportKind::kShm, TransportKind::kTcp};
  if (impl_->rdma) out.push_back(TransportKind::kRdma);
  if (impl_->cuda) out.push_back(TransportKind::kCuda);
  return out;
}

PeerSpec TransferEngine::LocalPeerSpec() const {
  return {.name = "local",
          .host_id = options_.host_id,
          .endpoints = {
              {.kind = TransportKind::kCuda, .address = "local", .host_id = options_.host_id}}};
}

absl::StatusOr<std::shared_ptr<Peer>> TransferEngine::OpenPeer(const PeerSpec& peer) {
  std::vector<TransportKind> order = {TransportKind::kShm, TransportKind::kCuda,
                                      TransportKind::kRdma, TransportKind::kTcp};
  if (options_.force_transport) order = {*options_.force_transport};
  std::vector<std::string> attempts;
  bool forced_unusable = false;
  for (TransportKind kind : order) {
    const std::string_view name = TransportKindName(kind);
    const Endpoint* endpoint = nullptr;
    for (const Endpoint& e : peer.endpoints) {
      if (e.kind == kind) {
        endpoint = &e;
        break;
      }
    }
    if (endpoint == nullptr) {
      attempts.push_back(StrCat(name, ": peer has no ", name, " endpoint"));
      forced_unusable = true;
      continue;
    }
    if ((kind == TransportKind::kShm || kind == TransportKind::kCuda) &&
        (peer.host_id.empty() || peer.host_id != options_.host_id)) {
      attempts.push_back(StrCat(name, ": peer is on host '", peer.host_id, "', we are on '",
                                options_.host_id, "'"));
      forced_unusable = true;
      continue;
    }
    Transport* transport = impl_->Get(kind);
    if (transport == nullptr) {
      attempts.push_back(kind == TransportKind::kRdma   ? impl_->rdma_unavailable
                         : kind == TransportKind::kCuda ? impl_->cuda_unavailable
                                                        : StrCat(name, ": not available"));
      forced_unusable = true;
      continue;
    }
    auto channel = transport->Connect(peer, *endpoint, options_.connect_timeout);
    if (channel.ok()) {
      if (!attempts.empty()) {
        spdlog::info("transfer: peer {} uses {} ({})", peer.name, name, StrJoin(attempts, "; "));
      }
      return std::shared_ptr<Peer>(
          std::make_shared<PeerImpl>(peer, kind, transport->capabilities(), *std::move(channel)));
    }
    forced_unusable = false;
    attempts.push_back(StrCat(name, ": ", ToStd(channel.status().message())));
  }
  const std::string why =
      StrCat("transfer: cannot reach peer ", peer.name, ": ", StrJoin(attempts, "; "));
  if (options_.force_transport && forced_unusable) return absl::FailedPreconditionError(why);
  return absl::UnavailableError(why);
}

std::shared_ptr<Batch> TransferEngine::Submit(Peer& peer, std::vector<TransferOp> ops,
                                              SubmitOptions options) {
  const size_t n = ops.size();
  std::shared_ptr<Batch> batch(new Batch(n));
  batch->on_done_ = std::move(options.on_done);
  batch->lengths_.resize(n);
  const absl::Time deadline = absl::Now() + options.timeout;
  auto checks = std::make_shared<std::vector<BatchCompleter::Check>>(n);
  // Transports that verify reads in transit (shm while copying, tcp as bytes arrive) spare the
  // batch a second pass over the bytes. One that moves device memory is never hashed here, even
  // behind the fault decorator: its local buffers may be device addresses this host code cannot
  // read (the cuda transport checks where the bytes are).
  const TransportCapabilities& caps = static_cast<PeerImpl&>(peer).capabilities();
  const bool host_checks = !caps.verifies_read_checksums && !caps.device_memory;
  std::vector<TransferRequest> requests;
  std::vector<size_t> request_index;  // requests[j] is ops[request_index[j]]
  std::vector<std::pair<size_t, absl::Status>> failed;
  requests.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TransferOp& op = ops[i];
    batch->lengths_[i] = op.length;
    void* local = op.local;
    if (local == nullptr) {
      auto resolved = segments_.Resolve(op.local_segment, op.local_offset, op.length, &local);
      if (!resolved.ok()) {
        failed.emplace_back(i, Annotate(resolved.status(), "local buffer"));
        (*checks)[i] = {op.op, nullptr, op.length, std::nullopt};
        continue;
      }
    }
    (*checks)[i] = {op.op, local, op.length, host_checks ? op.checksum : std::nullopt};
    requests.push_back({.op = op.op,
                        .local = local,
                        .segment = std::move(op.segment),
                        .offset = op.offset,
                        .length = op.length,
                        .capability = std::move(op.capability),
                        .checksum = op.checksum,
                        .deadline = deadline});
    request_index.push_back(i);
  }
  if (!requests.empty()) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->watched.push_back({deadline + kWatchdogGrace, batch, checks});
  }
  for (auto& [i, status] : failed) BatchCompleter::Complete(batch, *checks, i, std::move(status));
  if (requests.empty()) return batch;
  // The completion holds the batch; the transport holds the completion until every request ended.
  static_cast<PeerImpl&>(peer).channel().Submit(
      std::move(requests),
      [batch, checks, index = std::move(request_index)](size_t j, const absl::Status& status) {
        BatchCompleter::Complete(batch, *checks, index[j], status);
      });
  return batch;
}

std::vector<absl::StatusOr<MappedBytes>> TransferEngine::MapReads(Peer& peer,
                                                                  std::span<const TransferOp> ops,
                                                                  absl::Duration timeout) {
  auto& impl = static_cast<PeerImpl&>(peer);
  if (!impl.capabilities().maps_peer_memory) {
    return std::vector<absl::StatusOr<MappedBytes>>(
        ops.size(), absl::UnimplementedError(StrCat(TransportKindName(impl.transport()),
                                                    " copies reads; it does not map the peer")));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<absl::StatusOr<MappedBytes>> out(ops.size(), absl::UnknownError("not mapped"));
  int64_t bytes = 0;
  for (const TransferOp& op : ops) bytes += static_cast<int64_t>(op.length);
  ForEachCopy(static_cast<int64_t>(ops.size()), bytes, [&](int64_t i) {
    const TransferOp& op = ops[i];
    if (op.op != OpKind::kRead) {
      out[i] = absl::InvalidArgumentError("MapReads takes reads only");
      return;
    }
    out[i] = impl.channel().MapRead({.op = OpKind::kRead,
                                     .segment = op.segment,
                                     .offset = op.offset,
                                     .length = op.length,
                                     .capability = op.capability,
                                     .checksum = op.checksum,
                                     .deadline = deadline});
  });
  return out;
}

}  // namespace strata::transfer
