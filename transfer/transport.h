// The transport interface: how bytes move between this process and one peer's segments.
//
// Each transport (shm/, tcp/, rdma/, cuda/) implements Transport; TransferEngine picks one per
// peer (transfer_engine.h) and talks to the peer through the Channel it returns. Tests wrap a
// Transport in the fault-injecting decorator (fault/fault_transport.h).
//
// Lifecycle of a channel:
//   1. Transport::Connect(peer, endpoint) opens connections (authenticated with the cluster
//      secret) and returns a Channel, or an error status when the peer cannot be reached.
//   2. Channel::Submit(requests, done) starts the requests; `done(i, status)` is called exactly
//      once per request i, from any thread (possibly inline, before Submit returns).
//   3. Channel::Close() fails every pending request (Cancelled) and releases the connections;
//      the destructor closes too.
//
// Deadline contract (the reason nothing hangs): a transport calls done(i, ...) for every request
// no later than shortly after request.deadline (a few milliseconds of slack for its timer), with
// DeadlineExceeded when the deadline passed first. Once done(i, ...) has been called the
// transport never touches request i's local buffer again — even if the peer answers later.
// TransferEngine additionally enforces deadlines with a watchdog and logs a transport that
// misses one, but buffer safety rests on this contract.
//
// Status codes a transport reports per request: OK; DeadlineExceeded; Unavailable (connection
// lost / peer dead: retryable); PermissionDenied (capability refused); OutOfRange (bounds);
// NotFound (no such segment); DataLoss (checksum mismatch); InvalidArgument; Cancelled (Close).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::transfer {

// Mirrors proto strata.v1.TransportKind (values kept equal for a static_cast).
enum class TransportKind : int { kUnspecified = 0, kShm = 1, kTcp = 2, kRdma = 3, kCuda = 4 };

std::string_view TransportKindName(TransportKind kind);
// "shm" | "tcp" | "rdma" | "cuda" → kind; InvalidArgument otherwise.
absl::StatusOr<TransportKind> ParseTransportKind(std::string_view name);

// One way to reach a peer (mirrors proto strata.v1.TransportEndpoint).
struct Endpoint {
  TransportKind kind = TransportKind::kUnspecified;
  // tcp / rdma side channel: "host:port"; shm: the path of the owner's unix socket.
  std::string address;
  std::string host_id;   // same host_id as ours: shm (and cuda peer copy) are possible
  std::string rdma_gid;  // rdma: 16 raw bytes of the GID
  uint32_t rdma_qp_count = 0;
};

// A peer: a process that owns segments and runs a TransferServer.
struct PeerSpec {
  std::string name;  // for logs
  std::string host_id;
  std::vector<Endpoint> endpoints;
};

enum class OpKind : uint8_t { kRead = 1, kWrite = 2 };

// One request as a transport sees it (TransferEngine resolves local segments to pointers).
struct TransferRequest {
  OpKind op = OpKind::kRead;
  void* local = nullptr;  // kRead: destination; kWrite: source; `length` bytes of host memory
  std::string segment;    // remote segment name
  uint64_t offset = 0;    // into the remote segment
  uint64_t length = 0;
  std::string capability;  // token from the segment's owner (capability.h)
  // xxh3-64 of the bytes, when known: a read is checked against it (DataLoss) and a write is
  // checked by the receiving side before it reports OK.
  std::optional<uint64_t> checksum;
  absl::Time deadline = absl::InfiniteFuture();
};

// `done(index, status)`: exactly once per request index, from any thread.
using CompletionFn = std::function<void(size_t index, const absl::Status& status)>;

// What a transport can do; TransferEngine uses it to choose one per peer.
struct TransportCapabilities {
  bool same_host_only = false;      // needs the peer on the same host_id (shm)
  bool one_sided = false;           // the peer's CPU does not take part in a transfer (shm, rdma)
  bool zero_copy = false;           // no intermediate copies in user space on either side
  bool device_memory = false;       // can move device (GPU) memory directly
  bool needs_registration = false;  // local buffers must be registered (rdma MRs, pinning)
  // Checks a read's bytes against TransferRequest::checksum itself, in transit (shm: while
  // copying; cuda: where the bytes are), so the engine does not hash the destination again.
  bool verifies_read_checksums = false;
  // The peer's memory is mapped into this process: Channel::MapRead hands out reads in place.
  bool maps_peer_memory = false;
};

// A peer's bytes, mapped into this process (Channel::MapRead): readable while `owner` lives.
// What they hold is the peer's business: a cache server's read lease keeps a block unchanged.
struct MappedBytes {
  std::span<const uint8_t> bytes;
  std::span<const uint8_t> region;  // the whole mapping `bytes` lie in (to register it once)
  std::shared_ptr<const void> owner;
};

class Channel {
 public:
  virtual ~Channel() = default;

  // Starts `requests`; see the class comment for the completion and deadline contract. Local
  // buffers must stay valid until their completion. Thread-safe: many threads may submit.
  virtual void Submit(std::vector<TransferRequest> requests, CompletionFn done) = 0;

  // Fails pending requests with Cancelled and drops the connections. Idempotent; thread-safe.
  virtual void Close() = 0;

  // Sever every connection as if the link broke (pending requests fail with Unavailable). The
  // channel may reconnect on a later Submit. Used by the fault decorator; thread-safe.
  virtual void Disconnect() = 0;

  // The bytes a read of `request` (OpKind::kRead; `local` unused) would copy, in place: after the
  // same checks as a read (deadline, capability, bounds, the checksum hashed where the bytes are),
  // with the same status codes. Unimplemented unless capabilities().maps_peer_memory (shm).
  // Thread-safe.
  virtual absl::StatusOr<MappedBytes> MapRead(const TransferRequest& request);
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual TransportKind kind() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  // Opens a channel to `peer` through `endpoint` (of this transport's kind). Blocks for at most
  // `timeout`. Unavailable when the peer cannot be reached or refuses authentication.
  // Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<Channel>> Connect(const PeerSpec& peer,
                                                           const Endpoint& endpoint,
                                                           absl::Duration timeout) = 0;
};

}  // namespace strata::transfer
