#include "transfer/cuda/cuda_transport.h"

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/rdma/mr_cache.h"

namespace strata::transfer {
namespace {

constexpr absl::Duration kIdleWait = absl::Milliseconds(2);
constexpr absl::Duration kLateWarning = absl::Seconds(1);

absl::Status CudaError(cudaError_t err, std::string_view what) {
  cudaGetLastError();  // clear the sticky-free error so later calls are not confused
  return absl::InternalError(StrCat("cuda: ", what, ": ", cudaGetErrorString(err)));
}

// A cudaHostRegister'ed host range, as an "MR" of the shared registration cache.
class PinnedRange : public rdma::MemoryRegion {
 public:
  PinnedRange(void* addr, uint64_t length) : addr_(addr), length_(length) {}
  ~PinnedRange() override { cudaHostUnregister(addr_); }
  uint64_t addr() const override { return reinterpret_cast<uint64_t>(addr_); }
  uint64_t length() const override { return length_; }
  uint32_t lkey() const override { return 0; }
  uint32_t rkey() const override { return 0; }

 private:
  void* addr_;
  uint64_t length_;
};

// Where a pointer lives: host (pinned or pageable) or a device ordinal.
struct Where {
  bool device = false;
  int ordinal = -1;
  bool pinned = false;  // host memory CUDA already knows as page-locked
};

Where Classify(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
      return {true, a.device, false};
    case cudaMemoryTypeManaged:
      return {true, a.device, false};
    case cudaMemoryTypeHost:
      return {false, -1, true};
    default:
      return {false, -1, false};
  }
}

struct DevicePool {
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> free_events;
  size_t next = 0;
};

}  // namespace

struct CudaTransport::Shared {
  CudaTransportOptions options;
  int devices = 0;
  std::unique_ptr<rdma::MrCache> pins;
  int listener = 0;

  std::mutex mu;
  std::vector<DevicePool> pools;             // guarded by mu; by ordinal, created lazily
  std::vector<std::vector<char>> peer_done;  // guarded by mu: peer access tried for (a, b)

  ~Shared() {
    if (options.segments != nullptr && listener != 0) {
      options.segments->RemoveUnregisterListener(listener);
    }
    pins.reset();
    for (size_t d = 0; d < pools.size(); ++d) {
      if (pools[d].streams.empty()) continue;
      cudaSetDevice(static_cast<int>(d));
      for (cudaStream_t s : pools[d].streams) cudaStreamDestroy(s);
      for (cudaEvent_t e : pools[d].free_events) cudaEventDestroy(e);
    }
  }

  // A stream of `device` (round robin) and an event to record after the copy.
  absl::Status Acquire(int device, cudaStream_t* stream, cudaEvent_t* event) {
    std::lock_guard<std::mutex> lock(mu);
    DevicePool& pool = pools[device];
    if (cudaSetDevice(device) != cudaSuccess) return CudaError(cudaGetLastError(), "set device");
    if (pool.streams.empty()) {
      for (int i = 0; i < std::max(1, options.streams_per_device); ++i) {
        cudaStream_t s;
        if (auto e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
          return CudaError(e, "creating a stream");
        }
        pool.streams.push_back(s);
      }
    }
    *stream = pool.streams[pool.next++ % pool.streams.size()];
    if (!pool.free_events.empty()) {
      *event = pool.free_events.back();
      pool.free_events.pop_back();
    } else if (auto e = cudaEventCreateWithFlags(event, cudaEventDisableTiming); e != cudaSuccess) {
      return CudaError(e, "creating an event");
    }
    return absl::OkStatus();
  }

  void Release(int device, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mu);
    pools[device].free_events.push_back(event);
  }

  void EnablePeer(int dst, int src) {
    std::lock_guard<std::mutex> lock(mu);
    if (peer_done[dst][src]) return;
    peer_done[dst][src] = 1;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, dst, src) == cudaSuccess && can) {
      cudaSetDevice(dst);
      const cudaError_t e = cudaDeviceEnablePeerAccess(src, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        spdlog::warn("cuda: peer access {} -> {}: {}", dst, src, cudaGetErrorString(e));
      }
      cudaGetLastError();
    }
  }
};

namespace {

struct Copy {
  size_t index = 0;
  std::shared_ptr<CompletionFn> done;
  TransferRequest r;
  std::shared_ptr<const Segment> segment;   // keeps the segment's memory alive
  std::shared_ptr<rdma::MemoryRegion> pin;  // keeps the host range pinned
  void* dst = nullptr;
  const void* src = nullptr;
  bool verify_dst_after = false;  // checksum the (host) destination after the copy
  int device = -1;
  cudaEvent_t event = nullptr;
  bool warned = false;
};

class CudaChannel : public Channel {
 public:
  CudaChannel(std::shared_ptr<CudaTransport::Shared> shared, std::string peer_name)
      : shared_(std::move(shared)), peer_name_(std::move(peer_name)) {
    worker_ = std::thread([this] { Loop(); });
  }
  ~CudaChannel() override { Close(); }

