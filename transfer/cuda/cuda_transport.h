// The cuda transport (CUDA builds only): copies between host memory and GPU memory, and between
// GPUs of one host, for the segments of THIS process.
//
//   TransferEngine engine(...);                       // with a GPU, engine has a cuda transport
//   engine->segments().Register(*AllocateDeviceSegment("kv", bytes, /*device=*/0));
//   engine->segments().Register(dram_segment);        // host memory (e.g. a memfd arena)
//   auto peer = engine->OpenPeer(engine->LocalPeerSpec());   // → the cuda transport
//   engine->Submit(*peer, {{.op = kRead, .local = device_ptr, .segment = "dram", ...}});
//
// A request copies between its local buffer (host or device pointer) and a segment of the
// process's SegmentRegistry (host or device), checked against its capability like any remote
// access. Copies run asynchronously (cudaMemcpyAsync / cudaMemcpyPeerAsync) on a small pool of
// non-blocking streams per device, round robin; each copy records an event that the channel's
// worker thread polls (cudaEventQuery) to complete the request with its own status.
//
// Host memory must be page-locked for an asynchronous copy: pageable host ranges are pinned
// with cudaHostRegister through a bounded registration cache (the MR cache of the rdma
// transport: one registration per host segment, dropped when the segment is unregistered).
// Device ↔ device copies between two GPUs use peer access when the pair supports it
// (cudaDeviceEnablePeerAccess, enabled once per pair), otherwise CUDA stages them through host.
//
// Deadlines: a request that has not started by its deadline completes with DeadlineExceeded. A
// copy that was handed to the GPU cannot be cancelled: it completes when its event fires (a
// DMA of a KV block takes microseconds to milliseconds); one still running long after its
// deadline is logged, and the engine's watchdog ends the batch.
//
// Checksums: the channel checks them itself (the engine cannot hash device memory): a read
// verifies the source when it is host memory (before the copy), else the destination when it
// is host memory (after); a write verifies whichever side is host memory; device-to-device
// copies are not verified.
//
// Thread safety: the transport and its channels are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transfer/capability.h"
#include "transfer/segment.h"
#include "transfer/transport.h"

namespace strata::transfer {

struct CudaTransportOptions {
  ClusterSecret secret;
  const SegmentRegistry* segments = nullptr;  // required: the segments the channel serves
  int streams_per_device = 4;
  uint64_t max_pinned_bytes = 64ull << 30;  // host bytes the registration cache may pin
};

// The address of a cuda endpoint: only this process's segments.
inline constexpr char kCudaLocalAddress[] = "local";

class CudaTransport : public Transport {
 public:
  // Unavailable (with the CUDA error) when there is no usable GPU.
  static absl::StatusOr<std::unique_ptr<CudaTransport>> Create(CudaTransportOptions options);
  ~CudaTransport() override;

  TransportKind kind() const override { return TransportKind::kCuda; }
  TransportCapabilities capabilities() const override {
    return {.same_host_only = true,
            .one_sided = true,
            .zero_copy = true,
            .device_memory = true,
            .needs_registration = true,
            .verifies_read_checksums = true};
  }
  // `endpoint` must be {kind: kCuda, address: kCudaLocalAddress}.
  absl::StatusOr<std::unique_ptr<Channel>> Connect(const PeerSpec& peer, const Endpoint& endpoint,
                                                   absl::Duration timeout) override;

  struct Shared;

 private:
  explicit CudaTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

// Number of usable CUDA devices (0 without a GPU or driver).
int CudaDeviceCount();

// A device segment over `bytes` of cudaMalloc'd memory on `device`, freed when the Segment and
// every copy of it (the registry's, in-flight requests') are gone.
absl::StatusOr<Segment> AllocateDeviceSegment(std::string name, uint64_t bytes, int device);

}  // namespace strata::transfer
