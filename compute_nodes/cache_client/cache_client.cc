#include "compute_nodes/cache_client/cache_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <utility>

#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/host.h"
#include "common/metrics.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/cache_client/save_queue.h"
#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::cache_client {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Process-wide metric families, registered once.
struct ClientMetrics {
  MetricFamily<Counter>& fetched;
  MetricFamily<Counter>& fetch_failures;
  MetricFamily<Counter>& saved;
  MetricFamily<Counter>& bytes;

  static ClientMetrics& Get() {
    static ClientMetrics* m = [] {
      MetricsRegistry& r = MetricsRegistry::Default();
      return new ClientMetrics{
          r.AddCounter("strata_cache_client_fetched_blocks_total",
                       "Blocks fetched from a cache server and verified, per tier", {"tier"}),
          r.AddCounter("strata_cache_client_fetch_failures_total",
                       "Fetches whose verified prefix ended early, per reason", {"reason"}),
          r.AddCounter("strata_cache_client_saved_blocks_total",
                       "Blocks offered to a cache server, per outcome", {"outcome"}),
          r.AddCounter("strata_cache_client_bytes_total",
                       "Block bytes moved to or from cache servers", {"direction", "transport"}),
      };
    }();
    return *m;
  }
};

std::string_view TierLabel(HitTier tier) {
  switch (tier) {
    case HitTier::kGpu:
      return "gpu";
    case HitTier::kDram:
      return "dram";
    case HitTier::kSsd:
      return "ssd";
  }
  return "dram";
}

HitTier FromProtoTier(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_GPU:
      return HitTier::kGpu;
    case v1::TIER_SSD:
      return HitTier::kSsd;
    default:
      return HitTier::kDram;
  }
}

// The metrics label of a fetch failure. `identity`: the block was intact but not the one asked.
std::string_view FailureReason(const absl::Status& status, bool identity) {
  if (identity) return "identity";
  switch (status.code()) {
    case absl::StatusCode::kDataLoss:
      return "data_loss";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return "unavailable";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline";
    default:
      return "other";
  }
}

absl::Status ItemToStatus(const v1::ItemStatus& item) {
  return absl::Status(static_cast<absl::StatusCode>(item.code()), item.message());
}

std::string KeyBytes(const BlockKey& key) { return std::string(key.View()); }

bool IsZero(const BlockKey& key) {
  return std::all_of(key.bytes.begin(), key.bytes.end(), [](uint8_t b) { return b == 0; });
}

// The peer's transfer endpoints as the engine wants them.
transfer::PeerSpec PeerSpecOf(const std::string& name, const std::string& host_id,
                              const v1::SegmentDescriptor& segment) {
  transfer::PeerSpec spec;
  spec.name = name;
  spec.host_id = host_id;
  for (const auto& ep : segment.endpoints()) {
    spec.endpoints.push_back({.kind = static_cast<transfer::TransportKind>(ep.kind()),
                              .address = ep.address(),
                              .host_id = ep.host_id(),
                              .rdma_gid = ep.rdma_gid(),
                              .rdma_qp_count = ep.rdma_qp_count()});
  }
  return spec;
}

// One transfer of a whole block between `local` and the slot `loc` names.
transfer::TransferOp BlockOp(transfer::OpKind kind, uint8_t* local, const v1::BlockLocation& loc,
                             uint64_t length, uint64_t checksum) {
  transfer::TransferOp op;
  op.op = kind;
  op.local = local;
  op.segment = loc.segment();
  op.offset = loc.offset();
  op.length = length;
  op.capability = loc.capability();
  op.checksum = checksum;
  return op;
}

bool SameLayout(const BlockLayout& a, const BlockLayout& b) {
  return a.codec == b.codec && a.n_layers == b.n_layers && a.block_tokens == b.block_tokens &&
         a.kv_lora_rank == b.kv_lora_rank && a.rope_dim == b.rope_dim;
}

// Submits `ops` and waits for all of them. `keep_alive` owns the local buffers: the batch holds
// it until its last request completed, so buffers stay valid even if the wait gives up first.
std::shared_ptr<transfer::Batch> RunBatch(transfer::TransferEngine& engine, transfer::Peer& peer,
                                          std::vector<transfer::TransferOp> ops,
                                          absl::Duration timeout,
                                          std::shared_ptr<const void> keep_alive) {
  auto batch =
      engine.Submit(peer, std::move(ops),
                    {.timeout = timeout, .on_done = [keep_alive](const transfer::Batch&) {}});
  // The engine ends every request shortly after its deadline; the slack covers a loaded host.
  batch->Wait(timeout + absl::Seconds(2));
  return batch;
}

