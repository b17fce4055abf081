#include "transfer/rdma/rdma_plan.h"

#include <algorithm>

#include "common/strings.h"

namespace strata::transfer::rdma {

std::vector<Chunk> SplitTransfer(uint64_t length, uint64_t max_chunk) {
  max_chunk = std::clamp<uint64_t>(max_chunk, 1, 1ull << 31);
  std::vector<Chunk> out;
  out.reserve(length / max_chunk + 1);
  for (uint64_t off = 0; off < length; off += max_chunk) {
    out.push_back({off, static_cast<uint32_t>(std::min(max_chunk, length - off))});
  }
  return out;
}

CompletionVerdict ClassifyCompletion(WcStatus status) {
  using C = absl::StatusCode;
  switch (status) {
    case WcStatus::kSuccess:
      return {C::kOk, false, false, false};
    case WcStatus::kFlushed:  // another WR broke the QP, or we moved it to ERR
    case WcStatus::kRetryExceeded:
    case WcStatus::kRnrRetryExceeded:
    case WcStatus::kRemoteOperational:
      return {C::kUnavailable, true, false, true};
    case WcStatus::kRemoteAccess:  // segment unregistered / re-registered: rkey is stale
      return {C::kPermissionDenied, true, true, true};
    case WcStatus::kRemoteInvalid:
      return {C::kInvalidArgument, false, false, true};
    case WcStatus::kLocalProtection:
    case WcStatus::kOther:
      return {C::kInternal, false, false, true};
  }
  return {C::kInternal, false, false, true};
}

std::string_view WcStatusName(WcStatus status) {
  switch (status) {
    case WcStatus::kSuccess:
      return "success";
    case WcStatus::kFlushed:
      return "flushed";
    case WcStatus::kRetryExceeded:
      return "transport retries exceeded";
    case WcStatus::kRnrRetryExceeded:
      return "RNR retries exceeded";
    case WcStatus::kRemoteAccess:
      return "remote access error";
    case WcStatus::kRemoteInvalid:
      return "remote invalid request";
    case WcStatus::kLocalProtection:
      return "local protection error";
    case WcStatus::kRemoteOperational:
      return "remote operational error";
    case WcStatus::kOther:
      return "other error";
  }
  return "?";
}

std::string_view QpStateName(QpState s) {
  switch (s) {
    case QpState::kReset:
      return "RESET";
    case QpState::kInit:
      return "INIT";
    case QpState::kRtr:
      return "RTR";
    case QpState::kRts:
      return "RTS";
    case QpState::kError:
      return "ERR";
  }
  return "?";
}

absl::Status QpStateMachine::Transition(QpState to) {
  const bool ok = to == QpState::kError || (state_ == QpState::kReset && to == QpState::kInit) ||
                  (state_ == QpState::kInit && to == QpState::kRtr) ||
                  (state_ == QpState::kRtr && to == QpState::kRts) ||
                  (state_ == QpState::kError && to == QpState::kReset);
  if (!ok) {
    return absl::FailedPreconditionError(
        StrCat("rdma: illegal QP transition ", QpStateName(state_), " -> ", QpStateName(to)));
  }
  state_ = to;
  return absl::OkStatus();
}

}  // namespace strata::transfer::rdma
