// The bytes on the wire between a transfer client and a TransferServer, and the socket helpers
// both sides share.
//
// Every connection (tcp data, rdma side channel, shm unix socket) starts with a mutual
// challenge-response over the cluster secret:
//   client → server  Hello     { magic "STHI", version u8, purpose u8, client nonce [16] }
//   server → client  Challenge { server nonce [16], HMAC(secret, "S" cn sn purpose) [32] }
//   client → server  Proof     { HMAC(secret, "C" cn sn purpose) [32] }
//   server → client  Ok        { u8 1 }      (or the connection is closed)
//
// tcp requests then flow client → server as RequestHeader + segment name + capability
// (+ payload for a write); the server answers each, in order, with ResponseHeader + message
// (+ payload for a successful read). Integers are little-endian (both ends are x86-64/aarch64
// Linux; the header is static_assert-checked).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/capability.h"

namespace strata::transfer::wire {

enum class Purpose : uint8_t { kTcpData = 1, kRdmaSideChannel = 2, kShmMap = 3 };

constexpr uint32_t kRequestMagic = 0x51525453;   // "STRQ"
constexpr uint32_t kResponseMagic = 0x53525453;  // "STRS"

enum RequestFlags : uint8_t { kHasChecksum = 1 };

struct RequestHeader {
  uint32_t magic = kRequestMagic;
  uint8_t op = 0;  // OpKind
  uint8_t flags = 0;
  uint16_t capability_len = 0;
  uint16_t segment_len = 0;
  uint16_t reserved = 0;
  uint32_t reserved2 = 0;
  uint64_t id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;  // kHasChecksum: xxh3-64 of the write payload
};
static_assert(sizeof(RequestHeader) == 48);

struct ResponseHeader {
  uint32_t magic = kResponseMagic;
  int32_t code = 0;  // absl::StatusCode
  uint64_t id = 0;
  uint64_t payload_len = 0;  // bytes of data following the message (reads that succeeded)
  uint32_t message_len = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(ResponseHeader) == 32);

constexpr size_t kMaxMessage = 4096;

// "host:port" → a connected, blocking TCP socket with TCP_NODELAY; Unavailable on failure.
absl::StatusOr<int> DialTcp(std::string_view address, absl::Duration timeout);
// Binds and listens on "host:port" (port 0: any); returns the fd and sets *bound to host:port.
absl::StatusOr<int> ListenTcp(std::string_view address, std::string* bound);
absl::StatusOr<int> DialUnix(const std::string& path, absl::Duration timeout);
absl::StatusOr<int> ListenUnix(const std::string& path);

// Sets SO_RCVTIMEO/SO_SNDTIMEO (0: none).
void SetSocketTimeouts(int fd, absl::Duration timeout);
void SetSocketBuffers(int fd, int bytes);

// Blocking full transfers; Unavailable on EOF/reset, DeadlineExceeded on a socket timeout.
absl::Status SendAll(int fd, const void* data, size_t size);
absl::Status RecvAll(int fd, void* data, size_t size);
// Sends every byte of iov[0..n) (modifies iov).
absl::Status SendIov(int fd, struct iovec* iov, int n);

// The handshake (see the file comment). Blocks for at most the socket's timeouts.
absl::Status ClientHandshake(int fd, const ClusterSecret& secret, Purpose purpose);
// Returns the purpose the client asked for; PermissionDenied when its proof is wrong.
absl::StatusOr<Purpose> ServerHandshake(int fd, const ClusterSecret& secret);

// Passes / receives one file descriptor with SCM_RIGHTS alongside `data`.
absl::Status SendFd(int fd, int fd_to_send, const void* data, size_t size);
absl::StatusOr<int> RecvFd(int fd, void* data, size_t size);

}  // namespace strata::transfer::wire
