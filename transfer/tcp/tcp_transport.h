// The tcp transport: requests framed as in transfer/wire.h over several TCP connections per peer.
//
// Client side (TcpTransport / its channels): a channel to a peer has `threads_per_peer` lanes,
// each an epoll loop thread that owns its share of the `connections_per_peer` connections, so
// receiving runs on several cores. Submit() hands each request to the first lane with less than
// 512 KiB outstanding (else the least loaded one), so light traffic keeps to one thread and bulk
// traffic spreads, queues it there and wakes the lane through an eventfd. Within a lane a request
// goes to the connection with the fewest bytes outstanding; the loop gathers queued frames into one
// sendmsg (header, segment name, capability and — for writes — the caller's buffer itself, so
// payloads are never copied in user space) and receives read payloads straight into the caller's
// buffer. Large transfers stream: partial sends and receives continue where they stopped.
//
// Deadlines: the loop checks them every few milliseconds. A queued request is dropped; a request
// whose response has not arrived completes with DeadlineExceeded and its late response is read
// into a scratch buffer (never into the caller's buffer); a request caught half-sent forces its
// connection closed (the stream cannot be resynchronised), which fails that connection's other
// requests with Unavailable. A dead connection is re-dialled on a later Submit.
//
// Server side: ServeTcpConnection() (used by TransferServer) handles one connection: it checks
// every request's capability and bounds, receives write payloads straight into the segment and
// sends read payloads straight from it.
#pragma once

#include <atomic>
#include <memory>

#include "transfer/capability.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace strata::transfer {

struct TcpTransportOptions {
  ClusterSecret secret;
  int connections_per_peer = 4;
  int threads_per_peer = 4;  // loop threads (lanes) per peer; at most connections_per_peer
  int socket_buffer_bytes = 4 << 20;
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(TcpTransportOptions options) : options_(std::move(options)) {}

  TransportKind kind() const override { return TransportKind::kTcp; }
  TransportCapabilities capabilities() const override {
    return {.same_host_only = false,
            .one_sided = false,
            .zero_copy = true,
            .verifies_read_checksums = true};
  }
  absl::StatusOr<std::unique_ptr<Channel>> Connect(const PeerSpec& peer, const Endpoint& endpoint,
                                                   absl::Duration timeout) override;

 private:
  TcpTransportOptions options_;
};

// Counters a server keeps across its connections.
struct TcpServeCounters {
  std::atomic<int64_t> served{0};
  std::atomic<int64_t> refused{0};
};

// Serves tcp requests on an authenticated connection until the peer closes it or `fd` is shut
// down. Blocking; the caller owns `fd` (and closes it after this returns).
void ServeTcpConnection(int fd, const SegmentRegistry& segments, const ClusterSecret& secret,
                        const std::string& peer_name, TcpServeCounters* counters);

}  // namespace strata::transfer
