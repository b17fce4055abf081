// TransferEngine: the front of the transfer engine (ARCHITECTURE.md §5).
//
//   ASSIGN_OR_RETURN(auto engine, TransferEngine::Create({.host_id = "h1", .secret = secret}));
//   ASSIGN_OR_RETURN(auto peer, engine->OpenPeer(spec));   // picks shm / rdma / tcp
//   std::vector<TransferOp> ops = {{.op = OpKind::kRead, .local = buf, .segment = "dram",
//                                   .offset = loc.offset(), .length = loc.length(),
//                                   .capability = lease.capability()}};
//   auto batch = engine->Submit(*peer, std::move(ops), {.timeout = absl::Seconds(2)});
//   batch->Wait(absl::Seconds(3));
//   for (size_t i = 0; i < batch->size(); ++i) RETURN_IF_ERROR(batch->status(i));
//
// Transport choice per peer (unless EngineOptions::force_transport): shm when the peer has a
// shm endpoint and the same host_id; cuda for LocalPeerSpec(); rdma when this host has an RDMA
// device and the peer an rdma endpoint; else tcp. A transport that fails to connect falls through
// to the next one: a missing local device, or a peer whose side channel refuses rdma, falls back to
// tcp.
//
// Completion: per request status; Batch::Poll() (non-blocking), Batch::Wait(timeout), or
// SubmitOptions::on_done (called once, from a transport or watchdog thread, after the last
// request completed). Every request has a deadline (SubmitOptions::timeout): it completes with
// DeadlineExceeded at the latest shortly after it, even if the transport misbehaves (a watchdog
// enforces it; the transport contract in transport.h keeps buffers safe).
//
// Thread safety: TransferEngine, Peer and Batch are thread-safe. Destroying the engine closes
// every peer (pending requests complete with Cancelled) and must happen after the Peers are no
// longer used.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/capability.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace strata::transfer {

namespace rdma {
class VerbsContext;
}

// One request of a batch.
struct TransferOp {
  OpKind op = OpKind::kRead;
  // The local buffer: either `local` (host memory, `length` bytes), or, when it is null, the
  // range [local_offset, local_offset + length) of the local segment `local_segment`.
  void* local = nullptr;
  std::string local_segment;
  uint64_t local_offset = 0;
  // The remote range and the capability the owner issued for it.
  std::string segment;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string capability;
  std::optional<uint64_t> checksum;  // xxh3-64 of the bytes, when known (see TransferRequest)
};

// The outcome of one Submit.
class Batch {
 public:
  size_t size() const { return statuses_.size(); }
  // True when every request has completed.
  bool Poll() const { return remaining_.load(std::memory_order_acquire) == 0; }
  // Waits until every request completed or `timeout` passed; returns Poll().
  bool Wait(absl::Duration timeout) const;
  // Status of request i: OK, an error, or Unavailable("pending") while it is running.
  absl::Status status(size_t i) const;
  // OK when every request succeeded, else the first error in request order.
  absl::Status FirstError() const;
  int64_t bytes_done() const;  // bytes of the requests that succeeded

 private:
  friend class TransferEngine;
  friend class BatchCompleter;
  explicit Batch(size_t n) : statuses_(n), done_(n, false), remaining_(n) {}

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // notified when remaining_ reaches 0
  std::vector<absl::Status> statuses_;  // guarded by mu_
  std::vector<bool> done_;              // guarded by mu_
  std::vector<uint64_t> lengths_;
  std::atomic<size_t> remaining_;
  std::function<void(const Batch&)> on_done_;
};

struct SubmitOptions {
  absl::Duration timeout = absl::Seconds(10);  // deadline of every request, from Submit
  std::function<void(const Batch&)> on_done;   // optional; see the class comment
};

class Peer {
 public:
  virtual ~Peer() = default;
  virtual const PeerSpec& spec() const = 0;
  virtual TransportKind transport() const = 0;
};

struct EngineOptions {
  std::string host_id;  // this host; peers with the same id can use shm
  ClusterSecret secret;
  // Use this transport for every peer (config `transfer.transport`); unset: choose per peer.
  std::optional<TransportKind> force_transport;
  int tcp_connections_per_peer = 4;
  int tcp_threads_per_peer = 4;  // receiving loop threads per peer (at most the connections)
  bool enable_rdma = true;       // try rdma when the build and the host have it
  int rdma_qps_per_peer = 4;
  // The RDMA device; unset: rdma::OpenIbvContext() (the host's first active port). Tests pass
  // an in-process fake NIC (tests/transfer/fake_verbs.h).
  std::function<absl::StatusOr<std::shared_ptr<rdma::VerbsContext>>()> rdma_context;
  // cuda (CUDA builds with a GPU): host <-> device and device <-> device copies between local
  // buffers and this engine's own segments (peer: LocalPeerSpec()).
  bool enable_cuda = true;
  absl::Duration connect_timeout = absl::Seconds(5);
  // Tests: wraps every transport the engine creates (e.g. in a FaultInjectingTransport).
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)> wrap_transport;
};

class TransferEngine {
 public:
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(EngineOptions options);
  ~TransferEngine();

  // Local segments (for TransferOp::local_segment and for a TransferServer of this process).
  SegmentRegistry& segments() { return segments_; }

  // Transports this engine can use on this host (tcp and shm always; rdma when a device exists;
  // cuda in CUDA builds with a GPU).
  std::vector<TransportKind> available_transports() const;

  // A peer spec for this process's own segments, reached through the cuda transport (copies
  // between local buffers and local host/device segments; transfer/cuda/cuda_transport.h).
  PeerSpec LocalPeerSpec() const;

  // Connects to `peer`. FailedPrecondition when a forced transport is not usable with this peer;
  // Unavailable when no transport could connect (the message lists each attempt).
  absl::StatusOr<std::shared_ptr<Peer>> OpenPeer(const PeerSpec& peer);

  // Starts `ops` against `peer`. Never blocks on the network; requests whose local buffer does
  // not resolve complete at once with the resolution error.
  std::shared_ptr<Batch> Submit(Peer& peer, std::vector<TransferOp> ops,
                                SubmitOptions options = {});

  // Reads in place from a peer whose memory this process maps (shm): each op (kRead; its local
  // buffer unused) is checked as Submit would check it (capability, bounds, checksum hashed where
  // the bytes are, deadline `timeout` from now) and its bytes are returned where they lie; on up
  // to 8 threads when the ops add up to megabytes. Blocks until all are checked. Unimplemented
  // for every op when the peer's transport copies (TransportCapabilities::maps_peer_memory).
  std::vector<absl::StatusOr<MappedBytes>> MapReads(Peer& peer, std::span<const TransferOp> ops,
                                                    absl::Duration timeout = absl::Seconds(10));

 private:
  explicit TransferEngine(EngineOptions options);
  struct Impl;

  EngineOptions options_;
  SegmentRegistry segments_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::transfer
