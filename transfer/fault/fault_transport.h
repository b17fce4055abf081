// A fault-injecting Transport decorator for tests of everything above the transports
// (in the spirit of RocksDB's FaultInjectionFS and Mooncake's FaultProxyTransport).
//
//   EngineOptions o;
//   o.wrap_transport = [](std::unique_ptr<Transport> t) {
//     return std::make_unique<FaultInjectingTransport>(std::move(t), FaultPolicy{.drop = 0.1});
//   };
//
// For each request, independently, with the policy's probabilities (seeded, reproducible):
//   drop     the request is swallowed: never forwarded, never completed by the transport — the
//            engine's deadline watchdog must end it (DeadlineExceeded);
//   delay    forwarded after `delay` (a slow link/peer); past its deadline the inner transport
//            refuses it with DeadlineExceeded;
//   corrupt  a read's bytes are altered after the inner transport delivered them; a write is
//            sent from a corrupted copy of the caller's buffer. With a checksum on the request
//            the corruption is caught (DataLoss); without one it is not — as on a real link;
//   kill     after forwarding this request, the channel's connections are cut
//            (Channel::Disconnect): requests in flight fail with Unavailable.
// Counters report how many of each were injected. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "transfer/transport.h"

namespace strata::transfer {

struct FaultPolicy {
  double drop = 0;
  double delay = 0;
  double corrupt = 0;
  double kill = 0;
  absl::Duration delay_by = absl::Milliseconds(50);
  uint64_t seed = 1;
};

struct FaultCounters {
  std::atomic<int64_t> dropped{0};
  std::atomic<int64_t> delayed{0};
  std::atomic<int64_t> corrupted{0};
  std::atomic<int64_t> killed{0};
};

class FaultInjectingTransport : public Transport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> inner, FaultPolicy policy,
                          std::shared_ptr<FaultCounters> counters = nullptr)
      : inner_(std::move(inner)),
        policy_(policy),
        counters_(counters ? std::move(counters) : std::make_shared<FaultCounters>()) {}

  TransportKind kind() const override { return inner_->kind(); }
  // A corrupted read is altered after the inner transport verified it: the engine must check.
  // Reads are always copies here (faults are injected into copies), never mapped in place.
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps = inner_->capabilities();
    caps.verifies_read_checksums = false;
    caps.maps_peer_memory = false;
    return caps;
  }
  absl::StatusOr<std::unique_ptr<Channel>> Connect(const PeerSpec& peer, const Endpoint& endpoint,
                                                   absl::Duration timeout) override;

  const FaultCounters& counters() const { return *counters_; }

 private:
  std::unique_ptr<Transport> inner_;
  FaultPolicy policy_;
  std::shared_ptr<FaultCounters> counters_;
  std::atomic<uint64_t> channel_seq_{0};
};

}  // namespace strata::transfer
