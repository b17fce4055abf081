#include "transfer/shm/shm_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "common/checksum.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

// Reply to a map request; followed by `message_len` bytes of message. The memfd rides along
// (SCM_RIGHTS) when code is OK.
struct MapReply {
  int32_t code = 0;
  uint32_t message_len = 0;
  uint64_t size = 0;
};

struct Mapping {
  void* base = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
};

class ShmChannel : public Channel {
 public:
  ShmChannel(const PeerSpec& peer, const Endpoint& endpoint, ShmTransportOptions options,
             absl::Duration timeout)
      : peer_name_(peer.name.empty() ? endpoint.address : peer.name),
        socket_path_(endpoint.address),
        options_(std::move(options)),
        timeout_(timeout) {}

  void Submit(std::vector<TransferRequest> requests, CompletionFn done) override {
    int64_t bytes = 0;
    for (const TransferRequest& r : requests) bytes += static_cast<int64_t>(r.length);
    ForEachCopy(static_cast<int64_t>(requests.size()), bytes,
                [&](int64_t i) { done(static_cast<size_t>(i), Execute(requests[i])); });
  }

  void Close() override {
    closed_.store(true);
    Disconnect();
  }

  absl::StatusOr<MappedBytes> MapRead(const TransferRequest& r) override {
    if (r.op != OpKind::kRead) return absl::InvalidArgumentError("shm: MapRead of a write");
    ASSIGN_OR_RETURN(std::shared_ptr<Mapping> m, CheckedMapping(r, Access::kRead));
    const auto* remote = static_cast<const uint8_t*>(m->base) + r.offset;
    if (r.checksum && Checksum64(remote, r.length) != *r.checksum) {
      return absl::DataLossError(StrCat("shm: ", r.segment, " [", r.offset, ", +", r.length,
                                        ") does not match its checksum"));
    }
    MappedBytes out;
    out.bytes = {remote, r.length};
    out.region = {static_cast<const uint8_t*>(m->base), m->size};
    out.owner = std::move(m);
    return out;
  }

  void Disconnect() override {
    std::lock_guard<std::mutex> lock(mu_);
    mappings_.clear();  // in-flight copies hold their own reference
  }

  // Maps a segment eagerly (so the first request does not pay for it).
  absl::Status Probe() {
    // Nothing to map yet: just check the owner answers and accepts our secret.
    ASSIGN_OR_RETURN(int fd, wire::DialUnix(socket_path_, timeout_));
    wire::SetSocketTimeouts(fd, timeout_);
    absl::Status st = wire::ClientHandshake(fd, options_.secret, wire::Purpose::kShmMap);
    close(fd);
    return st;
  }

 private:
  // The checks every request passes before its bytes are touched: open channel, deadline, a
  // length, the capability, a mapping of the segment, the bounds.
  absl::StatusOr<std::shared_ptr<Mapping>> CheckedMapping(const TransferRequest& r, Access needed) {
    if (closed_.load()) return absl::CancelledError("shm channel closed");
    if (absl::Now() >= r.deadline) return absl::DeadlineExceededError("shm: deadline passed");
    if (r.length == 0) return absl::InvalidArgumentError("shm: request needs a length");
    if (auto st =
            VerifyCapability(options_.secret, r.capability, r.segment, r.offset, r.length, needed);
        !st.ok()) {
      spdlog::warn("shm: refused {} of {} [{}, +{}) on {}: {}", AccessName(needed), r.segment,
                   r.offset, r.length, peer_name_, st.ToString());
      return st;
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Mapping> m, GetMapping(r.segment, r.deadline));
    if (r.offset > m->size || r.length > m->size - r.offset) {
      return absl::OutOfRangeError(StrCat("shm: range [", r.offset, ", +", r.length,
                                          ") is outside segment ", r.segment, " of ", m->size,
                                          " bytes"));
    }
    return m;
  }