  void Submit(std::vector<TransferRequest> requests, CompletionFn done) override {
    auto shared_done = std::make_shared<CompletionFn>(std::move(done));
    std::vector<Copy> copies;
    copies.reserve(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      copies.push_back({.index = i, .done = shared_done, .r = std::move(requests[i])});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        for (auto& c : copies) pending_.push_back(std::move(c));
        copies.clear();
      }
    }
    for (auto& c : copies) (*c.done)(c.index, absl::CancelledError("cuda channel closed"));
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
    std::deque<Copy> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(pending_);
    }
    for (auto& c : left) (*c.done)(c.index, absl::CancelledError("cuda channel closed"));
  }

  // Nothing to cut: copies are local. Pending requests still complete normally.
  void Disconnect() override {}

 private:
  // Resolves, checks and starts one copy; an error completes it at once.
  absl::Status Start(Copy& c) {
    const TransferRequest& r = c.r;
    if (absl::Now() >= r.deadline) return absl::DeadlineExceededError("cuda: deadline passed");
    if (r.local == nullptr || r.length == 0) {
      return absl::InvalidArgumentError("cuda: request needs a local buffer and a length");
    }
    const Access need = r.op == OpKind::kRead ? Access::kRead : Access::kWrite;
    const CudaTransportOptions& o = shared_->options;
    if (auto st = VerifyCapability(o.secret, r.capability, r.segment, r.offset, r.length, need);
        !st.ok()) {
      spdlog::warn("cuda: refused {} of {} [{}, +{}): {}", AccessName(need), r.segment, r.offset,
                   r.length, st.ToString());
      return st;
    }
    void* seg_addr = nullptr;
    ASSIGN_OR_RETURN(c.segment, o.segments->Resolve(r.segment, r.offset, r.length, &seg_addr));
    const bool seg_device = c.segment->kind == MemoryKind::kDevice;
    const Where local = Classify(r.local);
    c.dst = r.op == OpKind::kRead ? r.local : seg_addr;
    c.src = r.op == OpKind::kRead ? seg_addr : r.local;
    const bool dst_device = r.op == OpKind::kRead ? local.device : seg_device;
    const bool src_device = r.op == OpKind::kRead ? seg_device : local.device;
    const int seg_ordinal = c.segment->cuda_device;
    const int dst_ordinal = r.op == OpKind::kRead ? local.ordinal : seg_ordinal;
    const int src_ordinal = r.op == OpKind::kRead ? seg_ordinal : local.ordinal;

    if (r.checksum && !src_device && Checksum64(c.src, r.length) != *r.checksum) {
      return absl::DataLossError(
          StrCat("cuda: source of ", r.length, " bytes does not match its checksum"));
    }
    c.verify_dst_after = r.checksum && src_device && !dst_device;
    if (!dst_device && !src_device) {  // host ↔ host: nothing for a GPU to do
      std::memcpy(c.dst, c.src, r.length);
      return absl::OkStatus();
    }
    // The host side of a host ↔ device copy must be page-locked: ours (held by the request so
    // an Unregister cannot unpin it mid-copy), or pinned by its owner (cudaMallocHost).
    if (dst_device != src_device) {
      void* host = const_cast<void*>(dst_device ? c.src : c.dst);
      c.pin = shared_->pins->Find(host, r.length, 0);
      if (!c.pin && !Classify(host).pinned) {
        ASSIGN_OR_RETURN(c.pin, shared_->pins->Get(host, r.length, 0));
      }
    }
    c.device = dst_device ? dst_ordinal : src_ordinal;
    if (c.device < 0 || c.device >= shared_->devices) {
      return absl::InvalidArgumentError(StrCat("cuda: device ordinal ", c.device, " unknown"));
    }
    cudaStream_t stream;
    RETURN_IF_ERROR(shared_->Acquire(c.device, &stream, &c.event));
    cudaError_t e;
    if (dst_device && src_device && dst_ordinal != src_ordinal) {
      shared_->EnablePeer(dst_ordinal, src_ordinal);
      cudaSetDevice(c.device);
      e = cudaMemcpyPeerAsync(c.dst, dst_ordinal, c.src, src_ordinal, r.length, stream);
    } else {
      e = cudaMemcpyAsync(c.dst, c.src, r.length, cudaMemcpyDefault, stream);
    }
    if (e == cudaSuccess) e = cudaEventRecord(c.event, stream);
    if (e != cudaSuccess) {
      // A failed enqueue never started: the buffers are not touched.
      shared_->Release(c.device, c.event);
      c.event = nullptr;
      return CudaError(e, "cudaMemcpyAsync");
    }
    return absl::OkStatus();
  }

  void Finish(Copy& c, absl::Status st) {
    if (st.ok() && c.verify_dst_after && Checksum64(c.dst, c.r.length) != *c.r.checksum) {
      st = absl::DataLossError(
          StrCat("cuda: copy of ", c.r.length, " bytes does not match its checksum"));
    }
    if (c.event != nullptr) shared_->Release(c.device, c.event);
    c.event = nullptr;
    (*c.done)(c.index, st);
  }

  void Loop() {
    std::deque<Copy> running;
    while (true) {
      std::deque<Copy> fresh;
      bool stop;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop = closed_;
        if (!stop) fresh.swap(pending_);
      }
      for (Copy& c : fresh) {
        absl::Status st = Start(c);
        if (!st.ok() || c.event == nullptr) {
          Finish(c, st);
        } else {
          running.push_back(std::move(c));
        }
      }
      // Completions: any order (several streams); a finished event frees its request.
      const absl::Time now = absl::Now();
      for (auto it = running.begin(); it != running.end();) {
        cudaSetDevice(it->device);
        const cudaError_t e = cudaEventQuery(it->event);
        if (e == cudaErrorNotReady) {
          if (!it->warned && now > it->r.deadline + kLateWarning) {
            it->warned = true;
            spdlog::warn("cuda: a copy of {} bytes is still running {} after its deadline",
                         it->r.length, absl::FormatDuration(now - it->r.deadline));
          }
          ++it;
          continue;
        }
        Finish(*it, e == cudaSuccess ? absl::OkStatus() : CudaError(e, "copy failed"));
        it = running.erase(it);
      }
      if (stop && running.empty()) return;  // a running copy cannot be cancelled: wait for it
      if (!running.empty()) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoNanoseconds(kIdleWait),
                   [this] { return closed_ || !pending_.empty(); });
    }
  }

  std::shared_ptr<CudaTransport::Shared> shared_;
  const std::string peer_name_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;       // guarded by mu_
  std::deque<Copy> pending_;  // guarded by mu_
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<CudaTransport>> CudaTransport::Create(CudaTransportOptions options) {
  if (options.segments == nullptr) return absl::InvalidArgumentError("cuda: no segment registry");
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return absl::UnavailableError(StrCat(
        "cuda: no usable GPU (", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), ")"));
  }
  auto shared = std::make_shared<Shared>();
  shared->options = std::move(options);
  shared->devices = n;
  shared->pools.resize(n);
  shared->peer_done.assign(n, std::vector<char>(n, 0));
  const SegmentRegistry* segments = shared->options.segments;
  shared->pins = std::make_unique<rdma::MrCache>(
      [](void* addr, uint64_t len,
         uint32_t) -> absl::StatusOr<std::shared_ptr<rdma::MemoryRegion>> {
        const cudaError_t e = cudaHostRegister(addr, len, cudaHostRegisterPortable);
        if (e != cudaSuccess) return CudaError(e, StrCat("cudaHostRegister of ", len, " bytes"));
        return std::shared_ptr<rdma::MemoryRegion>(std::make_shared<PinnedRange>(addr, len));
      },
      rdma::MrCacheOptions{.max_bytes = shared->options.max_pinned_bytes},
      [segments](void* addr, uint64_t len) -> std::pair<void*, uint64_t> {
        auto seg = segments->FindContaining(addr, len);
        if (!seg) return {nullptr, 0};
        return {seg->base, seg->size};
      });
  rdma::MrCache* pins = shared->pins.get();
  shared->listener = segments->AddUnregisterListener([pins](const Segment& s) {
    if (s.kind == MemoryKind::kHost) pins->Invalidate(s.base, s.size);
  });
  return std::unique_ptr<CudaTransport>(new CudaTransport(std::move(shared)));
}

