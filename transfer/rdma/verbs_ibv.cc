// The ibverbs backend of transfer/rdma/verbs.h. Compiled only when STRATA_WITH_RDMA.
//
// NOT RUN ON HARDWARE: no machine this was developed on has an RDMA device (docs/transfer.md).
// It follows the rdma-core man pages (ibv_modify_qp(3), ibv_post_send(3), ibv_poll_cq(3)) for an
// RC connection with one-sided READ/WRITE and no receives.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "common/strings.h"
#include "transfer/rdma/rdma_plan.h"
#include "transfer/rdma/verbs.h"

namespace strata::transfer::rdma {
namespace {

// Owns the device context and protection domain; every object made from them holds a
// reference, so they are destroyed last.
struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  PortInfo port;
  int gid_index = 0;
  ~Device() {
    if (pd != nullptr) ibv_dealloc_pd(pd);
    if (ctx != nullptr) ibv_close_device(ctx);
  }
};

absl::Status VerbsError(int rc, std::string_view what) {
  // ibv_* return -1 with errno, or a positive errno value.
  const int err = rc > 0 ? rc : errno;
  return ErrnoToStatus(err, StrCat("rdma: ", what));
}

class IbvMr : public MemoryRegion {
 public:
  IbvMr(std::shared_ptr<Device> dev, ibv_mr* mr) : dev_(std::move(dev)), mr_(mr) {}
  ~IbvMr() override { ibv_dereg_mr(mr_); }
  uint64_t addr() const override { return reinterpret_cast<uint64_t>(mr_->addr); }
  uint64_t length() const override { return mr_->length; }
  uint32_t lkey() const override { return mr_->lkey; }
  uint32_t rkey() const override { return mr_->rkey; }

 private:
  std::shared_ptr<Device> dev_;
  ibv_mr* mr_;
};

WcStatus MapWc(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return WcStatus::kSuccess;
    case IBV_WC_WR_FLUSH_ERR:
      return WcStatus::kFlushed;
    case IBV_WC_RETRY_EXC_ERR:
      return WcStatus::kRetryExceeded;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return WcStatus::kRnrRetryExceeded;
    case IBV_WC_REM_ACCESS_ERR:
      return WcStatus::kRemoteAccess;
    case IBV_WC_REM_INV_REQ_ERR:
      return WcStatus::kRemoteInvalid;
    case IBV_WC_LOC_PROT_ERR:
      return WcStatus::kLocalProtection;
    case IBV_WC_REM_OP_ERR:
      return WcStatus::kRemoteOperational;
    default:
      return WcStatus::kOther;
  }
}

class IbvCq : public VerbsCq {
 public:
  IbvCq(std::shared_ptr<Device> dev, ibv_cq* cq) : dev_(std::move(dev)), cq_(cq) {}
  ~IbvCq() override { ibv_destroy_cq(cq_); }
  ibv_cq* raw() const { return cq_; }

  int Poll(std::vector<WorkCompletion>& out) override {
    ibv_wc wc[32];
    const int want = static_cast<int>(std::min<size_t>(out.size(), 32));
    const int n = ibv_poll_cq(cq_, want, wc);
    for (int i = 0; i < n; ++i) {
      out[i] = {.wr_id = wc[i].wr_id, .status = MapWc(wc[i].status), .qpn = wc[i].qp_num};
    }
    return n < 0 ? 0 : n;
  }

 private:
  std::shared_ptr<Device> dev_;
  ibv_cq* cq_;
};

class IbvQp : public VerbsQp {
 public:
  IbvQp(std::shared_ptr<Device> dev, std::shared_ptr<VerbsCq> cq, ibv_qp* qp)
      : dev_(std::move(dev)), cq_(std::move(cq)), qp_(qp) {}
  ~IbvQp() override { ibv_destroy_qp(qp_); }
  uint32_t qpn() const override { return qp_->qp_num; }

