// The server side of the tcp transport: one blocking thread per connection (TransferServer).
#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/tcp/tcp_transport.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

constexpr size_t kDrainBytes = 256 << 10;

absl::Status Respond(int fd, uint64_t id, const absl::Status& status, const void* payload,
                     uint64_t payload_len) {
  wire::ResponseHeader rh;
  rh.id = id;
  rh.code = static_cast<int32_t>(status.code());
  std::string msg(ToStd(status.message()).substr(0, wire::kMaxMessage));
  rh.message_len = static_cast<uint32_t>(msg.size());
  rh.payload_len = status.ok() ? payload_len : 0;
  iovec iov[3] = {{&rh, sizeof(rh)},
                  {msg.data(), msg.size()},
                  {const_cast<void*>(payload), static_cast<size_t>(rh.payload_len)}};
  return wire::SendIov(fd, iov, 3);
}

// Reads and throws away `length` bytes (the payload of a refused write).
absl::Status Drain(int fd, uint64_t length, std::vector<char>& scratch) {
  scratch.resize(kDrainBytes);
  while (length > 0) {
    const size_t n = std::min<uint64_t>(length, scratch.size());
    RETURN_IF_ERROR(wire::RecvAll(fd, scratch.data(), n));
    length -= n;
  }
  return absl::OkStatus();
}

}  // namespace

void ServeTcpConnection(int fd, const SegmentRegistry& segments, const ClusterSecret& secret,
                        const std::string& peer_name, TcpServeCounters* counters) {
  std::vector<char> scratch;
  std::string segment_name, capability;
  while (true) {
    wire::RequestHeader h;
    if (!wire::RecvAll(fd, &h, sizeof(h)).ok()) return;  // peer gone or server stopping
    if (h.magic != wire::kRequestMagic || h.segment_len == 0 || h.segment_len > 255 ||
        (h.op != static_cast<uint8_t>(OpKind::kRead) &&
         h.op != static_cast<uint8_t>(OpKind::kWrite))) {
      spdlog::warn("transfer server: protocol error from {}; closing", peer_name);
      return;
    }
    segment_name.resize(h.segment_len);
    capability.resize(h.capability_len);
    if (!wire::RecvAll(fd, segment_name.data(), segment_name.size()).ok()) return;
    if (!capability.empty() && !wire::RecvAll(fd, capability.data(), capability.size()).ok()) {
      return;
    }
    const OpKind op = static_cast<OpKind>(h.op);
    absl::Status status = VerifyCapability(secret, capability, segment_name, h.offset, h.length,
                                           op == OpKind::kRead ? Access::kRead : Access::kWrite);
    void* address = nullptr;
    std::shared_ptr<const Segment> segment;
    if (status.ok()) {
      auto resolved = segments.Resolve(segment_name, h.offset, h.length, &address);
      if (resolved.ok()) {
        segment = *std::move(resolved);
        if (segment->kind != MemoryKind::kHost) {
          status = absl::FailedPreconditionError(
              StrCat("segment ", segment_name, " is device memory; use the cuda transport"));
        }
      } else {
        status = resolved.status();
      }
    }
    if (!status.ok()) {
      counters->refused.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("transfer server: refused {} of {} [{}, +{}) from {}: {}",
                   op == OpKind::kRead ? "read" : "write", segment_name, h.offset, h.length,
                   peer_name, status.ToString());
      if (op == OpKind::kWrite && !Drain(fd, h.length, scratch).ok()) return;
      if (!Respond(fd, h.id, status, nullptr, 0).ok()) return;
      continue;
    }
    if (op == OpKind::kWrite) {
      // Straight into the segment: no staging copy.
      if (!wire::RecvAll(fd, address, h.length).ok()) return;
      if ((h.flags & wire::kHasChecksum) && Checksum64(address, h.length) != h.checksum) {
        status = absl::DataLossError(StrCat("write to ", segment_name, " [", h.offset, ", +",
                                            h.length, ") arrived corrupted (checksum mismatch)"));
        spdlog::warn("transfer server: {} (from {})", status.ToString(), peer_name);
      }
      counters->served.fetch_add(1, std::memory_order_relaxed);
      if (!Respond(fd, h.id, status, nullptr, 0).ok()) return;
    } else {
      counters->served.fetch_add(1, std::memory_order_relaxed);
      if (!Respond(fd, h.id, status, address, h.length).ok()) return;
    }
  }
}

}  // namespace strata::transfer