// One fetched block, parsed and checked against the key and tokens asked for.
struct CheckedBlock {
  absl::Status status;    // the message starts with ": " or " was ..." (after the key)
  bool identity = false;  // an intact block that is not the one asked for
  std::span<const uint8_t> payload;
};

CheckedBlock CheckBlock(std::span<const uint8_t> bytes, const BlockLayout& layout,
                        const BlockKey& key, std::span<const uint32_t> expected_tokens) {
  absl::StatusOr<BlockView> view = ParseBlock(bytes);
  if (!view.ok()) {
    return {absl::Status(view.status().code(), StrCat(": ", view.status().message())),
            IsBlockIdentityMismatch(view.status())};
  }
  if (!SameLayout(view->header.layout, layout)) {
    return {absl::NotFoundError(" was stored with another layout"), true};
  }
  // The bytes are what the server holds: the engine checked the read against the checksum the
  // server verified at commit. So only the identity is checked here, not the payload's hash.
  if (absl::Status v =
          VerifyBlockIdentity(view->header, view->tokens, view->payload, key, expected_tokens);
      !v.ok()) {
    return {absl::Status(v.code(), StrCat(": ", v.message())), IsBlockIdentityMismatch(v)};
  }
  return {absl::OkStatus(), false, view->payload};
}

// What the reads of one run gave: per block, OK and where its bytes are, or why not.
struct RunRead {
  std::vector<absl::Status> status;
  std::vector<std::span<const uint8_t>> bytes;  // for the blocks read, in order
  std::shared_ptr<const void> owner;            // in place: the mapping the bytes lie in
};

struct DataPath {
  std::shared_ptr<transfer::Peer> peer;
  std::string label;  // the transport: "shm" | "tcp" | "rdma"
};

}  // namespace

struct CacheClient::Impl {
  CacheClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::CacheControl::Stub> stub;
  std::string server_id;                             // as of Connect
  std::unique_ptr<transfer::TransferEngine> engine;  // outlives every DataPath
  ClientMetrics& metrics = ClientMetrics::Get();

  // The data path, replaced when it goes stale: a restarted server listens for transfers on new
  // ports (and a new shm arena), so a failed transfer or an unreachable server marks the path
  // stale and the next Fetch or Save re-runs CacheControl.Connect and opens a new peer. Each
  // call keeps its own reference to the path it started with.
  mutable std::mutex path_mu;
  std::shared_ptr<const DataPath> path ABSL_GUARDED_BY(path_mu);
  bool path_stale ABSL_GUARDED_BY(path_mu) = false;
  absl::Time path_opened ABSL_GUARDED_BY(path_mu);
  std::mutex reopen_mu;  // one re-open at a time