  absl::Status ToInit() override {
    RETURN_IF_ERROR(sm_.Transition(QpState::kInit));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = dev_->port.port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    return Modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
  }

  absl::Status ToRtr(const QpConnectParams& p) override {
    RETURN_IF_ERROR(sm_.Transition(QpState::kRtr));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(p.mtu);
    a.dest_qp_num = p.remote.qpn;
    a.rq_psn = p.remote.psn;
    a.max_dest_rd_atomic = p.max_rd_atomic;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = dev_->port.port;
    a.ah_attr.dlid = p.remote.lid;
    bool global = false;
    for (uint8_t b : p.remote.gid) global |= b != 0;
    if (global) {  // RoCE (and routed IB): address by GID
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, p.remote.gid.data(), 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_->gid_index);
      a.ah_attr.grh.hop_limit = 64;
    }
    return Modify(a,
                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                  "RTR");
  }

  absl::Status ToRts(const QpConnectParams& p) override {
    RETURN_IF_ERROR(sm_.Transition(QpState::kRts));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.sq_psn = p.local_psn;
    a.max_rd_atomic = p.max_rd_atomic;
    return Modify(a,
                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                  "RTS");
  }

  absl::Status ToError() override {
    RETURN_IF_ERROR(sm_.Transition(QpState::kError));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    return Modify(a, IBV_QP_STATE, "ERR");
  }

  absl::Status PostSend(const std::vector<WorkRequest>& wrs) override {
    if (wrs.empty()) return absl::OkStatus();
    std::vector<ibv_send_wr> chain(wrs.size());
    std::vector<ibv_sge> sges(wrs.size());
    for (size_t i = 0; i < wrs.size(); ++i) {
      const WorkRequest& w = wrs[i];
      sges[i] = {.addr = w.local_addr, .length = w.length, .lkey = w.lkey};
      ibv_send_wr& s = chain[i];
      s = {};
      s.wr_id = w.wr_id;
      s.sg_list = &sges[i];
      s.num_sge = 1;
      s.opcode = w.op == OpKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      s.send_flags = w.signaled ? IBV_SEND_SIGNALED : 0;
      s.wr.rdma.remote_addr = w.remote_addr;
      s.wr.rdma.rkey = w.rkey;
      s.next = i + 1 < wrs.size() ? &chain[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_, chain.data(), &bad);
    if (rc != 0) return VerbsError(rc, "ibv_post_send");
    return absl::OkStatus();
  }

 private:
  absl::Status Modify(ibv_qp_attr& a, int mask, std::string_view to) {
    const int rc = ibv_modify_qp(qp_, &a, mask);
    if (rc != 0) return VerbsError(rc, StrCat("ibv_modify_qp to ", to));
    return absl::OkStatus();
  }

  std::shared_ptr<Device> dev_;
  std::shared_ptr<VerbsCq> cq_;
  ibv_qp* qp_;
  QpStateMachine sm_;
};

class IbvContext : public VerbsContext {
 public:
  explicit IbvContext(std::shared_ptr<Device> dev) : dev_(std::move(dev)) {}
  const PortInfo& port() const override { return dev_->port; }

