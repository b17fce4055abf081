// A storage tier of the cache server: a fixed number of equal-size block slots.
//
// The block store (block_store.h) owns one Tier per configured level (GPU, DRAM, SSD) and does
// all bookkeeping (which block lives in which slot); a Tier only allocates slots and moves bytes.
//
// Capacity is logical: `capacity_slots()` can be lowered or raised at run time (up to
// `max_slots()`); the store evicts until the used slots fit before it lowers it.
//
// Thread safety: every method is safe to call concurrently. Reads and writes of distinct slots
// run in parallel; the caller guarantees nobody writes a slot while another thread reads it
// (the store's leases do).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::cache {

enum class TierKind : uint8_t { kGpu = 1, kDram = 2, kSsd = 3 };  // = proto v1::Tier values

std::string_view TierName(TierKind kind);

using SlotId = uint32_t;

class Tier {
 public:
  virtual ~Tier() = default;

  virtual TierKind kind() const = 0;
  // Bytes per slot: the largest payload one block may have.
  virtual uint64_t slot_bytes() const = 0;
  // Slots that may be in use now (the configured capacity).
  virtual uint32_t capacity_slots() const = 0;
  // Upper bound for SetCapacitySlots().
  virtual uint32_t max_slots() const = 0;
  virtual uint32_t used_slots() const = 0;

  // A free slot; ResourceExhausted when capacity_slots() are in use.
  virtual absl::StatusOr<SlotId> Allocate() = 0;
  // Returns `slot` to the free list. Freeing a slot twice is a bug (aborts).
  virtual void Free(SlotId slot) = 0;
  // InvalidArgument above max_slots(), FailedPrecondition if more slots are in use than
  // `slots` (evict first).
  virtual absl::Status SetCapacitySlots(uint32_t slots) = 0;
};

// A tier whose slots are memory the process can address directly (DRAM, and a GPU pool through
// its device pointer). Slot `s` occupies [s * slot_bytes(), (s + 1) * slot_bytes()).
class MemoryTier : public Tier {
 public:
  // The slot's bytes; valid for the tier's lifetime.
  virtual std::span<std::byte> SlotSpan(SlotId slot) = 0;
  virtual uint64_t SlotOffset(SlotId slot) const { return uint64_t{slot} * slot_bytes(); }
};

// GPU tier (how a device tier slots in; the CUDA backend adds it): `GpuTier : MemoryTier` over one
// device allocation of max_slots() * slot_bytes(), registered as transfer segment "gpu" (CUDA IPC
// handle for same-host workers, peer copy otherwise). What the store needs from it:
//   - slot bookkeeping exactly as here (Allocate/Free/capacity; SlotAllocator does it);
//   - SlotSpan() returns *device* addresses: the store must never dereference them on the host.
//     The places that touch bytes today are Commit's checksum, Verify, and the DRAM <-> SSD copies;
//     for the GPU tier they become a device checksum (a kernel over the slot) and GPU <-> DRAM
//     copies through the transfer engine's cuda transport (cudaMemcpyAsync from/to pinned DRAM
//     slots), run outside the store lock like the SSD copies (reserve + mark under the lock, copy,
//     commit under the lock: store_impl.h);
//   - eviction treats it as the level above DRAM: demotion GPU -> DRAM takes the place of
//     DRAM -> SSD, with the same watermarks and `dirty` victims (EvictLocked/ShrinkTo);
//   - residency is volatile (like DRAM): the index records the slot, Open() clears it.
// Until then TierOf(kGpu) is null and the store reports the tier as "not configured".

}  // namespace strata::cache