  std::mutex queue_mu;
  std::unique_ptr<SaveQueue> queue;  // created by the first SaveAsync; drained before the rest

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  }

  // `context` names the call in the message: "cache server 127.0.0.1:7400: Lookup: ...".
  absl::Status RpcError(const grpc::Status& status, std::string_view call) {
    const absl::Status s = FromGrpcStatus(status);
    if (absl::IsUnavailable(s)) MaybeStale(s);  // the server may come back elsewhere
    return absl::Status(s.code(),
                        StrCat("cache server ", options.address, ": ", call, ": ", s.message()));
  }

  // CacheControl.Connect, then a transfer peer to the server's "dram" segment.
  absl::StatusOr<std::shared_ptr<const DataPath>> OpenDataPath(std::string* server_id_out) {
    v1::ConnectRequest req;
    req.set_client_id(options.client_id);
    req.set_host_id(options.host_id);
    if (options.force_transport) {
      req.add_transports(static_cast<v1::TransportKind>(*options.force_transport));
    } else {
      for (transfer::TransportKind k : engine->available_transports()) {
        req.add_transports(static_cast<v1::TransportKind>(k));
      }
    }
    v1::ConnectResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    if (const grpc::Status s = stub->Connect(&ctx, req, &resp); !s.ok()) {
      return absl::UnavailableError(StrCat("cannot reach cache server ", options.address,
                                           " within ", absl::FormatDuration(options.rpc_timeout),
                                           ": ", s.error_message()));
    }
    const v1::SegmentDescriptor* dram = nullptr;
    for (const auto& seg : resp.segments()) {
      if (seg.name() == "dram") dram = &seg;
    }
    if (dram == nullptr) {
      return absl::FailedPreconditionError(StrCat("cache server ", options.address, " (",
                                                  resp.server_id(), ") offers no 'dram' segment"));
    }
    absl::StatusOr<std::shared_ptr<transfer::Peer>> peer =
        engine->OpenPeer(PeerSpecOf(StrCat("cache ", resp.server_id()), resp.host_id(), *dram));
    if (!peer.ok()) {
      return absl::Status(
          absl::IsFailedPrecondition(peer.status()) ? peer.status().code()
                                                    : absl::StatusCode::kUnavailable,
          StrCat("cache server ", options.address, ": no data path: ", peer.status().message()));
    }
    if (server_id_out != nullptr) *server_id_out = resp.server_id();
    auto path = std::make_shared<DataPath>();
    path->label = std::string(transfer::TransportKindName((*peer)->transport()));
    path->peer = std::move(*peer);
    return std::shared_ptr<const DataPath>(std::move(path));
  }

  // The current data path; re-opened first when it is stale (at most once a second, unless
  // `now`: a read that just failed on a path that answered a Lookup a moment ago).
  std::shared_ptr<const DataPath> Path(bool now = false) {
    {
      std::lock_guard<std::mutex> lock(path_mu);
      if (!path_stale || (!now && absl::Now() - path_opened < absl::Seconds(1))) return path;
    }
    std::unique_lock<std::mutex> reopen(reopen_mu, std::try_to_lock);
    std::unique_lock<std::mutex> lock(path_mu);
    if (!reopen.owns_lock() || !path_stale) return path;  // another call is re-opening it
    path_opened = absl::Now();
    lock.unlock();
    absl::StatusOr<std::shared_ptr<const DataPath>> fresh = OpenDataPath(nullptr);
    lock.lock();
    if (fresh.ok()) {
      spdlog::info("cache client {}: data path to {} re-opened over {}", options.client_id,
                   options.address, (*fresh)->label);
      path = std::move(*fresh);
      path_stale = false;
    } else {
      spdlog::debug("cache client {}: re-opening the data path: {}", options.client_id,
                    ToStd(fresh.status().message()));
    }
    return path;
  }

  // After a failure that a restarted or unreachable server would cause.
  void MaybeStale(const absl::Status& status) {
    if (absl::IsUnavailable(status) || absl::IsCancelled(status) || absl::IsDataLoss(status) ||
        absl::IsNotFound(status) || absl::IsPermissionDenied(status)) {
      std::lock_guard<std::mutex> lock(path_mu);
      path_stale = true;
    }
  }

  void ReleaseLease(uint64_t lease_id) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::ReleaseRequest req;
    req.set_lease_id(lease_id);
    v1::ReleaseResponse resp;
    const grpc::Status s = stub->Release(&ctx, req, &resp);
    if (!s.ok()) {
      // The lease expires on the server anyway; only its blocks stay pinned until then.
      spdlog::debug("cache client: release of lease {} at {}: {}", lease_id, options.address,
                    s.error_message());
    }
  }
};

CacheClient::CacheClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CacheClient::~CacheClient() {
  // Pending saves still use the channel and the engine: drain them first.
  std::unique_ptr<SaveQueue> queue;
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mu);
    queue = std::move(impl_->queue);
  }
  queue.reset();
}

const std::string& CacheClient::address() const { return impl_->options.address; }
const std::string& CacheClient::server_id() const { return impl_->server_id; }
transfer::TransportKind CacheClient::transport() const {
  std::lock_guard<std::mutex> lock(impl_->path_mu);
  return impl_->path->peer->transport();
}

uint64_t CacheClient::pending_save_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->queue_mu);
  return impl_->queue ? impl_->queue->pending_bytes() : 0;
}