CudaTransport::~CudaTransport() = default;

absl::StatusOr<std::unique_ptr<Channel>> CudaTransport::Connect(const PeerSpec& peer,
                                                                const Endpoint& endpoint,
                                                                absl::Duration) {
  if (endpoint.kind != TransportKind::kCuda || endpoint.address != kCudaLocalAddress) {
    return absl::FailedPreconditionError(
        "cuda: only this process's segments are reachable (endpoint address 'local')");
  }
  return std::unique_ptr<Channel>(
      std::make_unique<CudaChannel>(shared_, peer.name.empty() ? "local" : peer.name));
}

absl::StatusOr<Segment> AllocateDeviceSegment(std::string name, uint64_t bytes, int device) {
  if (bytes == 0) return absl::InvalidArgumentError("cuda: device segment of 0 bytes");
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return CudaError(e, "set device");
  void* p = nullptr;
  if (auto e = cudaMalloc(&p, bytes); e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(StrCat("cuda: cudaMalloc of ", bytes, " bytes on device ",
                                               device, ": ", cudaGetErrorString(e)));
  }
  Segment s = Segment::Device(std::move(name), p, bytes, device);
  s.owned_other = std::shared_ptr<void>(p, [device](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  });
  return s;
}

}  // namespace strata::transfer
