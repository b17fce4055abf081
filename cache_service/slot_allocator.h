// Free-slot bookkeeping shared by the tiers: a set of free slot ids in [0, max_slots) and a
// logical capacity that bounds how many may be in use. The lowest free id is handed out first,
// so a lightly used tier touches little memory or disk.
//
// Thread-safe (one internal mutex).
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_service/tier.h"
#include "common/check.h"
#include "common/strings.h"

namespace strata::cache {

class SlotAllocator {
 public:
  SlotAllocator(uint32_t max_slots, uint32_t capacity_slots)
      : max_slots_(max_slots), capacity_(capacity_slots) {
    for (uint32_t i = 0; i < max_slots; ++i) free_.insert(free_.end(), i);
  }

  absl::StatusOr<SlotId> Allocate() {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ >= capacity_ || free_.empty()) {
      return absl::ResourceExhaustedError(
          StrCat("all ", capacity_, " slots of the tier are in use"));
    }
    const SlotId slot = *free_.begin();
    free_.erase(free_.begin());
    ++used_;
    return slot;
  }

  // Takes a specific slot (warm restart re-claims the slots the index names). FailedPrecondition
  // if it is out of range or already taken.
  absl::Status Claim(SlotId slot) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot >= max_slots_ || free_.erase(slot) == 0) {
      return absl::FailedPreconditionError(StrCat("slot ", slot, " is out of range or taken"));
    }
    ++used_;
    return absl::OkStatus();
  }

  void Free(SlotId slot) {
    std::lock_guard<std::mutex> lock(mu_);
    STRATA_CHECK(slot < max_slots_, "slot out of range");
    STRATA_CHECK(free_.insert(slot).second, "slot freed twice");
    --used_;
  }

  absl::Status SetCapacity(uint32_t slots) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots > max_slots_) {
      return absl::InvalidArgumentError(
          StrCat("capacity of ", slots, " slots exceeds the maximum of ", max_slots_));
    }
    if (slots < used_) {
      return absl::FailedPreconditionError(
          StrCat(used_, " slots are in use; cannot shrink to ", slots));
    }
    capacity_ = slots;
    return absl::OkStatus();
  }

  std::vector<SlotId> FreeSlots() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {free_.begin(), free_.end()};
  }

  uint32_t max_slots() const { return max_slots_; }
  uint32_t capacity() const {
    std::lock_guard<std::mutex> lock(mu_);
    return capacity_;
  }
  uint32_t used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

 private:
  const uint32_t max_slots_;
  mutable std::mutex mu_;
  std::set<SlotId> free_ ABSL_GUARDED_BY(mu_);
  uint32_t capacity_ ABSL_GUARDED_BY(mu_);
  uint32_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::cache
