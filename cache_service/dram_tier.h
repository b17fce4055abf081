// DRAM tier: one arena of block slots in a memfd, mapped into this process and shareable with
// same-host clients (they map the same memfd: `shm_path()`), which is what the transfer engine's
// shm transport does. The arena is sized for `max_bytes` up front; pages are only backed by
// memory once touched, so a larger maximum costs address space, not RAM. Changing the capacity
// punches the free slots out of the memfd, which returns their memory.
//
// Prefault (Options::prefault): the slots within the capacity are backed and mapped at Create()
// (and when the capacity grows), so neither the first write of a block nor the server's first
// checksum of it takes a page fault per 4 KiB on the data path. It costs the capacity in RAM
// from the start, which the arena would cost anyway once it fills.
#pragma once

#include <memory>
#include <string>

#include "cache_service/slot_allocator.h"
#include "cache_service/tier.h"

namespace strata::cache {

class DramTier final : public MemoryTier {
 public:
  struct Options {
    uint64_t slot_bytes = 4 << 20;  // multiple of 4096
    uint64_t capacity_bytes = 1ull << 30;
    uint64_t max_bytes = 0;  // 0: capacity_bytes
    std::string name = "strata-dram";
    bool prefault = false;  // back + map the capacity's pages now (see above)
  };

  // Creates the memfd and maps it. InvalidArgument for bad sizes; the errno's status when the
  // memfd cannot be created or mapped.
  static absl::StatusOr<std::unique_ptr<DramTier>> Create(const Options& options);
  ~DramTier() override;

  TierKind kind() const override { return TierKind::kDram; }
  uint64_t slot_bytes() const override { return slot_bytes_; }
  uint32_t capacity_slots() const override { return slots_.capacity(); }
  uint32_t max_slots() const override { return slots_.max_slots(); }
  uint32_t used_slots() const override { return slots_.used(); }
  absl::StatusOr<SlotId> Allocate() override { return slots_.Allocate(); }
  void Free(SlotId slot) override;
  absl::Status SetCapacitySlots(uint32_t slots) override;
  std::span<std::byte> SlotSpan(SlotId slot) override;

  int memfd() const { return fd_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  std::byte* base() const { return base_; }
  // A path another process of the same user can open to map the arena.
  std::string shm_path() const;

 private:
  DramTier(int fd, std::byte* base, uint64_t arena_bytes, uint64_t slot_bytes, uint32_t max_slots,
           uint32_t capacity_slots, bool prefault);
  // Backs and maps slots [first, end). `empty`: no slot holds data yet, so pages may be written
  // to (the fallback when the kernel lacks MADV_POPULATE_WRITE); otherwise only madvise is used.
  void Prefault(uint32_t first, uint32_t end, bool empty);

  const int fd_;
  std::byte* const base_;
  const uint64_t arena_bytes_;
  const uint64_t slot_bytes_;
  const bool prefault_;
  SlotAllocator slots_;
};

}  // namespace strata::cache
