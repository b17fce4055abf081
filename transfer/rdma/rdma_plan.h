// The hardware-independent decisions of the rdma transport, kept apart so they are unit-tested:
// how a request is cut into work requests, what a completion status means, and which queue
// pair state transitions are legal.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "transfer/rdma/verbs.h"

namespace strata::transfer::rdma {

// One work request's share of a transfer: [offset, offset + length) of the request.
struct Chunk {
  uint64_t offset = 0;
  uint32_t length = 0;
};

// Cuts `length` bytes into chunks of at most `max_chunk` bytes (itself capped at the port's
// max_msg_size and at 2^31 so it fits the 32-bit sge length). Chunks of one request are spread
// over the peer's queue pairs, so a large block uses several QPs at once. Empty for length 0.
std::vector<Chunk> SplitTransfer(uint64_t length, uint64_t max_chunk);

// What the transport does with a completion.
struct CompletionVerdict {
  absl::StatusCode code = absl::StatusCode::kOk;
  bool retry = false;      // the chunk may be re-posted (on a healthy QP) before its deadline
  bool reresolve = false;  // the remote address/rkey may be stale: ask the owner again
  bool qp_broken = false;  // the QP is in ERR now: reconnect it before posting on it again
};
CompletionVerdict ClassifyCompletion(WcStatus status);

enum class QpState : uint8_t { kReset, kInit, kRtr, kRts, kError };
std::string_view QpStateName(QpState s);

// The RC QP state machine as the transport drives it: RESET → INIT → RTR → RTS for a
// connection; any state → ERR (a failed work request, a deadline, Close); ERR → RESET to reuse.
// Not thread-safe (owned by the channel's worker thread).
class QpStateMachine {
 public:
  QpState state() const { return state_; }
  bool CanPost() const { return state_ == QpState::kRts; }
  // FailedPrecondition for an illegal transition (the state is unchanged).
  absl::Status Transition(QpState to);

 private:
  QpState state_ = QpState::kReset;
};

}  // namespace strata::transfer::rdma
