// An in-process fake RDMA NIC behind transfer/rdma/verbs.h, for tests of the rdma transport on
// machines without an RDMA device (all of ours). Several FakeVerbsContexts on one FakeFabric
// are several "hosts" on one network: an RDMA READ/WRITE posted on a QP is carried out
// synchronously inside PostSend by memcpy between the registered memory of the two ends, with
// the checks a NIC makes (QP connected and in RTS/RTR, lkey/rkey valid, range inside the
// region, access flags). A failed check completes the work request with the error a NIC would
// report and moves the QP to ERR (later work requests flush).
//
// Fault knobs: FailNext(n, status) fails the next n executed work requests; SetStalled(true)
// holds work requests (the "NIC" never finishes them) until the QP is moved to ERR, which
// flushes them — the case of a peer that stops answering.
//
// What the fake does not model: timing, PSNs, MTU, ordering across QPs, partial placement.
// Thread-safe (one fabric-wide lock).
#pragma once

#include <memory>
#include <mutex>

#include "transfer/rdma/verbs.h"

namespace strata::transfer::testing_util {

class FakeFabric {
 public:
  FakeFabric();
  // A new "host" on the fabric.
  std::shared_ptr<rdma::VerbsContext> NewContext(uint64_t max_msg_size = 1ull << 30);

  void FailNext(int n, rdma::WcStatus status);
  void SetStalled(bool stalled);

  int64_t work_requests() const;  // executed successfully
  int64_t qps_created() const;
  int64_t registrations() const;  // RegisterMemory calls that succeeded
  int64_t live_regions() const;   // regions not yet deregistered

  struct State;
  std::shared_ptr<State> state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace strata::transfer::testing_util
