#include "tests/transfer/fake_verbs.h"

#include <cstring>
#include <deque>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "common/strings.h"
#include "transfer/rdma/rdma_plan.h"

namespace strata::transfer::testing_util {

using rdma::QpState;
using rdma::WcStatus;

struct FakeRegion {
  uint64_t addr, length;
  uint32_t access;
};

class FakeCq;
class FakeQp;

struct FakeFabric::State {
  mutable std::mutex mu;
  uint32_t next_key = 0x100;
  uint32_t next_qpn = 0x10;
  uint16_t next_lid = 1;
  absl::flat_hash_map<uint32_t, FakeRegion> regions;  // by lkey == rkey
  absl::flat_hash_map<uint32_t, FakeQp*> qps;         // by qpn
  int fail_next = 0;
  WcStatus fail_status = WcStatus::kRetryExceeded;
  bool stalled = false;
  int64_t executed = 0, created = 0, registrations = 0;
};

namespace {

class FakeMr : public rdma::MemoryRegion {
 public:
  FakeMr(std::shared_ptr<FakeFabric::State> st, uint32_t key, FakeRegion r)
      : st_(std::move(st)), key_(key), r_(r) {}
  ~FakeMr() override {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->regions.erase(key_);
  }
  uint64_t addr() const override { return r_.addr; }
  uint64_t length() const override { return r_.length; }
  uint32_t lkey() const override { return key_; }
  uint32_t rkey() const override { return key_; }

 private:
  std::shared_ptr<FakeFabric::State> st_;
  uint32_t key_;
  FakeRegion r_;
};

}  // namespace

class FakeCq : public rdma::VerbsCq {
 public:
  explicit FakeCq(std::shared_ptr<FakeFabric::State> st) : st_(std::move(st)) {}
  int Poll(std::vector<rdma::WorkCompletion>& out) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    int n = 0;
    while (n < static_cast<int>(out.size()) && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return n;
  }
  void PushLocked(rdma::WorkCompletion wc) { done_.push_back(wc); }

 private:
  std::shared_ptr<FakeFabric::State> st_;
  std::deque<rdma::WorkCompletion> done_;  // guarded by st_->mu
};

class FakeQp : public rdma::VerbsQp {
 public:
  FakeQp(std::shared_ptr<FakeFabric::State> st, std::shared_ptr<FakeCq> cq, uint32_t qpn)
      : st_(std::move(st)), cq_(std::move(cq)), qpn_(qpn) {}
  ~FakeQp() override {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->qps.erase(qpn_);
  }
  uint32_t qpn() const override { return qpn_; }

  absl::Status ToInit() override { return Move(QpState::kInit); }
  absl::Status ToRtr(const rdma::QpConnectParams& p) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    RETURN_IF_ERROR(sm_.Transition(QpState::kRtr));
    remote_qpn_ = p.remote.qpn;
    return absl::OkStatus();
  }
  absl::Status ToRts(const rdma::QpConnectParams&) override { return Move(QpState::kRts); }
  absl::Status ToError() override {
    std::lock_guard<std::mutex> lock(st_->mu);
    RETURN_IF_ERROR(sm_.Transition(QpState::kError));
    FlushLocked();
    return absl::OkStatus();
  }