absl::StatusOr<std::unique_ptr<CacheClient>> CacheClient::Connect(CacheClientOptions options) {
  if (options.address.empty()) return absl::InvalidArgumentError("cache client: empty address");
  if (options.host_id.empty()) options.host_id = HostName();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const CacheClientOptions& o = impl->options;

  transfer::EngineOptions eo;
  if (o.transfer) {
    eo = *o.transfer;
  } else {
    eo.enable_rdma = true;
    eo.connect_timeout = o.rpc_timeout;
  }
  eo.host_id = o.host_id;
  eo.secret = transfer::ClusterSecret(o.cluster_secret);
  if (o.force_transport) eo.force_transport = o.force_transport;
  eo.wrap_transport = o.wrap_transport;
  ASSIGN_OR_RETURN(impl->engine, transfer::TransferEngine::Create(std::move(eo)));

  // A restarted server is found again within a few seconds (gRPC's default backoff grows to
  // two minutes, during which every call would fail fast).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  impl->channel = grpc::CreateCustomChannel(o.address, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::CacheControl::NewStub(impl->channel);
  ASSIGN_OR_RETURN(std::shared_ptr<const DataPath> path, impl->OpenDataPath(&impl->server_id));
  spdlog::info("cache client {}: connected to {} ({}) over {}", o.client_id, o.address,
               impl->server_id, path->label);
  {
    std::lock_guard<std::mutex> lock(impl->path_mu);
    impl->path = std::move(path);
    impl->path_opened = absl::Now();
  }
  return std::unique_ptr<CacheClient>(new CacheClient(std::move(impl)));
}