  absl::Status Execute(const TransferRequest& r) {
    if (r.local == nullptr) return absl::InvalidArgumentError("shm: request needs a local buffer");
    ASSIGN_OR_RETURN(std::shared_ptr<Mapping> m,
                     CheckedMapping(r, r.op == OpKind::kRead ? Access::kRead : Access::kWrite));
    char* remote = static_cast<char*>(m->base) + r.offset;
    if (r.op == OpKind::kRead) {
      if (!r.checksum) {
        std::memcpy(r.local, remote, r.length);
      } else if (CopyAndChecksum64(r.local, remote, r.length) != *r.checksum) {
        return absl::DataLossError(StrCat("shm: read of ", r.segment, " [", r.offset, ", +",
                                          r.length, ") does not match its checksum"));
      }
    } else {
      std::memcpy(remote, r.local, r.length);
      if (r.checksum && Checksum64(remote, r.length) != *r.checksum) {
        return absl::DataLossError(StrCat("shm: write to ", r.segment, " [", r.offset, ", +",
                                          r.length, ") does not match its checksum"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Mapping>> GetMapping(const std::string& name,
                                                      absl::Time deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = mappings_.find(name);
      if (it != mappings_.end()) return it->second;
    }
    ASSIGN_OR_RETURN(auto m, Map(name, std::min(timeout_, deadline - absl::Now())));
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = mappings_.try_emplace(name, m);
    return it->second;  // a racing mapper may have won; both mappings are equivalent
  }

  absl::StatusOr<std::shared_ptr<Mapping>> Map(const std::string& name, absl::Duration timeout) {
    if (timeout <= absl::ZeroDuration()) return absl::DeadlineExceededError("shm: deadline passed");
    ASSIGN_OR_RETURN_WITH(int fd, wire::DialUnix(socket_path_, timeout), "shm peer ", peer_name_);
    wire::SetSocketTimeouts(fd, timeout);
    auto finish = [&](absl::Status st) {
      close(fd);
      return Annotate(st, StrCat("shm: mapping ", name, " of ", peer_name_));
    };
    if (auto st = wire::ClientHandshake(fd, options_.secret, wire::Purpose::kShmMap); !st.ok()) {
      return finish(st);
    }
    const uint16_t len = static_cast<uint16_t>(name.size());
    std::string request(reinterpret_cast<const char*>(&len), 2);
    request += name;
    if (auto st = wire::SendAll(fd, request.data(), request.size()); !st.ok()) return finish(st);
    MapReply reply;
    auto memfd = wire::RecvFd(fd, &reply, sizeof(reply));
    if (!memfd.ok()) return finish(memfd.status());
    std::string message(std::min<uint32_t>(reply.message_len, wire::kMaxMessage), '\0');
    if (!message.empty()) (void)wire::RecvAll(fd, message.data(), message.size());
    close(fd);
    if (reply.code != 0) {
      if (*memfd >= 0) close(*memfd);
      return absl::Status(static_cast<absl::StatusCode>(reply.code),
                          StrCat("shm peer ", peer_name_, ": ", message));
    }
    if (*memfd < 0) return absl::InternalError("shm: map reply without a memfd");
    // MAP_POPULATE: fault the whole segment in now, not one page per first touch in the data path.
    void* base =
        mmap(nullptr, reply.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, *memfd, 0);
    const int err = errno;
    close(*memfd);
    if (base == MAP_FAILED) return ErrnoToStatus(err, StrCat("shm: mmap of ", name));
    auto m = std::make_shared<Mapping>();
    m->base = base;
    m->size = reply.size;
    return m;
  }

  const std::string peer_name_;
  const std::string socket_path_;
  const ShmTransportOptions options_;
  const absl::Duration timeout_;
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Mapping>> mappings_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<Channel>> ShmTransport::Connect(const PeerSpec& peer,
                                                               const Endpoint& endpoint,
                                                               absl::Duration timeout) {
  if (endpoint.kind != TransportKind::kShm) {
    return absl::InvalidArgumentError("shm transport given a non-shm endpoint");
  }
  auto channel = std::make_unique<ShmChannel>(peer, endpoint, options_, timeout);
  RETURN_IF_ERROR(channel->Probe());
  return channel;
}

void ServeShmConnection(int fd, const SegmentRegistry& segments, const std::string& peer_name,
                        std::atomic<int64_t>* refused) {
  while (true) {
    uint16_t len = 0;
    if (!wire::RecvAll(fd, &len, sizeof(len)).ok() || len == 0) return;
    std::string name(len, '\0');
    if (!wire::RecvAll(fd, name.data(), name.size()).ok()) return;
    MapReply reply;
    std::string message;
    int memfd = -1;
    auto segment = segments.Lookup(name);
    if (!segment.ok()) {
      reply.code = static_cast<int32_t>(segment.status().code());
      message = std::string(ToStd(segment.status().message()));
    } else if ((*segment)->memfd < 0 || (*segment)->kind != MemoryKind::kHost) {
      reply.code = static_cast<int32_t>(absl::StatusCode::kFailedPrecondition);
      message = StrCat("segment ", name, " is not shareable (not created with a memfd)");
    } else {
      memfd = (*segment)->memfd;
      reply.size = (*segment)->size;
    }
    if (reply.code != 0) {
      refused->fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("transfer server: refused shm map of {} to {}: {}", name, peer_name, message);
    }
    reply.message_len = static_cast<uint32_t>(message.size());
    if (!wire::SendFd(fd, memfd, &reply, sizeof(reply)).ok()) return;
    if (!message.empty() && !wire::SendAll(fd, message.data(), message.size()).ok()) return;
  }
}

}  // namespace strata::transfer
