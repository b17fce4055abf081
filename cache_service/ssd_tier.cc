#include "cache_service/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {
namespace {

constexpr uint64_t kAlign = 4096;

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

AlignedBuffer AllocAligned(uint64_t bytes) {
  return AlignedBuffer(static_cast<std::byte*>(std::aligned_alloc(kAlign, RoundUp(bytes))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(const Options& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("ssd tier needs a directory");
  if (options.slot_bytes == 0 || options.slot_bytes % kAlign != 0) {
    return absl::InvalidArgumentError(
        StrCat("ssd slot size ", options.slot_bytes, " is not a positive multiple of 4096"));
  }
  if (options.slots_per_file == 0 || options.rings == 0 || options.queue_depth == 0) {
    return absl::InvalidArgumentError("ssd slots_per_file, rings and queue_depth must be > 0");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::UnavailableError(StrCat("creating ssd dir ", options.dir, ": ", ec.message()));
  }
  const uint64_t max_bytes = std::max(options.max_bytes, options.capacity_bytes);
  const uint64_t max_slots = max_bytes / options.slot_bytes;
  if (max_slots > UINT32_MAX) return absl::InvalidArgumentError("ssd tier has too many slots");
  std::unique_ptr<SsdTier> tier(
      new SsdTier(options, static_cast<uint32_t>(max_slots),
                  static_cast<uint32_t>(options.capacity_bytes / options.slot_bytes)));
  const uint64_t num_files = (max_slots + options.slots_per_file - 1) / options.slots_per_file;
  for (uint64_t f = 0; f < num_files; ++f) {
    const std::string path = StrCat(options.dir, "/slots-", f, ".dat");
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;
    int fd = open(path.c_str(), flags | (tier->direct_io_ ? O_DIRECT : 0), 0644);
    if (fd < 0 && errno == EINVAL && tier->direct_io_) {
      // tmpfs and some overlay filesystems refuse O_DIRECT; buffered I/O still works.
      spdlog::warn("ssd tier: {} does not support O_DIRECT; using buffered I/O", options.dir);
      tier->direct_io_ = false;
      fd = open(path.c_str(), flags, 0644);
    }
    if (fd < 0) return ErrnoToStatus(errno, StrCat("opening slot file ", path));
    tier->fds_.push_back(fd);
    const uint64_t file_slots =
        std::min<uint64_t>(options.slots_per_file, max_slots - f * options.slots_per_file);
    const off_t size = static_cast<off_t>(file_slots * options.slot_bytes);
    struct stat st {};
    if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, StrCat("stat ", path));
    // Only allocate what is missing: a truncated slot file stays truncated until it is
    // rewritten, so its blocks read short and are quarantined instead of reading zeros.
    if (st.st_size == 0) {
      if (const int err = posix_fallocate(fd, 0, size); err != 0) {
        return ErrnoToStatus(err, StrCat("preallocating ", size, " bytes for slot file ", path));
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(tier->dirty_mu_);
    tier->dirty_.assign(num_files, false);
  }
  for (uint32_t r = 0; r < options.rings; ++r) {
    auto ring = std::make_unique<Ring>();
    std::lock_guard<std::mutex> lock(ring->mu);
    if (const int err = io_uring_queue_init(options.queue_depth, &ring->ring, 0); err < 0) {
      return ErrnoToStatus(-err, "io_uring_queue_init for the ssd tier");
    }
    tier->rings_.push_back(std::move(ring));
  }
  return tier;
}

SsdTier::SsdTier(Options options, uint32_t max_slots, uint32_t capacity_slots)
    : options_(std::move(options)), slots_(max_slots, capacity_slots) {}

SsdTier::~SsdTier() {
  for (auto& ring : rings_) {
    std::lock_guard<std::mutex> lock(ring->mu);
    io_uring_queue_exit(&ring->ring);
  }
  for (int fd : fds_) close(fd);
}

std::pair<std::string, uint64_t> SsdTier::SlotFile(SlotId slot) const {
  return {StrCat(options_.dir, "/slots-", slot / options_.slots_per_file, ".dat"),
          uint64_t{slot % options_.slots_per_file} * options_.slot_bytes};
}

SsdTier::Ring& SsdTier::PickRing() {
  // Spread threads over the rings; a busy ring is skipped when another is free.
  const size_t start = std::hash<std::thread::id>()(std::this_thread::get_id()) % rings_.size();
  for (size_t i = 0; i < rings_.size(); ++i) {
    Ring& r = *rings_[(start + i) % rings_.size()];
    if (r.mu.try_lock()) return r;
  }
  Ring& r = *rings_[start];
  r.mu.lock();
  return r;
}

std::vector<absl::Status> SsdTier::ReadBatch(std::span<const Io> ios, const ReadDone& on_read) {
  return Submit(ios, false, on_read ? &on_read : nullptr);
}

std::vector<absl::Status> SsdTier::WriteBatch(std::span<const Io> ios) {
  std::vector<absl::Status> results = Submit(ios, true);
  // Marked after completion, so a Sync() that clears the mark covers the write.
  std::lock_guard<std::mutex> lock(dirty_mu_);
  for (const Io& io : ios) {
    if (io.slot < slots_.max_slots()) dirty_[io.slot / options_.slots_per_file] = true;
  }
  return results;
}

std::vector<absl::Status> SsdTier::Submit(std::span<const Io> ios, bool write,
                                          const ReadDone* on_read) {
  std::vector<absl::Status> results(ios.size());
  // Bounce buffers for unaligned callers.
  std::vector<AlignedBuffer> bounce(ios.size());
  std::vector<std::byte*> bufs(ios.size());
  for (size_t i = 0; i < ios.size(); ++i) {
    const Io& io = ios[i];
    if (io.slot >= slots_.max_slots() || io.length > options_.slot_bytes) {
      results[i] = absl::InvalidArgumentError(
          StrCat("ssd io out of range: slot ", io.slot, " length ", io.length));
      continue;
    }
    const bool aligned = reinterpret_cast<uintptr_t>(io.buffer) % kAlign == 0;
    if (aligned && io.length % kAlign == 0) {
      bufs[i] = io.buffer;
    } else {
      bounce[i] = AllocAligned(io.length);
      if (!bounce[i]) {
        results[i] = absl::ResourceExhaustedError("no memory for an ssd bounce buffer");
        continue;
      }
      if (write) {
        std::memcpy(bounce[i].get(), io.buffer, io.length);
        std::memset(bounce[i].get() + io.length, 0, RoundUp(io.length) - io.length);
      }
      bufs[i] = bounce[i].get();
    }
  }

  Ring& ring = PickRing();
  std::vector<size_t> completed;                  // reads whose callback is due
  std::vector<bool> reported(ios.size(), false);  // callback already ran
  size_t next = 0;
  size_t inflight = 0;
  std::vector<uint64_t> done_bytes(ios.size(), 0);
  while (next < ios.size() || inflight > 0) {
    // Fill the submission queue, then submit the whole batch with one system call.
    while (next < ios.size() && inflight < options_.queue_depth) {
      const size_t i = next++;
      if (!results[i].ok() || ios[i].length == 0) continue;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring.ring);
      if (sqe == nullptr) {
        --next;
        break;
      }
      const auto [file, offset] =
          std::pair{ios[i].slot / options_.slots_per_file,
                    uint64_t{ios[i].slot % options_.slots_per_file} * options_.slot_bytes};
      const unsigned len = static_cast<unsigned>(RoundUp(ios[i].length));
      if (write) {
        io_uring_prep_write(sqe, fds_[file], bufs[i], len, offset);
      } else {
        io_uring_prep_read(sqe, fds_[file], bufs[i], len, offset);
      }
      io_uring_sqe_set_data64(sqe, i);
      ++inflight;
    }
    if (inflight == 0) break;
    int rc = io_uring_submit_and_wait(&ring.ring, 1);
    if (rc < 0 && rc != -EINTR) {
      ring.mu.unlock();
      const absl::Status st = ErrnoToStatus(-rc, "io_uring_submit");
      for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].ok()) results[i] = st;
        if (on_read != nullptr && !reported[i]) (*on_read)(i, results[i]);
      }
      return results;
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring.ring, head, cqe) {
      const size_t i = io_uring_cqe_get_data64(cqe);
      ++seen;
      --inflight;
      if (cqe->res < 0) {
        results[i] = ErrnoToStatus(
            -cqe->res, StrCat(write ? "writing" : "reading", " ssd slot ", ios[i].slot));
      } else if (static_cast<uint64_t>(cqe->res) < ios[i].length) {
        results[i] = absl::DataLossError(StrCat("short ", write ? "write" : "read", " of ssd slot ",
                                                ios[i].slot, ": ", cqe->res, " of ", ios[i].length,
                                                " bytes (slot file truncated?)"));
      }
      if (on_read != nullptr) completed.push_back(i);
    }
    io_uring_cq_advance(&ring.ring, seen);
    // Refill the queue before the callbacks run, so the disk stays busy meanwhile.
    if (on_read != nullptr && !completed.empty()) {
      while (next < ios.size() && inflight < options_.queue_depth) {
        const size_t i = next;
        if (!results[i].ok() || ios[i].length == 0) {
          ++next;
          if (results[i].ok()) completed.push_back(i);  // nothing to read
          continue;
        }
        io_uring_sqe* sqe = io_uring_get_sqe(&ring.ring);
        if (sqe == nullptr) break;
        ++next;
        io_uring_prep_read(sqe, fds_[ios[i].slot / options_.slots_per_file], bufs[i],
                           static_cast<unsigned>(RoundUp(ios[i].length)),
                           uint64_t{ios[i].slot % options_.slots_per_file} * options_.slot_bytes);
        io_uring_sqe_set_data64(sqe, i);
        ++inflight;
      }
      io_uring_submit(&ring.ring);
      for (size_t i : completed) {
        if (results[i].ok() && bounce[i]) {
          std::memcpy(ios[i].buffer, bounce[i].get(), ios[i].length);
          bounce[i].reset();
        }
        (*on_read)(i, results[i]);
        reported[i] = true;
      }
      completed.clear();
    }
  }
  ring.mu.unlock();
  if (!write) {
    for (size_t i = 0; i < ios.size(); ++i) {
      if (results[i].ok() && bounce[i]) std::memcpy(ios[i].buffer, bounce[i].get(), ios[i].length);
      if (on_read != nullptr && !reported[i]) (*on_read)(i, results[i]);
    }
  }
  return results;
}

absl::Status SsdTier::Sync() {
  // One Sync() at a time: a caller whose writes another Sync() already picked up waits here
  // until that fdatasync() has finished.
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  std::vector<size_t> files;
  {
    std::lock_guard<std::mutex> lock(dirty_mu_);
    for (size_t f = 0; f < dirty_.size(); ++f) {
      if (dirty_[f]) files.push_back(f);
      dirty_[f] = false;
    }
  }
  for (size_t f : files) {
    if (fdatasync(fds_[f]) != 0) {
      const int err = errno;
      std::lock_guard<std::mutex> lock(dirty_mu_);
      dirty_[f] = true;
      return ErrnoToStatus(err, StrCat("fdatasync of ssd slot file ", f));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::cache
