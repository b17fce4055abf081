#include "cache_service/dram_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/status.h"

namespace strata::cache {

std::string_view TierName(TierKind kind) {
  switch (kind) {
    case TierKind::kGpu:
      return "gpu";
    case TierKind::kDram:
      return "dram";
    case TierKind::kSsd:
      return "ssd";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<DramTier>> DramTier::Create(const Options& options) {
  if (options.slot_bytes == 0 || options.slot_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(
        StrCat("dram slot size ", options.slot_bytes, " is not a positive multiple of 4096"));
  }
  const uint64_t max_bytes = std::max(options.max_bytes, options.capacity_bytes);
  const uint64_t max_slots = max_bytes / options.slot_bytes;
  if (max_slots > UINT32_MAX) return absl::InvalidArgumentError("dram tier has too many slots");
  const uint64_t arena_bytes = std::max<uint64_t>(max_slots, 1) * options.slot_bytes;
  const int fd = memfd_create(options.name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "memfd_create for the dram tier");
  if (ftruncate(fd, static_cast<off_t>(arena_bytes)) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, StrCat("sizing the dram arena to ", arena_bytes, " bytes"));
  }
  void* base = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, "mapping the dram arena");
  }
  const auto capacity_slots = static_cast<uint32_t>(options.capacity_bytes / options.slot_bytes);
  auto tier = std::unique_ptr<DramTier>(
      new DramTier(fd, static_cast<std::byte*>(base), arena_bytes, options.slot_bytes,
                   static_cast<uint32_t>(max_slots), capacity_slots, options.prefault));
  if (options.prefault)
    tier->Prefault(0, std::min<uint32_t>(capacity_slots, max_slots), /*empty=*/true);
  return tier;
}

DramTier::DramTier(int fd, std::byte* base, uint64_t arena_bytes, uint64_t slot_bytes,
                   uint32_t max_slots, uint32_t capacity_slots, bool prefault)
    : fd_(fd),
      base_(base),
      arena_bytes_(arena_bytes),
      slot_bytes_(slot_bytes),
      prefault_(prefault),
      slots_(max_slots, capacity_slots) {}

void DramTier::Prefault(uint32_t first, uint32_t end, bool empty) {
  if (end <= first) return;
  std::byte* const from = base_ + SlotOffset(first);
  const uint64_t bytes = uint64_t{end - first} * slot_bytes_;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
  if (madvise(from, bytes, MADV_POPULATE_WRITE) == 0 || !empty) return;
  // Older kernels, and only while no slot holds a block: a write per page backs and maps it.
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t off = 0; off < bytes; off += static_cast<uint64_t>(page)) {
    *reinterpret_cast<volatile char*>(from + off) = 0;
  }
}

DramTier::~DramTier() {
  munmap(base_, arena_bytes_);
  close(fd_);
}

void DramTier::Free(SlotId slot) { slots_.Free(slot); }

absl::Status DramTier::SetCapacitySlots(uint32_t slots) {
  const uint32_t before = slots_.capacity();
  RETURN_IF_ERROR(slots_.SetCapacity(slots));
  if (prefault_ && slots > before) Prefault(before, slots, /*empty=*/false);
  // Freed slots keep their pages (re-faulting them on every write would cost more than it saves);
  // a smaller capacity is when memory goes back: punch out every free slot.
  for (SlotId s : slots_.FreeSlots()) {
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(SlotOffset(s)),
              static_cast<off_t>(slot_bytes_));
  }
  return absl::OkStatus();
}

std::span<std::byte> DramTier::SlotSpan(SlotId slot) {
  STRATA_CHECK(slot < slots_.max_slots(), "dram slot out of range");
  return {base_ + SlotOffset(slot), slot_bytes_};
}

std::string DramTier::shm_path() const { return StrCat("/proc/", getpid(), "/fd/", fd_); }

}  // namespace strata::cache
