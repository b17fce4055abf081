#include "transfer/segment.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/status.h"
#include "common/strings.h"

namespace strata::transfer {

std::string_view MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kDevice ? "device" : "host";
}

SharedHostMemory::~SharedHostMemory() {
  if (base_ != nullptr) munmap(base_, size_);
  if (memfd_ >= 0) close(memfd_);
}

Segment Segment::Host(std::string name, void* base, uint64_t size) {
  Segment s;
  s.name = std::move(name);
  s.base = base;
  s.size = size;
  return s;
}

Segment Segment::Device(std::string name, void* base, uint64_t size, int cuda_device) {
  Segment s = Host(std::move(name), base, size);
  s.kind = MemoryKind::kDevice;
  s.cuda_device = cuda_device;
  return s;
}

bool Segment::Contains(uint64_t offset, uint64_t length) const {
  return length > 0 && offset <= size && length <= size - offset;
}

namespace {
absl::Status CheckName(std::string_view name) {
  if (name.empty() || name.size() > 255) {
    return absl::InvalidArgumentError(
        StrCat("segment name must be 1..255 bytes, got ", name.size()));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<Segment> CreateSharedHostSegment(std::string name, uint64_t size) {
  RETURN_IF_ERROR(CheckName(name));
  if (size == 0) return absl::InvalidArgumentError("shared segment of size 0");
  const int fd = memfd_create(StrCat("strata-", name).c_str(), MFD_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, StrCat("memfd_create for segment ", name));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, StrCat("sizing segment ", name, " to ", size, " bytes"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, StrCat("mapping segment ", name));
  }
  Segment s = Segment::Host(std::move(name), base, size);
  s.memfd = fd;
  s.owned = std::make_shared<SharedHostMemory>(fd, base, size);
  return s;
}

absl::Status SegmentRegistry::Register(Segment segment) {
  RETURN_IF_ERROR(CheckName(segment.name));
  if (segment.base == nullptr || segment.size == 0) {
    return absl::InvalidArgumentError(StrCat("segment ", segment.name, ": null base or size 0"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = segments_.try_emplace(segment.name, nullptr);
  if (!inserted) {
    return absl::AlreadyExistsError(StrCat("segment ", segment.name, " is already registered"));
  }
  it->second = std::make_shared<const Segment>(std::move(segment));
  return absl::OkStatus();
}

absl::Status SegmentRegistry::Unregister(std::string_view name) {
  std::shared_ptr<const Segment> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(std::string(name));
    if (it == segments_.end()) return absl::NotFoundError(StrCat("no segment ", name));
    removed = std::move(it->second);
    segments_.erase(it);
  }
  std::vector<std::function<void(const Segment&)>> listeners;
  {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    for (const auto& [id, fn] : listeners_) listeners.push_back(fn);
  }
  for (const auto& fn : listeners) fn(*removed);
  return absl::OkStatus();
}

std::shared_ptr<const Segment> SegmentRegistry::FindContaining(const void* addr,
                                                               uint64_t length) const {
  const auto lo = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, s] : segments_) {
    const auto base = reinterpret_cast<uintptr_t>(s->base);
    if (s->kind == MemoryKind::kHost && base <= lo && lo - base <= s->size &&
        length <= s->size - (lo - base)) {
      return s;
    }
  }
  return nullptr;
}

int SegmentRegistry::AddUnregisterListener(std::function<void(const Segment&)> fn) const {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  const int id = next_listener_++;
  listeners_.emplace_back(id, std::move(fn));
  return id;
}

void SegmentRegistry::RemoveUnregisterListener(int id) const {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  std::erase_if(listeners_, [id](const auto& l) { return l.first == id; });
}

absl::StatusOr<std::shared_ptr<const Segment>> SegmentRegistry::Lookup(
    std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = segments_.find(std::string(name));
  if (it == segments_.end()) return absl::NotFoundError(StrCat("no segment ", name));
  return it->second;
}

absl::StatusOr<std::shared_ptr<const Segment>> SegmentRegistry::Resolve(std::string_view name,
                                                                        uint64_t offset,
                                                                        uint64_t length,
                                                                        void** address) const {
  ASSIGN_OR_RETURN(auto segment, Lookup(name));
  if (!segment->Contains(offset, length)) {
    return absl::OutOfRangeError(StrCat("range [", offset, ", +", length, ") is outside segment ",
                                        name, " of ", segment->size, " bytes"));
  }
  *address = static_cast<char*>(segment->base) + offset;
  return segment;
}

std::vector<std::shared_ptr<const Segment>> SegmentRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const Segment>> out;
  out.reserve(segments_.size());
  for (const auto& [name, s] : segments_) out.push_back(s);
  return out;
}

}  // namespace strata::transfer
