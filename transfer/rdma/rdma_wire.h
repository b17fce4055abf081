// The rdma side channel: messages a client and a TransferServer exchange over TCP to set up
// queue pairs and to learn where a remote segment lives (address + rkey).
//
// The side channel is an ordinary TransferServer TCP connection authenticated with the cluster
// secret (wire::ClientHandshake with Purpose::kRdmaSideChannel), then a sequence of
// request/reply frames:
//   frame = magic u32 "STRD" | type u8 | reserved [3] | body_len u32 | body
// Bodies (little-endian):
//   ConnectQps        client QpAddress × n (u32 n first)             → ConnectQpsReply
//   ConnectQpsReply   status | server QpAddress × n
//   Resolve           segment, capability, access u8, offset u64, length u64  → ResolveReply
//   ResolveReply      status | addr u64 | rkey u32 | segment size u64
//   ReconnectQp       index u32 | client QpAddress                    → ReconnectQpReply
//   ReconnectQpReply  status | server QpAddress
//   VerifyWrite       segment, capability, offset u64, length u64, checksum u64 → VerifyReply
//   VerifyReply       status
// status = code i32 | message (u16 length + bytes); strings are u16 length + bytes;
// QpAddress = qpn u32 | lid u16 | gid [16] | psn u32 | mtu u8.
// The server checks the capability (VerifyCapability) before it hands out an rkey: the rkey of
// the segment's memory region is the capability in the one-sided world (docs/transfer.md).
//
// Decoding never trusts lengths: every malformed body is InvalidArgument.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/capability.h"
#include "transfer/rdma/verbs.h"

namespace strata::transfer::rdma {

enum class MsgType : uint8_t {
  kConnectQps = 1,
  kConnectQpsReply = 2,
  kResolve = 3,
  kResolveReply = 4,
  kReconnectQp = 5,
  kReconnectQpReply = 6,
  kVerifyWrite = 7,
  kVerifyReply = 8,
};

constexpr uint32_t kSideMagic = 0x44525453;  // "STRD"
constexpr uint32_t kMaxBody = 64 << 10;
constexpr uint32_t kMaxQpsPerPeer = 64;

struct ConnectQps {
  std::vector<QpAddress> qps;
};
struct ConnectQpsReply {
  absl::Status status;
  std::vector<QpAddress> qps;
};
struct Resolve {
  std::string segment;
  std::string capability;
  Access access = Access::kRead;
  uint64_t offset = 0;
  uint64_t length = 0;
};
struct ResolveReply {
  absl::Status status;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t size = 0;
};
struct ReconnectQp {
  uint32_t index = 0;
  QpAddress qp;
};
struct ReconnectQpReply {
  absl::Status status;
  QpAddress qp;
};
struct VerifyWrite {
  std::string segment;
  std::string capability;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
};
struct VerifyReply {
  absl::Status status;
};

std::string Encode(const ConnectQps& m);
std::string Encode(const ConnectQpsReply& m);
std::string Encode(const Resolve& m);
std::string Encode(const ResolveReply& m);
std::string Encode(const ReconnectQp& m);
std::string Encode(const ReconnectQpReply& m);
std::string Encode(const VerifyWrite& m);
std::string Encode(const VerifyReply& m);

absl::StatusOr<ConnectQps> DecodeConnectQps(std::string_view body);
absl::StatusOr<ConnectQpsReply> DecodeConnectQpsReply(std::string_view body);
absl::StatusOr<Resolve> DecodeResolve(std::string_view body);
absl::StatusOr<ResolveReply> DecodeResolveReply(std::string_view body);
absl::StatusOr<ReconnectQp> DecodeReconnectQp(std::string_view body);
absl::StatusOr<ReconnectQpReply> DecodeReconnectQpReply(std::string_view body);
absl::StatusOr<VerifyWrite> DecodeVerifyWrite(std::string_view body);
absl::StatusOr<VerifyReply> DecodeVerifyReply(std::string_view body);

// One frame on a blocking socket (the socket's timeouts bound the wait).
absl::Status SendFrame(int fd, MsgType type, std::string_view body);
absl::StatusOr<std::pair<MsgType, std::string>> RecvFrame(int fd);

// Sends `body` as `type` and waits for a frame of type `reply`; Unavailable when the socket
// fails or the reply has another type.
absl::StatusOr<std::string> Call(int fd, MsgType type, std::string_view body, MsgType reply);

}  // namespace strata::transfer::rdma