  absl::Status PostSend(const std::vector<rdma::WorkRequest>& wrs) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    if (sm_.state() != QpState::kRts && sm_.state() != QpState::kError) {
      return absl::FailedPreconditionError(
          StrCat("fake verbs: post on a QP in ", rdma::QpStateName(sm_.state())));
    }
    for (const auto& wr : wrs) held_.push_back(wr);
    if (sm_.state() == QpState::kError) {
      FlushLocked();
    } else if (!st_->stalled) {
      RunLocked();
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Move(QpState to) {
    std::lock_guard<std::mutex> lock(st_->mu);
    return sm_.Transition(to);
  }

  void FlushLocked() {
    for (const auto& wr : held_) cq_->PushLocked({wr.wr_id, WcStatus::kFlushed, qpn_});
    held_.clear();
  }

  WcStatus ExecuteLocked(const rdma::WorkRequest& wr) {
    if (st_->fail_next > 0) {
      --st_->fail_next;
      return st_->fail_status;
    }
    auto peer = st_->qps.find(remote_qpn_);
    if (peer == st_->qps.end() || peer->second->remote_qpn_ != qpn_ ||
        (peer->second->sm_.state() != QpState::kRtr &&
         peer->second->sm_.state() != QpState::kRts)) {
      return WcStatus::kRetryExceeded;  // nobody answers: the NIC's retries run out
    }
    auto local = st_->regions.find(wr.lkey);
    if (local == st_->regions.end() || wr.local_addr < local->second.addr ||
        wr.local_addr + wr.length > local->second.addr + local->second.length ||
        (wr.op == OpKind::kRead && !(local->second.access & rdma::kLocalWrite))) {
      return WcStatus::kLocalProtection;
    }
    auto remote = st_->regions.find(wr.rkey);
    const uint32_t need = wr.op == OpKind::kRead ? rdma::kRemoteRead : rdma::kRemoteWrite;
    if (remote == st_->regions.end() || wr.remote_addr < remote->second.addr ||
        wr.remote_addr + wr.length > remote->second.addr + remote->second.length ||
        !(remote->second.access & need)) {
      return WcStatus::kRemoteAccess;
    }
    void* l = reinterpret_cast<void*>(wr.local_addr);
    void* r = reinterpret_cast<void*>(wr.remote_addr);
    if (wr.op == OpKind::kRead) {
      std::memcpy(l, r, wr.length);
    } else {
      std::memcpy(r, l, wr.length);
    }
    ++st_->executed;
    return WcStatus::kSuccess;
  }

  void RunLocked() {
    while (!held_.empty()) {
      const rdma::WorkRequest wr = held_.front();
      held_.pop_front();
      const WcStatus s = ExecuteLocked(wr);
      cq_->PushLocked({wr.wr_id, s, qpn_});
      if (s != WcStatus::kSuccess) {
        (void)sm_.Transition(QpState::kError);
        FlushLocked();
        return;
      }
    }
  }

  std::shared_ptr<FakeFabric::State> st_;
  std::shared_ptr<FakeCq> cq_;
  const uint32_t qpn_;
  uint32_t remote_qpn_ = 0;             // guarded by st_->mu
  rdma::QpStateMachine sm_;             // guarded by st_->mu
  std::deque<rdma::WorkRequest> held_;  // guarded by st_->mu
};

namespace {

class FakeContext : public rdma::VerbsContext {
 public:
  FakeContext(std::shared_ptr<FakeFabric::State> st, rdma::PortInfo port)
      : st_(std::move(st)), port_(std::move(port)) {}
  const rdma::PortInfo& port() const override { return port_; }

  absl::StatusOr<std::shared_ptr<rdma::MemoryRegion>> RegisterMemory(void* addr, uint64_t length,
                                                                     uint32_t access) override {
    if (addr == nullptr || length == 0) return absl::InvalidArgumentError("fake: empty region");
    std::lock_guard<std::mutex> lock(st_->mu);
    const uint32_t key = st_->next_key++;
    FakeRegion r{reinterpret_cast<uint64_t>(addr), length, access};
    st_->regions[key] = r;
    ++st_->registrations;
    return std::shared_ptr<rdma::MemoryRegion>(std::make_shared<FakeMr>(st_, key, r));
  }

  absl::StatusOr<std::shared_ptr<rdma::VerbsCq>> CreateCq(int) override {
    return std::shared_ptr<rdma::VerbsCq>(std::make_shared<FakeCq>(st_));
  }

  absl::StatusOr<std::unique_ptr<rdma::VerbsQp>> CreateQp(std::shared_ptr<rdma::VerbsCq> cq,
                                                          uint32_t) override {
    auto fcq = std::dynamic_pointer_cast<FakeCq>(cq);
    if (!fcq) return absl::InvalidArgumentError("fake: foreign CQ");
    std::lock_guard<std::mutex> lock(st_->mu);
    const uint32_t qpn = st_->next_qpn++;
    auto qp = std::make_unique<FakeQp>(st_, fcq, qpn);
    st_->qps[qpn] = qp.get();
    ++st_->created;
    return std::unique_ptr<rdma::VerbsQp>(std::move(qp));
  }

 private:
  std::shared_ptr<FakeFabric::State> st_;
  rdma::PortInfo port_;
};

}  // namespace

FakeFabric::FakeFabric() : state_(std::make_shared<State>()) {}

std::shared_ptr<rdma::VerbsContext> FakeFabric::NewContext(uint64_t max_msg_size) {
  rdma::PortInfo port;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    port.device = StrCat("fake", state_->next_lid);
    port.lid = state_->next_lid++;
  }
  port.gid[15] = static_cast<uint8_t>(port.lid);
  port.max_msg_size = max_msg_size;
  return std::make_shared<FakeContext>(state_, port);
}

void FakeFabric::FailNext(int n, rdma::WcStatus status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->fail_next = n;
  state_->fail_status = status;
}

void FakeFabric::SetStalled(bool stalled) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stalled = stalled;
}

int64_t FakeFabric::work_requests() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->executed;
}
int64_t FakeFabric::qps_created() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->created;
}
int64_t FakeFabric::registrations() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->registrations;
}
int64_t FakeFabric::live_regions() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int64_t>(state_->regions.size());
}

}  // namespace strata::transfer::testing_util
