#include "transfer/rdma/rdma_wire.h"

#include <cstring>

#include "common/status.h"
#include "common/strings.h"
#include "transfer/wire.h"

namespace strata::transfer::rdma {
namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void PutString(std::string_view s) {
    Put<uint16_t>(static_cast<uint16_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void PutStatus(const absl::Status& s) {
    Put<int32_t>(static_cast<int32_t>(s.code()));
    std::string msg(ToStd(s.message()));
    if (msg.size() > 4096) msg.resize(4096);
    PutString(msg);
  }
  void PutQp(const QpAddress& q) {
    Put(q.qpn);
    Put(q.lid);
    out_.append(reinterpret_cast<const char*>(q.gid.data()), q.gid.size());
    Put(q.psn);
    Put(q.mtu);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return fail();
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetString(std::string* s) {
    uint16_t n = 0;
    if (!Get(&n) || in_.size() < n) return fail();
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool GetStatus(absl::Status* s) {
    int32_t code = 0;
    std::string msg;
    if (!Get(&code) || !GetString(&msg)) return false;
    if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) return fail();
    *s = absl::Status(static_cast<absl::StatusCode>(code), msg);
    return true;
  }
  bool GetQp(QpAddress* q) {
    if (!Get(&q->qpn) || !Get(&q->lid) || in_.size() < q->gid.size()) return fail();
    std::memcpy(q->gid.data(), in_.data(), q->gid.size());
    in_.remove_prefix(q->gid.size());
    return Get(&q->psn) && Get(&q->mtu);
  }
  bool GetQps(std::vector<QpAddress>* qps) {
    uint32_t n = 0;
    if (!Get(&n) || n > kMaxQpsPerPeer) return fail();
    qps->resize(n);
    for (auto& q : *qps) {
      if (!GetQp(&q)) return false;
    }
    return true;
  }
  // OK when everything parsed and nothing is left over.
  absl::Status Done(std::string_view what) const {
    if (failed_ || !in_.empty()) {
      return absl::InvalidArgumentError(StrCat("rdma side channel: malformed ", what));
    }
    return absl::OkStatus();
  }

 private:
  bool fail() {
    failed_ = true;
    return false;
  }
  std::string_view in_;
  bool failed_ = false;
};

void PutQps(Writer& w, const std::vector<QpAddress>& qps) {
  w.Put<uint32_t>(static_cast<uint32_t>(qps.size()));
  for (const auto& q : qps) w.PutQp(q);
}

struct FrameHeader {
  uint32_t magic = kSideMagic;
  uint8_t type = 0;
  uint8_t reserved[3] = {0, 0, 0};
  uint32_t body_len = 0;
};
static_assert(sizeof(FrameHeader) == 12);

}  // namespace

std::string Encode(const ConnectQps& m) {
  Writer w;
  PutQps(w, m.qps);
  return w.Take();
}
std::string Encode(const ConnectQpsReply& m) {
  Writer w;
  w.PutStatus(m.status);
  PutQps(w, m.qps);
  return w.Take();
}
std::string Encode(const Resolve& m) {
  Writer w;
  w.PutString(m.segment);
  w.PutString(m.capability);
  w.Put<uint8_t>(static_cast<uint8_t>(m.access));
  w.Put(m.offset);
  w.Put(m.length);
  return w.Take();
}
std::string Encode(const ResolveReply& m) {
  Writer w;
  w.PutStatus(m.status);
  w.Put(m.addr);
  w.Put(m.rkey);
  w.Put(m.size);
  return w.Take();
}
std::string Encode(const ReconnectQp& m) {
  Writer w;
  w.Put(m.index);
  w.PutQp(m.qp);
  return w.Take();
}
std::string Encode(const ReconnectQpReply& m) {
  Writer w;
  w.PutStatus(m.status);
  w.PutQp(m.qp);
  return w.Take();
}
std::string Encode(const VerifyWrite& m) {
  Writer w;
  w.PutString(m.segment);
  w.PutString(m.capability);
  w.Put(m.offset);
  w.Put(m.length);
  w.Put(m.checksum);
  return w.Take();
}
std::string Encode(const VerifyReply& m) {
  Writer w;
  w.PutStatus(m.status);
  return w.Take();
}

absl::StatusOr<ConnectQps> DecodeConnectQps(std::string_view body) {
  Reader r(body);
  ConnectQps m;
  r.GetQps(&m.qps);
  RETURN_IF_ERROR(r.Done("ConnectQps"));
  return m;
}
absl::StatusOr<ConnectQpsReply> DecodeConnectQpsReply(std::string_view body) {
  Reader r(body);
  ConnectQpsReply m;
  (void)(r.GetStatus(&m.status) && r.GetQps(&m.qps));
  RETURN_IF_ERROR(r.Done("ConnectQpsReply"));
  return m;
}
absl::StatusOr<Resolve> DecodeResolve(std::string_view body) {
  Reader r(body);
  Resolve m;
  uint8_t access = 0;
  (void)(r.GetString(&m.segment) && r.GetString(&m.capability) && r.Get(&access) &&
         r.Get(&m.offset) && r.Get(&m.length));
  RETURN_IF_ERROR(r.Done("Resolve"));
  if (access < 1 || access > 3) return absl::InvalidArgumentError("rdma: bad access in Resolve");
  m.access = static_cast<Access>(access);
  return m;
}
absl::StatusOr<ResolveReply> DecodeResolveReply(std::string_view body) {
  Reader r(body);
  ResolveReply m;
  (void)(r.GetStatus(&m.status) && r.Get(&m.addr) && r.Get(&m.rkey) && r.Get(&m.size));
  RETURN_IF_ERROR(r.Done("ResolveReply"));
  return m;
}
absl::StatusOr<ReconnectQp> DecodeReconnectQp(std::string_view body) {
  Reader r(body);
  ReconnectQp m;
  (void)(r.Get(&m.index) && r.GetQp(&m.qp));
  RETURN_IF_ERROR(r.Done("ReconnectQp"));
  return m;
}
absl::StatusOr<ReconnectQpReply> DecodeReconnectQpReply(std::string_view body) {
  Reader r(body);
  ReconnectQpReply m;
  (void)(r.GetStatus(&m.status) && r.GetQp(&m.qp));
  RETURN_IF_ERROR(r.Done("ReconnectQpReply"));
  return m;
}
absl::StatusOr<VerifyWrite> DecodeVerifyWrite(std::string_view body) {
  Reader r(body);
  VerifyWrite m;
  (void)(r.GetString(&m.segment) && r.GetString(&m.capability) && r.Get(&m.offset) &&
         r.Get(&m.length) && r.Get(&m.checksum));
  RETURN_IF_ERROR(r.Done("VerifyWrite"));
  return m;
}
absl::StatusOr<VerifyReply> DecodeVerifyReply(std::string_view body) {
  Reader r(body);
  VerifyReply m;
  r.GetStatus(&m.status);
  RETURN_IF_ERROR(r.Done("VerifyReply"));
  return m;
}

absl::Status SendFrame(int fd, MsgType type, std::string_view body) {
  if (body.size() > kMaxBody) return absl::InvalidArgumentError("rdma side channel: body too big");
  FrameHeader h;
  h.type = static_cast<uint8_t>(type);
  h.body_len = static_cast<uint32_t>(body.size());
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(body.data()), body.size()}};
  return wire::SendIov(fd, iov, 2);
}

absl::StatusOr<std::pair<MsgType, std::string>> RecvFrame(int fd) {
  FrameHeader h;
  RETURN_IF_ERROR(wire::RecvAll(fd, &h, sizeof(h)));
  if (h.magic != kSideMagic || h.body_len > kMaxBody || h.type < 1 ||
      h.type > static_cast<uint8_t>(MsgType::kVerifyReply)) {
    return absl::UnavailableError("rdma side channel: protocol error");
  }
  std::string body(h.body_len, '\0');
  if (!body.empty()) RETURN_IF_ERROR(wire::RecvAll(fd, body.data(), body.size()));
  return std::make_pair(static_cast<MsgType>(h.type), std::move(body));
}

absl::StatusOr<std::string> Call(int fd, MsgType type, std::string_view body, MsgType reply) {
  RETURN_IF_ERROR(SendFrame(fd, type, body));
  ASSIGN_OR_RETURN(auto frame, RecvFrame(fd));
  if (frame.first != reply) {
    return absl::UnavailableError(StrCat("rdma side channel: expected reply ",
                                         static_cast<int>(reply), ", got ",
                                         static_cast<int>(frame.first)));
  }
  return std::move(frame.second);
}

}  // namespace strata::transfer::rdma
