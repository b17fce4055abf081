// The small slice of ibverbs the rdma transport uses, behind an interface.
//
// Why an interface: no machine this project was developed on has an RDMA device (not even
// rxe/siw), so everything above the verbs calls — the side-channel handshake, the MR cache, work
// request splitting, QP state bookkeeping, completion handling, deadlines, reconnection — is
// tested against an in-process fake NIC (tests/transfer/fake_verbs.h) and only the thin
// ibverbs-backed implementation (verbs_ibv.cc, OpenIbvContext) is untested on hardware.
//
// The types here carry no ibverbs header so the transport logic builds without libibverbs; the
// ibverbs backend maps them to ibv_* values. One VerbsContext is one opened device port with one
// protection domain.
//
// Thread safety: VerbsContext::RegisterMemory/CreateCq/CreateQp are thread-safe. A VerbsQp is
// used by one thread at a time (the channel's worker); VerbsCq::Poll by one thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transfer/transport.h"

namespace strata::transfer::rdma {

// Access flags of a memory region (subset of ibv_access_flags).
enum MrAccess : uint32_t {
  kLocalWrite = 1,
  kRemoteRead = 2,
  kRemoteWrite = 4,
};

// A registered memory region. Deregistered when the last reference goes (ibv_dereg_mr):
// after that the NIC never touches [addr, addr + length).
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual uint64_t addr() const = 0;
  virtual uint64_t length() const = 0;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
};

// What a QP peer needs to connect to us (ibv_qp_attr fields for RTR/RTS).
struct QpAddress {
  uint32_t qpn = 0;
  uint16_t lid = 0;                  // InfiniBand; 0 on RoCE
  std::array<uint8_t, 16> gid = {};  // RoCE / global routing
  uint32_t psn = 0;                  // first packet sequence number (24 bits)
  uint8_t mtu = 0;                   // ibv_mtu enum value: 1=256 .. 5=4096
  bool operator==(const QpAddress&) const = default;
};

// Our own completion status codes (mapped from ibv_wc_status by the backend).
enum class WcStatus : uint8_t {
  kSuccess = 0,
  kFlushed,            // IBV_WC_WR_FLUSH_ERR: the QP went to ERR before this ran
  kRetryExceeded,      // IBV_WC_RETRY_EXC_ERR: transport retries exhausted (link/peer)
  kRnrRetryExceeded,   // IBV_WC_RNR_RETRY_EXC_ERR
  kRemoteAccess,       // IBV_WC_REM_ACCESS_ERR: bad rkey / bounds / access on the peer
  kRemoteInvalid,      // IBV_WC_REM_INV_REQ_ERR
  kLocalProtection,    // IBV_WC_LOC_PROT_ERR: our lkey does not cover the buffer
  kRemoteOperational,  // IBV_WC_REM_OP_ERR
  kOther,
};
std::string_view WcStatusName(WcStatus status);

struct WorkRequest {
  uint64_t wr_id = 0;
  OpKind op = OpKind::kRead;  // RDMA READ (remote → local) or WRITE (local → remote)
  uint64_t local_addr = 0;
  uint32_t lkey = 0;
  uint32_t length = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  bool signaled = true;
};

struct WorkCompletion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  uint32_t qpn = 0;
};

class VerbsCq {
 public:
  virtual ~VerbsCq() = default;
  // Non-blocking: fills up to out.size() completions, returns how many.
  virtual int Poll(std::vector<WorkCompletion>& out) = 0;
};

struct QpConnectParams {
  QpAddress remote;
  uint32_t local_psn = 0;
  uint8_t mtu = 0;        // min of both sides
  uint8_t retry_cnt = 7;  // transport retries before IBV_WC_RETRY_EXC_ERR
  uint8_t rnr_retry = 7;  // 7 = infinite; we use no receives, so RNR never applies
  uint8_t timeout = 14;   // local ACK timeout: 4.096 µs * 2^14 ≈ 67 ms
  uint8_t max_rd_atomic = 16;
};

class VerbsQp {
 public:
  virtual ~VerbsQp() = default;
  virtual uint32_t qpn() const = 0;
  // RESET → INIT (port, pkey 0, remote read/write access).
  virtual absl::Status ToInit() = 0;
  // INIT → RTR (path to the remote QP) → RTS (our send PSN, retries, timeout).
  virtual absl::Status ToRtr(const QpConnectParams& params) = 0;
  virtual absl::Status ToRts(const QpConnectParams& params) = 0;
  // Any state → ERR: outstanding work requests complete with kFlushed.
  virtual absl::Status ToError() = 0;
  // Posts a chain of send work requests; the NIC takes ownership of the local ranges until
  // their completions (or the flush after ToError) are polled.
  virtual absl::Status PostSend(const std::vector<WorkRequest>& wrs) = 0;
};

struct PortInfo {
  std::string device;  // "mlx5_0"
  uint8_t port = 1;
  uint16_t lid = 0;
  std::array<uint8_t, 16> gid = {};
  uint8_t active_mtu = 5;              // ibv_mtu
  uint64_t max_msg_size = 1ull << 30;  // port max_msg_sz
  uint32_t max_qp_wr = 4096;           // device max_qp_wr
  uint32_t max_qp_rd_atom = 16;        // device max_qp_rd_atom
};

class VerbsContext {
 public:
  virtual ~VerbsContext() = default;
  virtual const PortInfo& port() const = 0;
  // ibv_reg_mr over host memory. ResourceExhausted / Internal on failure.
  virtual absl::StatusOr<std::shared_ptr<MemoryRegion>> RegisterMemory(void* addr, uint64_t length,
                                                                       uint32_t access) = 0;
  virtual absl::StatusOr<std::shared_ptr<VerbsCq>> CreateCq(int depth) = 0;
  // An RC QP on `cq` (send and receive) with room for `max_send_wr` outstanding sends.
  virtual absl::StatusOr<std::unique_ptr<VerbsQp>> CreateQp(std::shared_ptr<VerbsCq> cq,
                                                            uint32_t max_send_wr) = 0;
};

// Opens the first RDMA device with an active port (ibverbs). Unavailable with the reason when
// there is none or this build has no ibverbs (STRATA_WITH_RDMA=OFF).
absl::StatusOr<std::shared_ptr<VerbsContext>> OpenIbvContext();

}  // namespace strata::transfer::rdma