  absl::StatusOr<std::shared_ptr<MemoryRegion>> RegisterMemory(void* addr, uint64_t length,
                                                               uint32_t access) override {
    int flags = 0;
    if (access & kLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
    if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
    if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    ibv_mr* mr = ibv_reg_mr(dev_->pd, addr, length, flags);
    if (mr == nullptr) return VerbsError(-1, StrCat("ibv_reg_mr of ", length, " bytes"));
    return std::shared_ptr<MemoryRegion>(std::make_shared<IbvMr>(dev_, mr));
  }

  absl::StatusOr<std::shared_ptr<VerbsCq>> CreateCq(int depth) override {
    ibv_cq* cq = ibv_create_cq(dev_->ctx, depth, nullptr, nullptr, 0);
    if (cq == nullptr) return VerbsError(-1, "ibv_create_cq");
    return std::shared_ptr<VerbsCq>(std::make_shared<IbvCq>(dev_, cq));
  }

  absl::StatusOr<std::unique_ptr<VerbsQp>> CreateQp(std::shared_ptr<VerbsCq> cq,
                                                    uint32_t max_send_wr) override {
    auto* icq = dynamic_cast<IbvCq*>(cq.get());
    if (icq == nullptr) return absl::InvalidArgumentError("rdma: CQ of another backend");
    ibv_qp_init_attr init{};
    init.send_cq = icq->raw();
    init.recv_cq = icq->raw();
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = std::min(max_send_wr, dev_->port.max_qp_wr);
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(dev_->pd, &init);
    if (qp == nullptr) return VerbsError(-1, "ibv_create_qp");
    return std::unique_ptr<VerbsQp>(std::make_unique<IbvQp>(dev_, std::move(cq), qp));
  }

 private:
  std::shared_ptr<Device> dev_;
};

// The GID to use: $STRATA_RDMA_GID_INDEX, else on Ethernet (RoCE) the last IPv4-mapped GID
// among the first 16 (RoCE v2 entries follow v1 ones on mlx5), else index 0.
int PickGidIndex(ibv_context* ctx, uint8_t port, const ibv_port_attr& pattr) {
  if (const char* env = std::getenv("STRATA_RDMA_GID_INDEX")) return std::atoi(env);
  if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
  int best = 0;
  for (int i = 0; i < std::min(pattr.gid_tbl_len, 16); ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(ctx, port, i, &gid) != 0) continue;
    const uint8_t* r = gid.raw;
    bool v4 = true;
    for (int b = 0; b < 10; ++b) v4 &= r[b] == 0;
    if (v4 && r[10] == 0xff && r[11] == 0xff) best = i;
  }
  return best;
}

}  // namespace

absl::StatusOr<std::shared_ptr<VerbsContext>> OpenIbvContext() {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr) {
    return absl::UnavailableError(StrCat("rdma: ibv_get_device_list failed: ", strerror(errno)));
  }
  std::shared_ptr<Device> found;
  for (int i = 0; i < num && !found; ++i) {
    auto dev = std::make_shared<Device>();
    dev->ctx = ibv_open_device(list[i]);
    if (dev->ctx == nullptr) continue;
    ibv_device_attr dattr{};
    if (ibv_query_device(dev->ctx, &dattr) != 0) continue;
    for (uint8_t port = 1; port <= dattr.phys_port_cnt; ++port) {
      ibv_port_attr pattr{};
      if (ibv_query_port(dev->ctx, port, &pattr) != 0 || pattr.state != IBV_PORT_ACTIVE) continue;
      dev->pd = ibv_alloc_pd(dev->ctx);
      if (dev->pd == nullptr) break;
      dev->port.device = ibv_get_device_name(list[i]);
      dev->port.port = port;
      dev->port.lid = pattr.lid;
      dev->port.active_mtu = static_cast<uint8_t>(pattr.active_mtu);
      dev->port.max_msg_size = pattr.max_msg_sz;
      dev->port.max_qp_wr = static_cast<uint32_t>(dattr.max_qp_wr);
      dev->port.max_qp_rd_atom = static_cast<uint32_t>(dattr.max_qp_rd_atom);
      dev->gid_index = PickGidIndex(dev->ctx, port, pattr);
      ibv_gid gid{};
      if (ibv_query_gid(dev->ctx, port, dev->gid_index, &gid) == 0) {
        std::memcpy(dev->port.gid.data(), gid.raw, 16);
      }
      found = dev;
      break;
    }
  }
  ibv_free_device_list(list);
  if (!found) {
    return absl::UnavailableError(
        StrCat("rdma: no RDMA device with an active port (ibv_get_device_list found ", num, ")"));
  }
  return std::shared_ptr<VerbsContext>(std::make_shared<IbvContext>(std::move(found)));
}

}  // namespace strata::transfer::rdma
