// Segments: named, registered memory regions that peers may read and write remotely.
//
// A segment is a range of memory [base, base + size) with a name that is unique within one
// process's SegmentRegistry (a DRAM arena, a GPU pool, a worker's KV pool). Remote peers name a
// segment and an offset; the owner resolves the name through its registry, checks the bounds
// (and the capability, transfer/capability.h) and touches the bytes.
//
// Lifecycle:
//   1. The owner allocates memory itself (Segment::Host / Segment::Device) or lets
//      CreateSharedHostSegment() allocate a memfd-backed region that same-host peers can map
//      (the shm transport receives the memfd over a unix socket and mmaps it).
//   2. registry.Register(segment) makes it reachable; from then on the TransferServer serves it.
//   3. registry.Unregister(name) makes it unreachable for new requests. Requests that already
//      resolved the segment hold a reference (std::shared_ptr<const Segment>), and an owned
//      mapping (SharedHostMemory) is only unmapped when the last reference is gone, so an
//      in-flight request never touches unmapped memory. Memory the caller owns (Segment::Host)
//      must stay valid until every request that resolved it has completed; the simple rule is
//      "stop the TransferServer, or wait for your batches, before freeing".
//
// Thread safety: SegmentRegistry is thread-safe. Segment values are immutable once registered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::transfer {

enum class MemoryKind : uint8_t { kHost = 0, kDevice = 1 };

std::string_view MemoryKindName(MemoryKind kind);

// Owns a memfd-backed shared mapping; unmaps and closes on destruction. Created by
// CreateSharedHostSegment(); shared by the Segment and every in-flight request that uses it.
class SharedHostMemory {
 public:
  SharedHostMemory(int memfd, void* base, uint64_t size)
      : memfd_(memfd), base_(base), size_(size) {}
  ~SharedHostMemory();
  SharedHostMemory(const SharedHostMemory&) = delete;
  SharedHostMemory& operator=(const SharedHostMemory&) = delete;

  int memfd() const { return memfd_; }
  void* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  int memfd_;
  void* base_;
  uint64_t size_;
};

struct Segment {
  std::string name;      // unique per registry; at most 255 bytes
  void* base = nullptr;  // host address, or device address for kDevice
  uint64_t size = 0;     // bytes
  MemoryKind kind = MemoryKind::kHost;
  int cuda_device = -1;  // kDevice: the CUDA ordinal that owns `base`
  int memfd = -1;        // host segments created for sharing: the memfd; else -1
  // Keeps a memfd mapping alive while the segment or an in-flight request refers to it.
  std::shared_ptr<SharedHostMemory> owned;
  // Keeps other owned memory alive the same way (cuda::AllocateDeviceSegment's cudaMalloc).
  std::shared_ptr<void> owned_other;

  // A host segment over memory the caller owns (and must keep alive, see above).
  static Segment Host(std::string name, void* base, uint64_t size);
  // A device segment over memory the caller owns (cudaMalloc'd on `cuda_device`).
  static Segment Device(std::string name, void* base, uint64_t size, int cuda_device);

  // True when [offset, offset + length) lies inside the segment (overflow-safe). length 0 is
  // refused: a zero-length transfer is a caller bug.
  bool Contains(uint64_t offset, uint64_t length) const;
};

// Allocates `size` bytes of zeroed host memory backed by a memfd (memfd_create + ftruncate +
// mmap MAP_SHARED), so the shm transport can hand the fd to a same-host peer. The memory is
// released when the returned Segment (and every copy of it) is gone.
// Errors: InvalidArgument for an empty/too long name or size 0; ResourceExhausted when memory
// cannot be had; Internal for other system failures.
absl::StatusOr<Segment> CreateSharedHostSegment(std::string name, uint64_t size);

// Name → segment. Thread-safe.
class SegmentRegistry {
 public:
  SegmentRegistry() = default;
  SegmentRegistry(const SegmentRegistry&) = delete;
  SegmentRegistry& operator=(const SegmentRegistry&) = delete;

  // AlreadyExists if the name is taken; InvalidArgument for an empty or >255-byte name, a null
  // base or size 0.
  absl::Status Register(Segment segment);

  // NotFound if no such segment. Requests that already resolved it keep their reference.
  absl::Status Unregister(std::string_view name);

  // NotFound if no such segment.
  absl::StatusOr<std::shared_ptr<const Segment>> Lookup(std::string_view name) const;

  // Looks up `name` and checks [offset, offset + length) against its bounds: NotFound for an
  // unknown segment, OutOfRange for a range outside it. On success `*address` is base + offset
  // and the returned reference keeps the segment's memory mapped.
  absl::StatusOr<std::shared_ptr<const Segment>> Resolve(std::string_view name, uint64_t offset,
                                                         uint64_t length, void** address) const;

  std::vector<std::shared_ptr<const Segment>> List() const;

  // The host segment that contains [addr, addr + length), if any (rdma registers whole local
  // segments rather than each block).
  std::shared_ptr<const Segment> FindContaining(const void* addr, uint64_t length) const;

  // `fn` is called with every segment Unregister removes, after the removal, without the
  // registry's lock (rdma drops its memory registrations of it there). Returns an id for
  // RemoveUnregisterListener. Const: a listener observes the registry, it does not change it.
  int AddUnregisterListener(std::function<void(const Segment&)> fn) const;
  void RemoveUnregisterListener(int id) const;

 private:
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Segment>> segments_;  // guarded by mu_
  mutable std::mutex listeners_mu_;
  mutable std::vector<std::pair<int, std::function<void(const Segment&)>>>
      listeners_;                  // guarded by listeners_mu_
  mutable int next_listener_ = 1;  // guarded by listeners_mu_
};

}  // namespace strata::transfer
