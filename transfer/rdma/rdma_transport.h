// The rdma transport: one-sided RDMA READ/WRITE over ibverbs RC queue pairs.
//
// Client side (RdmaTransport::Connect → a channel):
//   1. Dials the peer's TransferServer TCP port, authenticates with the cluster secret
//      (Purpose::kRdmaSideChannel) and keeps that connection as the side channel.
//   2. Creates `qps_per_peer` RC QPs on one CQ, moves them RESET → INIT, sends their addresses
//      (QPN, LID, GID, PSN, MTU) in ConnectQps; the server creates as many QPs, connects them to
//      ours and answers with theirs; ours go INIT → RTR → RTS (rdma_wire.h).
//   3. The first request naming a (segment, capability) asks the server, over the side channel,
//      for the segment's address and rkey (Resolve); the server checks the capability first.
//      The answer is cached for the channel; every request is checked locally against the
//      capability's range and expiry before anything is posted.
//   4. A request is cut into work requests of at most `max_chunk` bytes (rdma_plan.h) that are
//      spread over the QPs; local buffers are registered through an MrCache shared by every
//      channel of the transport (whole local segments when the buffer lies in one).
//   5. One worker thread per channel posts, polls the CQ (busy-polling while work is in flight,
//      sleeping on a condition variable when idle) and enforces deadlines.
//
// Failures: a completion error moves its QP to ERR (its other work requests flush). Transient
// errors (transport/RNR retries exceeded, flushes, remote operational errors) re-post the chunk
// on a healthy QP, up to `max_attempts` posts per chunk, before the deadline; a remote access
// error re-resolves the rkey once (the segment may have been re-registered). A broken QP is
// rebuilt (new QP, ReconnectQp over the side channel, INIT → RTR → RTS) once its outstanding
// work requests have flushed. A request is completed only when none of its work requests is
// still owned by the NIC, so its buffer is never written after its completion: a request past
// its deadline moves the QPs carrying its work requests to ERR and completes (DeadlineExceeded)
// when their flushes arrive. If a NIC never delivers a flush the engine's watchdog still
// completes the batch 250 ms later (the one case where the buffer contract rests on the NIC).
//
// Writes with a checksum are verified by the owner after the data landed (VerifyWrite over the
// side channel). Reads with a checksum are verified by the engine.
//
// Server side: RdmaResponder serves side-channel connections for a TransferServer.
//
// NOT RUN ON HARDWARE (docs/transfer.md): tested against tests/transfer/fake_verbs.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/capability.h"
#include "transfer/rdma/mr_cache.h"
#include "transfer/rdma/verbs.h"
#include "transfer/segment.h"
#include "transfer/tcp/tcp_transport.h"
#include "transfer/transport.h"

namespace strata::transfer {

struct RdmaTransportOptions {
  ClusterSecret secret;
  std::shared_ptr<rdma::VerbsContext> context;  // required
  int qps_per_peer = 4;
  uint64_t max_chunk = 1 << 20;   // bytes per work request (capped at the port's max_msg_size)
  uint32_t max_send_wr = 128;     // outstanding work requests per QP
  int max_attempts = 3;           // posts per chunk before a transient error is final
  rdma::QpConnectParams connect;  // retry_cnt, rnr_retry, timeout, max_rd_atomic
  absl::Duration side_channel_timeout = absl::Seconds(2);
  // Registrations of local buffers; shared by every channel. Created when null.
  std::shared_ptr<rdma::MrCache> local_mrs;
  // Optional: the local segments, so a buffer inside one registers the whole segment once.
  const SegmentRegistry* local_segments = nullptr;
};

class RdmaTransport : public Transport {
 public:
  explicit RdmaTransport(RdmaTransportOptions options);

  TransportKind kind() const override { return TransportKind::kRdma; }
  TransportCapabilities capabilities() const override {
    return {.same_host_only = false,
            .one_sided = true,
            .zero_copy = true,
            .device_memory = false,
            .needs_registration = true};
  }
  absl::StatusOr<std::unique_ptr<Channel>> Connect(const PeerSpec& peer, const Endpoint& endpoint,
                                                   absl::Duration timeout) override;

  const std::shared_ptr<rdma::MrCache>& local_mrs() const { return options_.local_mrs; }

 private:
  RdmaTransportOptions options_;
};

// The owner side: answers side-channel requests (QP set-up, rkeys, write verification) for the
// segments of `segments`. Registers each served segment once (whole segment, remote read and
// write) and drops the registration when the segment is unregistered, so its rkey stops
// working. Thread-safe; one Serve() call per connection.
class RdmaResponder {
 public:
  RdmaResponder(std::shared_ptr<rdma::VerbsContext> context, const SegmentRegistry* segments,
                ClusterSecret secret);
  ~RdmaResponder();

  const rdma::PortInfo& port() const { return context_->port(); }

  // Serves one authenticated side-channel connection until it closes or is shut down.
  // Destroys the QPs it created for the peer on return.
  void Serve(int fd, const std::string& peer_name, TcpServeCounters* counters);

 private:
  std::shared_ptr<rdma::VerbsContext> context_;
  const SegmentRegistry* segments_;
  ClusterSecret secret_;
  rdma::MrCache mrs_;
  int listener_id_ = 0;
};

}  // namespace strata::transfer