FetchResult CacheClient::Fetch(const Namespace& ns, std::span<const BlockKey> keys,
                               std::span<const uint32_t> tokens, const BlockLayout& layout,
                               const std::string& request_id, const FetchOptions& options) {
  Impl& im = *impl_;
  FetchResult out;
  bool identity = false;
  // Ends the verified prefix (once: the first failure is the one reported).
  auto fail = [&](absl::Status status, bool is_identity = false) {
    if (!out.first_failure.ok()) return;
    out.first_failure = std::move(status);
    identity = is_identity;
  };
  if (keys.empty()) return out;
  if (const absl::Status v = ValidateBlockLayout(layout); !v.ok()) {
    fail(v);
  } else if (tokens.size() != keys.size() * layout.block_tokens) {
    fail(absl::InvalidArgumentError(StrCat("fetch of ", keys.size(), " blocks with ", tokens.size(),
                                           " tokens; want ", keys.size() * layout.block_tokens)));
  }
  if (!out.first_failure.ok()) {
    im.metrics.fetch_failures.Labels({"other"}).Increment();
    return out;
  }

  // 1. Lookup: the longest present prefix, under a read lease, promoted to DRAM.
  const Clock::time_point lookup_start = Clock::now();
  v1::LookupRequest lreq;
  lreq.set_client_id(im.options.client_id);
  lreq.set_namespace_id(std::string(ns.View()));
  for (const BlockKey& k : keys) lreq.add_keys(KeyBytes(k));
  lreq.set_lease(true);
  lreq.set_promote(true);
  lreq.set_request_id(request_id);
  v1::LookupResponse lresp;
  {
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    const grpc::Status s = im.stub->Lookup(&ctx, lreq, &lresp);
    out.lookup_ms = MsSince(lookup_start);
    if (!s.ok()) {
      fail(im.RpcError(s, "Lookup"));
      im.metrics.fetch_failures.Labels({std::string(FailureReason(out.first_failure, false))})
          .Increment();
      return out;
    }
  }
  const uint64_t lease_id = lresp.has_lease() ? lresp.lease().lease_id() : 0;
  out.hit_blocks = std::min<int64_t>({int64_t{lresp.hit_blocks()}, int64_t{lresp.locations_size()},
                                      static_cast<int64_t>(keys.size())});

  // 2. Which hits can be read remotely: a prefix of them.
  const uint64_t block_bytes = layout.TotalBytes();
  // A block that cannot be read ends the prefix, but reads before it may fail first: the
  // reason is kept aside until they are verified.
  absl::Status unreadable;
  bool unreadable_identity = false;
  auto stop_at = [&](absl::Status status, bool is_identity = false) {
    unreadable = std::move(status);
    unreadable_identity = is_identity;
  };
  size_t readable = 0;
  for (; readable < static_cast<size_t>(out.hit_blocks); ++readable) {
    const v1::BlockLocation& loc = lresp.locations(static_cast<int>(readable));
    if (loc.key() != KeyBytes(keys[readable])) {
      stop_at(
          absl::InternalError(StrCat("Lookup answered location ", readable, " for another key")));
      break;
    }
    if (loc.capability().empty()) {
      stop_at(
          absl::UnavailableError(StrCat("block ", readable, " (", keys[readable].Hex(), ", ",
                                        v1::Tier_Name(loc.tier()), ") is not remotely readable")));
      break;
    }
    if (loc.length() != block_bytes) {
      stop_at(absl::NotFoundError(StrCat("block ", readable, " (", keys[readable].Hex(), ") is ",
                                         loc.length(), " bytes; the layout makes ", block_bytes)),
              /*is_identity=*/true);
      break;
    }
  }

  // 3. The reads, in runs of about options.run_bytes, each read checked against the stored
  // checksum: in place when the data path maps the server's memory and the caller takes blocks
  // from there (FetchOptions::in_place), else copied into one buffer. Run k + 1 is read on a
  // helper thread while run k is checked (on up to 8 threads: each check parses megabytes) and
  // handed to on_blocks, in order; the first block that fails ends the prefix, and no later run
  // is handed over.
  if (readable > 0) {
    std::shared_ptr<const DataPath> path = im.Path();
    const Clock::time_point transfer_start = Clock::now();
    const size_t run_blocks =
        static_cast<size_t>(std::clamp<uint64_t>(options.run_bytes / block_bytes, 1, readable));
    auto op_of = [&lresp, block_bytes](size_t i, uint8_t* local) {
      const v1::BlockLocation& loc = lresp.locations(static_cast<int>(i));
      return BlockOp(transfer::OpKind::kRead, local, loc, block_bytes, loc.checksum());
    };
    // In place or not, decided per data path: a probe of one byte finds the mapped region.
    bool in_place = false;
    auto decide = [&] {
      in_place = false;
      if (!options.in_place) return;
      transfer::TransferOp probe = op_of(0, nullptr);
      probe.length = 1;
      probe.checksum.reset();
      absl::StatusOr<transfer::MappedBytes> m =
          std::move(im.engine->MapReads(*path->peer, {&probe, 1}, im.options.transfer_timeout)[0]);
      in_place = m.ok() && options.in_place(m->region, m->owner);
    };
    std::shared_ptr<HostBuffer> buffer;  // copies only
    auto ensure_buffer = [&] {
      if (buffer != nullptr) return;
      const size_t bytes = readable * block_bytes;
      if (options.buffer) {
        absl::StatusOr<std::shared_ptr<HostBuffer>> given = options.buffer(bytes);
        if (given.ok() && *given != nullptr && (*given)->size() >= bytes) {
          buffer = *std::move(given);
        } else {
          spdlog::warn(
              "cache client: fetch {}: no {}-byte fetch buffer ({}); reading to heap memory",
              request_id, bytes,
              given.ok() ? std::string("too small") : ToStd(given.status().message()));
        }
      }
      if (buffer == nullptr) buffer = HostBuffer::Allocate(bytes);
      out.buffer = buffer;
    };
    // Reads blocks [begin, end) through `p`.
    auto read_run = [&](const DataPath& p, bool mapped, size_t begin, size_t end) {
      RunRead run;
      std::vector<transfer::TransferOp> reads;
      reads.reserve(end - begin);
      for (size_t i = begin; i < end; ++i) {
        reads.push_back(op_of(i, mapped ? nullptr : buffer->data() + i * block_bytes));
      }
      if (mapped) {
        for (auto& m : im.engine->MapReads(*p.peer, reads, im.options.transfer_timeout)) {
          run.status.push_back(m.status());
          if (!m.ok()) continue;
          run.bytes.push_back(m->bytes);
          run.owner = m->owner;
        }
        return run;
      }
      std::shared_ptr<transfer::Batch> batch =
          RunBatch(*im.engine, *p.peer, std::move(reads), im.options.transfer_timeout, buffer);
      for (size_t i = begin; i < end; ++i) {
        absl::Status st = batch->status(i - begin);
        if (absl::IsUnavailable(st) && st.message() == "pending") {
          st = absl::DeadlineExceededError("read did not complete in time");
        }
        run.status.push_back(std::move(st));
        run.bytes.emplace_back(buffer->data() + i * block_bytes, block_bytes);
      }
      return run;
    };
    auto start_run = [&](size_t begin, size_t end) {
      decide();
      if (!in_place) ensure_buffer();
      return read_run(*path, in_place, begin, end);
    };
    size_t begin = 0, end = run_blocks;
    RunRead run = start_run(begin, end);
    if (const absl::Status& first = run.status[0];
        absl::IsUnavailable(first) || absl::IsDataLoss(first)) {
      // The server answered the Lookup but its data path is gone: it restarted (new transfer
      // ports, a new shm arena). Over tcp that is a refused connection; over shm the old arena
      // stays mapped and readable, so it shows as bytes that fail their checksum. Re-open the
      // path once and read again under the same lease (real corruption fails again).
      im.MaybeStale(first);
      std::shared_ptr<const DataPath> fresh = im.Path(/*now=*/true);
      if (fresh != path) {
        path = std::move(fresh);
        run = start_run(begin, end);
      }
    }
    if (in_place) out.mapping = run.owner;

    // 4. Each run as it arrives: check its blocks, take them in order, hand them over.
    uint64_t bytes_read = 0;
    while (true) {
      const size_t next_end = std::min(readable, end + run_blocks);
      std::future<RunRead> next;
      if (end < readable) {
        next = std::async(std::launch::async, [&read_run, path, in_place, end, next_end] {
          return read_run(*path, in_place, end, next_end);
        });
      }
      size_t arrived = begin;
      while (arrived < end && run.status[arrived - begin].ok()) ++arrived;
      std::vector<CheckedBlock> checked(arrived - begin);
      ForEachCopy(static_cast<int64_t>(checked.size()),
                  static_cast<int64_t>(checked.size() * block_bytes), [&](int64_t j) {
                    const size_t i = begin + static_cast<size_t>(j);
                    checked[j] =
                        CheckBlock(run.bytes[j], layout, keys[i],
                                   tokens.subspan(i * layout.block_tokens, layout.block_tokens));
                  });
      bool whole = true;  // every block of the run checked out
      for (size_t i = begin; i < end; ++i) {
        if (i == arrived) {
          const absl::Status& st = run.status[i - begin];
          im.MaybeStale(st);
          fail(absl::Status(st.code(), StrCat("reading block ", i, " (", keys[i].Hex(), ") from ",
                                              im.options.address, ": ", st.message())));
          whole = false;
          break;
        }
        bytes_read += block_bytes;
        if (const CheckedBlock& c = checked[i - begin]; !c.status.ok()) {
          fail(absl::Status(c.status.code(),
                            StrCat("block ", i, " (", keys[i].Hex(), ")", c.status.message())),
               c.identity);
          whole = false;
          break;
        }
        // Count an SSD hit as SSD even though Lookup(promote) served it from DRAM.
        const v1::BlockLocation& loc = lresp.locations(static_cast<int>(i));
        const HitTier tier =
            FromProtoTier(loc.found_in() != v1::TIER_UNSPECIFIED ? loc.found_in() : loc.tier());
        out.blocks.push_back({.tier = tier, .payload = checked[i - begin].payload});
        im.metrics.fetched.Labels({std::string(TierLabel(tier))}).Increment();
      }
      // The checked part of the run (all of it unless a block failed) goes to the caller.
      if (out.blocks.size() > begin && options.on_blocks &&
          !options.on_blocks(begin, std::span<const FetchedBlock>(out.blocks).subspan(begin)) &&
          whole) {
        fail(absl::CancelledError(StrCat("the caller stopped the fetch after ", end, " blocks")));
        whole = false;
      }
      if (next.valid()) {
        RunRead read = next.get();  // wait for it either way
        if (whole) run = std::move(read);
      }
      if (!whole || end == readable) break;
      begin = end;
      end = next_end;
    }
    out.transfer_ms = MsSince(transfer_start);
    im.metrics.bytes.Labels({"read", path->label}).Increment(static_cast<double>(bytes_read));
  }

  if (out.blocks.size() == readable && !unreadable.ok()) fail(unreadable, unreadable_identity);

  // 5. The read lease ends here, whatever happened (best effort; it expires otherwise).
  if (lease_id != 0) im.ReleaseLease(lease_id);
  if (!out.first_failure.ok()) {
    im.metrics.fetch_failures.Labels({std::string(FailureReason(out.first_failure, identity))})
        .Increment();
    spdlog::debug("cache client: fetch {}: {} of {} hit blocks verified: {}", request_id,
                  out.blocks.size(), out.hit_blocks, ToStd(out.first_failure.message()));
  }
  return out;
}

