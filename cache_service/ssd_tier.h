// SSD tier: preallocated slot files in one directory, read and written with O_DIRECT through
// io_uring, many requests per submission.
//
// Layout: `slots-<n>.dat`, each holding `slots_per_file` slots of `slot_bytes`; slot s lives in
// file s / slots_per_file at offset (s % slots_per_file) * slot_bytes. Files are created and
// fallocate()d when the tier opens, so writes never hit ENOSPC later; a disk too small fails
// Open() with ResourceExhausted. The tier stores raw payloads: which block a slot holds, its
// length and checksum live in the index (block_index.h), and the store verifies the checksum of
// every read.
//
// Durability: Write* only submits and waits for the I/O; Sync() fdatasync()s every file written
// since the last Sync(). The store calls Sync() before it records the slot in the index.
//
// Thread safety: all methods may be called concurrently (a small pool of rings, each behind its
// own mutex).
#pragma once

#include <liburing.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "cache_service/slot_allocator.h"
#include "cache_service/tier.h"

namespace strata::cache {

class SsdTier final : public Tier {
 public:
  struct Options {
    std::string dir;
    uint64_t slot_bytes = 4 << 20;  // multiple of 4096
    uint64_t capacity_bytes = 8ull << 30;
    uint64_t max_bytes = 0;  // 0: capacity_bytes (the files preallocated)
    uint32_t slots_per_file = 256;
    uint32_t queue_depth = 64;
    uint32_t rings = 4;
  };

  // One I/O: `length` bytes between `buffer` and the start of `slot`. Buffers that are not
  // 4096-aligned go through a bounce buffer; aligned ones (DRAM arena slots) go direct. The
  // transfer length is rounded up to 4096, so an aligned buffer must have that much room.
  struct Io {
    SlotId slot = 0;
    std::byte* buffer = nullptr;
    uint64_t length = 0;
  };

  static absl::StatusOr<std::unique_ptr<SsdTier>> Open(const Options& options);
  ~SsdTier() override;

  TierKind kind() const override { return TierKind::kSsd; }
  uint64_t slot_bytes() const override { return options_.slot_bytes; }
  uint32_t capacity_slots() const override { return slots_.capacity(); }
  uint32_t max_slots() const override { return slots_.max_slots(); }
  uint32_t used_slots() const override { return slots_.used(); }
  absl::StatusOr<SlotId> Allocate() override { return slots_.Allocate(); }
  void Free(SlotId slot) override { slots_.Free(slot); }
  absl::Status SetCapacitySlots(uint32_t slots) override { return slots_.SetCapacity(slots); }
  // Marks `slot` used (warm restart re-claims the slots the index names).
  absl::Status Claim(SlotId slot) { return slots_.Claim(slot); }

  // Per-request statuses, parallel to `ios`. A short read (a truncated file) is DataLoss.
  // `on_read(i, status)`, when set, runs for each request as soon as it completes (on the calling
  // thread, while later reads are still in flight), so a caller can verify block i while the
  // disk works on the rest: the bytes are in ios[i].buffer by then.
  using ReadDone = std::function<void(size_t, const absl::Status&)>;
  std::vector<absl::Status> ReadBatch(std::span<const Io> ios, const ReadDone& on_read = {});
  std::vector<absl::Status> WriteBatch(std::span<const Io> ios);
  // fdatasync()s every file written since the last Sync().
  absl::Status Sync();

  bool direct_io() const { return direct_io_; }
  const std::string& dir() const { return options_.dir; }
  // The path of the file holding `slot` and the slot's offset in it (tests, verify tooling).
  std::pair<std::string, uint64_t> SlotFile(SlotId slot) const;

 private:
  struct Ring {
    std::mutex mu;
    io_uring ring ABSL_GUARDED_BY(mu);
  };
  SsdTier(Options options, uint32_t max_slots, uint32_t capacity_slots);
  std::vector<absl::Status> Submit(std::span<const Io> ios, bool write,
                                   const ReadDone* on_read = nullptr);
  Ring& PickRing();

  const Options options_;
  SlotAllocator slots_;
  std::vector<int> fds_;
  bool direct_io_ = true;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::mutex sync_mu_;
  std::mutex dirty_mu_;
  std::vector<bool> dirty_ ABSL_GUARDED_BY(dirty_mu_);
};

}  // namespace strata::cache
