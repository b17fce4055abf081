// The shm transport: same-host peers map the owner's memfd-backed segments and copy with memcpy.
//
// Client side: the first request for a segment opens the owner's unix socket (Endpoint.address),
// authenticates with the cluster secret, asks for the segment by name and receives its memfd
// over SCM_RIGHTS; the channel mmaps it (MAP_SHARED) and keeps the mapping until Close() or
// Disconnect(). A read is a memcpy out of the mapping, a write a memcpy into it, done by the
// submitting thread, or spread over up to 8 threads (ForEachCopy: whole requests per thread)
// when a batch adds up to several MiB; Submit() completes every request before it returns.
// MapRead skips the copy: it checks a read as Submit would and returns the mapped bytes.
//
// Enforcement is on the mapping side: the owner hands out mappings only to peers that hold the
// cluster secret, and the channel checks each request's capability (VerifyCapability with the
// same secret) and the bounds before it copies, so a bad request is refused and logged exactly
// as the tcp server would refuse it. (A process holding the secret and the mapping could bypass
// its own checks; same-host peers are in the same trust domain — see capability.h.)
//
// The mapping outlives the owner process: a dead owner's segment can still be read (the memory
// stays valid), which is safe; liveness is the cache server's business (leases), not shm's.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "transfer/capability.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace strata::transfer {

struct ShmTransportOptions {
  ClusterSecret secret;
};

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(ShmTransportOptions options) : options_(std::move(options)) {}

  TransportKind kind() const override { return TransportKind::kShm; }
  TransportCapabilities capabilities() const override {
    return {.same_host_only = true,
            .one_sided = true,
            .zero_copy = true,
            .verifies_read_checksums = true,
            .maps_peer_memory = true};
  }
  absl::StatusOr<std::unique_ptr<Channel>> Connect(const PeerSpec& peer, const Endpoint& endpoint,
                                                   absl::Duration timeout) override;

 private:
  ShmTransportOptions options_;
};

// Serves shm map requests on an authenticated unix-socket connection until the peer closes it.
// Blocking; the caller owns `fd`. Only host segments created with CreateSharedHostSegment()
// (memfd >= 0) can be mapped; others are refused with FailedPrecondition.
void ServeShmConnection(int fd, const SegmentRegistry& segments, const std::string& peer_name,
                        std::atomic<int64_t>* refused);

}  // namespace strata::transfer