absl::StatusOr<SaveResult> CacheClient::Save(const Namespace& ns, const std::string& tenant,
                                             const BlockLayout& layout,
                                             std::vector<BlockToSave> blocks,
                                             const std::string& request_id) {
  Impl& im = *impl_;
  SaveResult out;
  if (blocks.empty()) return out;
  RETURN_IF_ERROR(ValidateBlockLayout(layout));

  // 1. Encode every block; a block whose key does not name its tokens is a caller bug, and
  //    publishing it would poison the cache for everyone sharing the namespace.
  //    Blocks are encoded on up to 8 threads (each a copy and two checksum passes over
  //    megabytes); the first bad one, in order, is the error.
  const uint64_t block_bytes = layout.TotalBytes();
  auto encoded = std::make_shared<std::vector<uint8_t>>(blocks.size() * block_bytes);
  std::vector<uint64_t> checksums(blocks.size());
  std::vector<absl::Status> bad(blocks.size());
  ForEachCopy(static_cast<int64_t>(blocks.size()),
              static_cast<int64_t>(blocks.size() * block_bytes), [&](int64_t i) {
                const BlockToSave& b = blocks[i];
                if (i > 0 && b.parent != blocks[i - 1].key) {
                  bad[i] = absl::InvalidArgumentError(
                      StrCat("save: block ", i, " does not continue the chain of block ", i - 1));
                  return;
                }
                if (b.tokens.size() == layout.block_tokens &&
                    ChainBlockKey(ns, b.parent, b.tokens) != b.key) {
                  bad[i] = absl::InvalidArgumentError(
                      StrCat("save: block ", i, " key ", b.key.Hex(), " does not name its tokens"));
                  return;
                }
                absl::StatusOr<std::vector<uint8_t>> bytes =
                    EncodeBlock(layout, b.key, b.parent, ns, b.tokens, b.payload);
                if (!bytes.ok()) {
                  bad[i] = Annotate(bytes.status(), StrCat("save: block ", i));
                  return;
                }
                std::memcpy(encoded->data() + i * block_bytes, bytes->data(), block_bytes);
                checksums[i] = Checksum64(bytes->data(), bytes->size());
              });
  for (const absl::Status& st : bad) RETURN_IF_ERROR(st);

  // 2. Reserve slots for all of them in one call.
  v1::ReserveRequest rreq;
  rreq.set_client_id(im.options.client_id);
  rreq.set_namespace_id(std::string(ns.View()));
  rreq.set_tenant(tenant);
  rreq.set_request_id(request_id);
  v1::KvFormat* format = rreq.mutable_format();
  format->set_codec(static_cast<v1::Codec>(layout.codec));
  format->set_block_tokens(layout.block_tokens);
  format->set_layout_version(kBlockFormatVersion);
  format->set_num_layers(layout.n_layers);
  format->set_kv_lora_rank(layout.kv_lora_rank);
  format->set_rope_dim(layout.rope_dim);
  for (const BlockToSave& b : blocks) {
    auto* spec = rreq.add_blocks();
    spec->set_key(KeyBytes(b.key));
    if (!IsZero(b.parent)) spec->set_parent_key(KeyBytes(b.parent));
    spec->set_payload_bytes(block_bytes);
  }
  v1::ReserveResponse rresp;
  {
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    if (const grpc::Status s = im.stub->Reserve(&ctx, rreq, &rresp); !s.ok()) {
      return im.RpcError(s, "Reserve");
    }
  }
  if (rresp.slots_size() != static_cast<int>(blocks.size())) {
    return absl::InternalError(StrCat("cache server ", im.options.address, ": Reserve answered ",
                                      rresp.slots_size(), " slots for ", blocks.size(), " blocks"));
  }

  enum class Outcome { kPending, kStored, kPresent, kFailed };
  std::vector<Outcome> outcome(blocks.size(), Outcome::kPending);
  auto failed = [&](size_t i, const absl::Status& st) {
    outcome[i] = Outcome::kFailed;
    if (out.first_error.ok()) {
      out.first_error = absl::Status(
          st.code(), StrCat("block ", i, " (", blocks[i].key.Hex(), "): ", st.message()));
    }
  };
  std::vector<size_t> to_write;
  std::vector<transfer::TransferOp> writes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& slot = rresp.slots(static_cast<int>(i));
    const absl::Status st = ItemToStatus(slot.status());
    if (absl::IsAlreadyExists(st)) {
      outcome[i] = Outcome::kPresent;
    } else if (!st.ok()) {
      failed(i, st);
    } else {
      to_write.push_back(i);
      writes.push_back(BlockOp(transfer::OpKind::kWrite, encoded->data() + i * block_bytes,
                               slot.location(), block_bytes, checksums[i]));
    }
  }

  // 3. Write the reserved slots in one batch, then commit what arrived.
  if (!to_write.empty()) {
    const std::shared_ptr<const DataPath> path = im.Path();
    auto batch =
        RunBatch(*im.engine, *path->peer, std::move(writes), im.options.transfer_timeout, encoded);
    v1::CommitRequest creq;
    creq.set_lease_id(rresp.lease().lease_id());
    std::vector<size_t> committed;
    for (size_t j = 0; j < to_write.size(); ++j) {
      absl::Status st = batch->status(j);
      if (absl::IsUnavailable(st) && st.message() == "pending") {
        st = absl::DeadlineExceededError("write did not complete in time");
      }
      if (!st.ok()) {
        im.MaybeStale(st);
        failed(to_write[j], st);
        continue;
      }
      auto* c = creq.add_blocks();
      c->set_key(KeyBytes(blocks[to_write[j]].key));
      c->set_checksum(checksums[to_write[j]]);
      committed.push_back(to_write[j]);
    }
    im.metrics.bytes.Labels({"write", path->label})
        .Increment(static_cast<double>(committed.size() * block_bytes));
    // Commit even when nothing arrived: it ends the write lease and frees the slots now.
    v1::CommitResponse cresp;
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    if (const grpc::Status s = im.stub->Commit(&ctx, creq, &cresp); !s.ok()) {
      return im.RpcError(s, "Commit");
    }
    for (size_t j = 0; j < committed.size(); ++j) {
      const absl::Status st = static_cast<int>(j) < cresp.results_size()
                                  ? ItemToStatus(cresp.results(static_cast<int>(j)))
                                  : absl::InternalError("Commit answered no result");
      if (st.ok()) {
        outcome[committed[j]] = Outcome::kStored;
      } else {
        im.MaybeStale(st);  // DataLoss: the bytes went to an arena the server no longer uses?
        failed(committed[j], st);
      }
    }
  }

  for (size_t i = 0; i < blocks.size(); ++i) {
    switch (outcome[i]) {
      case Outcome::kStored:
        ++out.stored;
        out.keys_in_cache.push_back(blocks[i].key);
        break;
      case Outcome::kPresent:
        ++out.present;
        out.keys_in_cache.push_back(blocks[i].key);
        break;
      default:
        ++out.failed;
        break;
    }
  }
  if (out.stored > 0) im.metrics.saved.Labels({"stored"}).Increment(out.stored);
  if (out.present > 0) im.metrics.saved.Labels({"present"}).Increment(out.present);
  if (out.failed > 0) {
    im.metrics.saved.Labels({"failed"}).Increment(out.failed);
    spdlog::debug("cache client: save {}: {} stored, {} present, {} failed: {}", request_id,
                  out.stored, out.present, out.failed, ToStd(out.first_error.message()));
  }
  return out;
}

void CacheClient::SaveAsync(const Namespace& ns, const std::string& tenant,
                            const BlockLayout& layout, std::vector<BlockToSave> blocks,
                            const std::string& request_id,
                            std::function<void(absl::StatusOr<SaveResult>)> done) {
  uint64_t bytes = 0;
  for (const BlockToSave& b : blocks) bytes += b.payload.size() + 4 * b.tokens.size();
  SaveQueue* queue;
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mu);
    if (!impl_->queue)
      impl_->queue = std::make_unique<SaveQueue>(impl_->options.max_pending_save_bytes);
    queue = impl_->queue.get();
  }
  // The queue lives until the destructor, which must not run concurrently with SaveAsync.
  queue->Push(bytes, [this, ns, tenant, layout, blocks = std::move(blocks), request_id,
                      done = std::move(done)]() mutable {
    absl::StatusOr<SaveResult> result = Save(ns, tenant, layout, std::move(blocks), request_id);
    if (done) done(std::move(result));
  });
}

void CacheClient::FlushSaves() {
  SaveQueue* queue;
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mu);
    queue = impl_->queue.get();
  }
  if (queue != nullptr) queue->Flush();
}

}  // namespace strata::cache_client
