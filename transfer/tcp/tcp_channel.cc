// The client side of the tcp transport: TcpTransport::Connect and the epoll loop of a channel.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "common/status.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"
#include "transfer/tcp/tcp_transport.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(5);
constexpr absl::Duration kMaxRedial = absl::Seconds(1);
constexpr size_t kMaxIov = 64;
constexpr size_t kScratchBytes = 256 << 10;
// While a read payload streams in, the socket reports readable only once this many of its
// bytes (or all that remain, if fewer) have arrived (SO_RCVLOWAT): one wakeup and one large recv
// instead of one per arriving segment. Small enough that copying overlaps the rest arriving.
constexpr uint64_t kMaxLowat = 512 << 10;
// A read with a checksum is hashed piece by piece as it arrives, each piece right after its
// recv() while it is still in cache, instead of in a second pass over the whole buffer.
constexpr size_t kHashPiece = 256 << 10;

struct Op {
  TransferRequest req;
  size_t index = 0;
  std::shared_ptr<CompletionFn> done;
  wire::RequestHeader hdr;
  bool completed = false;
  std::unique_ptr<Checksum64Stream> sum;  // reads with a checksum: the bytes received so far

  uint64_t FrameSize() const {
    return sizeof(hdr) + req.segment.size() + req.capability.size() +
           (req.op == OpKind::kWrite ? req.length : 0);
  }
  void Complete(const absl::Status& status) {
    if (completed) return;
    completed = true;
    (*done)(index, status);
  }
};
using OpPtr = std::shared_ptr<Op>;

struct Conn {
  int fd = -1;
  bool alive = false;
  bool want_out = false;
  std::deque<OpPtr> send_queue;
  uint64_t send_pos = 0;       // bytes of send_queue.front()'s frame already sent
  std::deque<OpPtr> awaiting;  // fully sent, in response order
  uint64_t outstanding = 0;    // payload bytes queued or awaited
  enum class Rx { kHeader, kMessage, kPayload } rx = Rx::kHeader;
  wire::ResponseHeader rh;
  size_t rh_got = 0;
  std::string msg;
  size_t msg_got = 0;
  uint64_t payload_got = 0;
  int lowat = 1;  // the socket's SO_RCVLOWAT
};

class TcpChannel : public Channel {
 public:
  TcpChannel(const PeerSpec& peer, const Endpoint& endpoint, TcpTransportOptions options,
             int connections)
      : peer_name_(peer.name.empty() ? endpoint.address : peer.name),
        address_(endpoint.address),
        options_(std::move(options)),
        conns_(std::max(1, connections)),
        dead_(conns_.size()) {}

  ~TcpChannel() override {
    Close();
    // Closed here, not in Close(): a Submit racing with Close() may still Wake().
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  absl::Status Start(absl::Duration timeout) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) return ErrnoToStatus(errno, "epoll/eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = UINT64_MAX;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    for (size_t i = 0; i < conns_.size(); ++i) {
      ASSIGN_OR_RETURN(int fd, Dial(timeout));
      Install(i, fd);
    }
    loop_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  void Submit(std::vector<TransferRequest> requests, CompletionFn done) override {
    auto shared_done = std::make_shared<CompletionFn>(std::move(done));
    if (!closed_.load()) MaybeRedial();
    std::vector<OpPtr> ops;
    ops.reserve(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      TransferRequest& r = requests[i];
      if (r.local == nullptr || r.length == 0 || r.segment.empty() || r.segment.size() > 255 ||
          r.capability.size() > 65535) {
        (*shared_done)(i, absl::InvalidArgumentError(
                              "tcp: request needs a local buffer, a length, a segment name "
                              "(<=255 bytes) and a capability (<=65535 bytes)"));
        continue;
      }
      auto op = std::make_shared<Op>();
      op->index = i;
      op->done = shared_done;
      op->hdr.op = static_cast<uint8_t>(r.op);
      op->hdr.flags = (r.op == OpKind::kWrite && r.checksum) ? wire::kHasChecksum : 0;
      op->hdr.checksum = r.checksum.value_or(0);
      op->hdr.capability_len = static_cast<uint16_t>(r.capability.size());
      op->hdr.segment_len = static_cast<uint16_t>(r.segment.size());
      op->hdr.offset = r.offset;
      op->hdr.length = r.length;
      if (r.op == OpKind::kRead && r.checksum) op->sum = std::make_unique<Checksum64Stream>();
      op->req = std::move(r);
      ops.push_back(std::move(op));
    }
    if (ops.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Checked under mu_: Close() sets closed_ under it too, then drains pending_ after the
      // loop has stopped, so a request is either drained there or refused here.
      if (!closed_.load()) {
        for (auto& op : ops) pending_.push_back(std::move(op));
        ops.clear();
      }
    }
    if (!ops.empty()) {
      for (auto& op : ops) op->Complete(absl::CancelledError("tcp channel closed"));
      return;
    }
    Wake();
  }

  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_.exchange(true)) return;
    }
    Wake();
    if (loop_.joinable()) {
      loop_.join();
    } else {  // Start() failed part-way: no loop ever owned the connections
      for (Conn& c : conns_) {
        if (c.alive) close(c.fd);
        c.alive = false;
      }
    }
    std::vector<OpPtr> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [slot, fd] : new_conns_) close(fd);
      new_conns_.clear();
      left.swap(pending_);
    }
    for (auto& op : left) op->Complete(absl::CancelledError("tcp channel closed"));
  }

  void Disconnect() override {
    disconnect_.store(true);
    Wake();
  }

 private:
  absl::StatusOr<int> Dial(absl::Duration timeout) {
    ASSIGN_OR_RETURN(int fd, wire::DialTcp(address_, timeout));
    wire::SetSocketTimeouts(fd, timeout);
    if (auto st = wire::ClientHandshake(fd, options_.secret, wire::Purpose::kTcpData); !st.ok()) {
      close(fd);
      return Annotate(st, StrCat("tcp peer ", peer_name_));
    }
    wire::SetSocketTimeouts(fd, absl::ZeroDuration());
    wire::SetSocketBuffers(fd, options_.socket_buffer_bytes);
    return fd;
  }

  void Install(size_t slot, int fd) {
    Conn& c = conns_[slot];
    c = Conn{};
    c.fd = fd;
    c.alive = true;
    const int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = slot;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    dead_[slot].store(false);
  }

  // Re-dials lost connections from the submitting thread, at most once per 100 ms.
  void MaybeRedial() {
    if (dead_count_.load() == 0) return;
    std::lock_guard<std::mutex> dial_lock(dial_mu_);
    const absl::Time now = absl::Now();
    if (now - last_redial_ < absl::Milliseconds(100)) return;
    last_redial_ = now;
    for (size_t i = 0; i < dead_.size(); ++i) {
      if (!dead_[i].load()) continue;
      auto fd = Dial(kMaxRedial);
      if (!fd.ok()) {
        spdlog::warn("tcp: re-dialling {} failed: {}", peer_name_, fd.status().ToString());
        return;
      }
      dead_[i].store(false);
      dead_count_.fetch_sub(1);
      std::lock_guard<std::mutex> lock(mu_);
      new_conns_.emplace_back(i, *fd);
    }
  }

  void Wake() {
    const uint64_t one = 1;
    if (wake_fd_ >= 0) [[maybe_unused]]
      auto n = write(wake_fd_, &one, sizeof(one));
  }

  void Loop() {
    std::vector<char> scratch(kScratchBytes);
    scratch_ = scratch.data();
    epoll_event events[64];
    absl::Time next_tick = absl::Now() + kTick;
    while (!closed_.load()) {
      const int ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(next_tick - absl::Now()) + 1);
      const int n = epoll_wait(epoll_fd_, events, 64, ms);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == UINT64_MAX) {
          uint64_t v;
          [[maybe_unused]] auto r = read(wake_fd_, &v, sizeof(v));
          continue;
        }
        const size_t slot = events[i].data.u64;
        Conn& c = conns_[slot];
        if (!c.alive) continue;
        if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) Receive(slot);
        if (c.alive && (events[i].events & EPOLLOUT)) Send(slot);
      }
      if (disconnect_.exchange(false)) {
        for (size_t s = 0; s < conns_.size(); ++s) {
          if (conns_[s].alive) Teardown(s, absl::UnavailableError("tcp: link cut"), nullptr);
        }
      }
      TakePending();
      if (absl::Now() >= next_tick) {
        CheckDeadlines();
        next_tick = absl::Now() + kTick;
      }
    }
    for (size_t s = 0; s < conns_.size(); ++s) {
      if (conns_[s].alive) Teardown(s, absl::CancelledError("tcp channel closed"), nullptr);
    }
    std::vector<OpPtr> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(pending_);
    }
    for (auto& op : left) op->Complete(absl::CancelledError("tcp channel closed"));
  }

  void TakePending() {
    std::vector<OpPtr> ops;
    std::vector<std::pair<size_t, int>> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ops.swap(pending_);
      fresh.swap(new_conns_);
    }
    for (auto& [slot, fd] : fresh) Install(slot, fd);
    if (ops.empty()) return;
    std::vector<bool> touched(conns_.size(), false);
    for (auto& op : ops) {
      size_t best = SIZE_MAX;
      for (size_t s = 0; s < conns_.size(); ++s) {
        if (conns_[s].alive &&
            (best == SIZE_MAX || conns_[s].outstanding < conns_[best].outstanding)) {
          best = s;
        }
      }
      if (best == SIZE_MAX) {
        op->Complete(absl::UnavailableError(StrCat("tcp: no live connection to ", peer_name_)));
        continue;
      }
      op->hdr.id = next_id_++;
      conns_[best].outstanding += op->req.length;
      conns_[best].send_queue.push_back(std::move(op));
      touched[best] = true;
    }
    for (size_t s = 0; s < conns_.size(); ++s) {
      if (touched[s] && conns_[s].alive) Send(s);
    }
  }

  void SetWantOut(size_t slot, bool want) {
    Conn& c = conns_[slot];
    if (c.want_out == want) return;
    c.want_out = want;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? uint32_t{EPOLLOUT} : 0u);
    ev.data.u64 = slot;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void Send(size_t slot) {
    Conn& c = conns_[slot];
    while (c.alive && !c.send_queue.empty()) {
      iovec iov[kMaxIov];
      size_t n = 0;
      uint64_t skip = c.send_pos;
      for (const OpPtr& op : c.send_queue) {
        if (n + 4 > kMaxIov) break;
        const std::pair<const void*, uint64_t> pieces[4] = {
            {&op->hdr, sizeof(op->hdr)},
            {op->req.segment.data(), op->req.segment.size()},
            {op->req.capability.data(), op->req.capability.size()},
            {op->req.local, op->req.op == OpKind::kWrite ? op->req.length : 0}};
        for (const auto& [base, len] : pieces) {
          if (len == 0) continue;
          if (skip >= len) {
            skip -= len;
            continue;
          }
          iov[n++] = {const_cast<char*>(static_cast<const char*>(base)) + skip, len - skip};
          skip = 0;
        }
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      const ssize_t sent = sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          SetWantOut(slot, true);
          return;
        }
        Teardown(
            slot,
            absl::UnavailableError(StrCat("tcp: sending to ", peer_name_, ": ", strerror(errno))),
            nullptr);
        return;
      }
      uint64_t bytes = static_cast<uint64_t>(sent);
      while (bytes > 0) {
        OpPtr& front = c.send_queue.front();
        const uint64_t left = front->FrameSize() - c.send_pos;
        if (bytes >= left) {
          bytes -= left;
          c.send_pos = 0;
          c.awaiting.push_back(std::move(front));
          c.send_queue.pop_front();
        } else {
          c.send_pos += bytes;
          bytes = 0;
        }
      }
    }
    if (c.alive) SetWantOut(slot, false);
  }

  // Reads what the socket has; returns when it would block or the connection died.
  void Receive(size_t slot) {
    Conn& c = conns_[slot];
    while (c.alive) {
      void* dst = nullptr;
      size_t want = 0;
      switch (c.rx) {
        case Conn::Rx::kHeader:
          dst = reinterpret_cast<char*>(&c.rh) + c.rh_got;
          want = sizeof(c.rh) - c.rh_got;
          break;
        case Conn::Rx::kMessage:
          dst = c.msg.data() + c.msg_got;
          want = c.msg.size() - c.msg_got;
          break;
        case Conn::Rx::kPayload: {
          const Op& op = *c.awaiting.front();
          const uint64_t left = c.rh.payload_len - c.payload_got;
          if (!op.completed) {
            dst = static_cast<char*>(op.req.local) + c.payload_got;
            want = op.sum ? std::min<uint64_t>(left, kHashPiece) : left;
          } else {  // timed out: the caller's buffer is no longer ours
            dst = scratch_;
            want = std::min<uint64_t>(left, kScratchBytes);
          }
          break;
        }
      }
      const ssize_t got = recv(c.fd, dst, want, MSG_DONTWAIT);
      if (got == 0) {
        Teardown(slot,
                 absl::UnavailableError(StrCat("tcp: ", peer_name_, " closed the connection")),
                 nullptr);
        return;
      }
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        Teardown(slot,
                 absl::UnavailableError(
                     StrCat("tcp: receiving from ", peer_name_, ": ", strerror(errno))),
                 nullptr);
        return;
      }
      switch (c.rx) {
        case Conn::Rx::kHeader:
          c.rh_got += static_cast<size_t>(got);
          if (c.rh_got == sizeof(c.rh)) OnHeader(slot);
          break;
        case Conn::Rx::kMessage:
          c.msg_got += static_cast<size_t>(got);
          if (c.msg_got == c.msg.size()) AfterMessage(slot);
          break;
        case Conn::Rx::kPayload:
          if (Op& op = *c.awaiting.front(); op.sum && !op.completed) {
            op.sum->Update(dst, static_cast<size_t>(got));
          }
          c.payload_got += static_cast<uint64_t>(got);
          if (c.payload_got == c.rh.payload_len) {
            Finish(slot);
          } else {
            SetLowat(c, c.rh.payload_len - c.payload_got);
          }
          break;
      }
    }
  }

  void OnHeader(size_t slot) {
    Conn& c = conns_[slot];
    const bool ok_so_far = c.rh.magic == wire::kResponseMagic && !c.awaiting.empty() &&
                           c.awaiting.front()->hdr.id == c.rh.id &&
                           c.rh.message_len <= wire::kMaxMessage;
    const Op* op = ok_so_far ? c.awaiting.front().get() : nullptr;
    const uint64_t expected_payload =
        (op != nullptr && op->req.op == OpKind::kRead && c.rh.code == 0) ? op->req.length : 0;
    if (op == nullptr || c.rh.payload_len != expected_payload) {
      Teardown(slot, absl::UnavailableError(StrCat("tcp: protocol error from ", peer_name_)),
               nullptr);
      return;
    }
    c.msg.assign(c.rh.message_len, '\0');
    c.msg_got = 0;
    c.rx = Conn::Rx::kMessage;
    if (c.msg.empty()) AfterMessage(slot);
  }

  void AfterMessage(size_t slot) {
    Conn& c = conns_[slot];
    c.payload_got = 0;
    c.rx = Conn::Rx::kPayload;
    if (c.rh.payload_len == 0) {
      Finish(slot);
    } else {
      SetLowat(c, c.rh.payload_len);
    }
  }

  // Never above what is still to come on this connection for the current payload: the socket
  // must become readable once the payload is complete even if nothing follows it.
  static void SetLowat(Conn& c, uint64_t remaining) {
    // STRATA_TCP_RCVLOWAT=0 turns this off (diagnostics: A/B in `strata bench transfer`).
    static const bool enabled = [] {
      const char* v = std::getenv("STRATA_TCP_RCVLOWAT");
      return v == nullptr || std::string_view(v) != "0";
    }();
    if (!enabled) return;
    const int want = static_cast<int>(std::clamp<uint64_t>(remaining, 1, kMaxLowat));
    if (want == c.lowat) return;
    if (setsockopt(c.fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) c.lowat = want;
  }

  void Finish(size_t slot) {
    Conn& c = conns_[slot];
    OpPtr op = std::move(c.awaiting.front());
    c.awaiting.pop_front();
    c.outstanding -= op->req.length;
    c.rx = Conn::Rx::kHeader;
    c.rh_got = 0;
    SetLowat(c, 1);  // headers are small
    if (c.rh.code == 0 && op->sum && op->sum->Digest() != *op->req.checksum) {
      op->Complete(absl::DataLossError(StrCat("tcp: read of ", op->req.segment, " [",
                                              op->req.offset, ", +", op->req.length, ") from ",
                                              peer_name_, " does not match its checksum")));
    } else if (c.rh.code == 0) {
      op->Complete(absl::OkStatus());
    } else {
      op->Complete(absl::Status(static_cast<absl::StatusCode>(c.rh.code),
                                StrCat("tcp peer ", peer_name_, ": ", c.msg)));
    }
  }

  // Closes a connection; its requests fail with `why` (`timed_out` with DeadlineExceeded).
  void Teardown(size_t slot, const absl::Status& why, const Op* timed_out) {
    Conn& c = conns_[slot];
    if (!c.alive) return;
    // Log before completing: once the last request completes, its batch (which may share
    // `why`'s storage) can be freed by the caller.
    if (!closed_.load()) {
      spdlog::warn("tcp: connection {} to {} lost: {}", slot, peer_name_, why.ToString());
    }
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
    c.alive = false;
    std::vector<OpPtr> ops(c.send_queue.begin(), c.send_queue.end());
    ops.insert(ops.end(), c.awaiting.begin(), c.awaiting.end());
    c = Conn{};
    if (!closed_.load()) {
      dead_[slot].store(true);
      dead_count_.fetch_add(1);
    }
    for (OpPtr& op : ops) {
      // A status of its own per request: no storage shared between batches.
      op->Complete(op.get() == timed_out
                       ? absl::DeadlineExceededError(StrCat("tcp: ", peer_name_, " timed out"))
                       : absl::Status(why.code(), why.message()));
    }
  }

  void CheckDeadlines() {
    const absl::Time now = absl::Now();
    for (size_t s = 0; s < conns_.size(); ++s) {
      Conn& c = conns_[s];
      if (!c.alive) continue;
      if (!c.send_queue.empty() && c.send_pos > 0 && c.send_queue.front()->req.deadline <= now) {
        // Half-sent: the stream cannot be resynchronised without the caller's buffer.
        Teardown(s,
                 absl::UnavailableError(StrCat("tcp: connection to ", peer_name_,
                                               " closed after a request timed out mid-send")),
                 c.send_queue.front().get());
        continue;
      }
      std::deque<OpPtr> keep;
      for (OpPtr& op : c.send_queue) {
        if (op->req.deadline <= now && !(c.send_pos > 0 && op == c.send_queue.front())) {
          c.outstanding -= op->req.length;
          op->Complete(absl::DeadlineExceededError(
              StrCat("tcp: request to ", peer_name_, " not sent before its deadline")));
        } else {
          keep.push_back(std::move(op));
        }
      }
      c.send_queue.swap(keep);
      for (OpPtr& op : c.awaiting) {
        if (!op->completed && op->req.deadline <= now) {
          op->Complete(absl::DeadlineExceededError(
              StrCat("tcp: no answer from ", peer_name_, " before the deadline")));
        }
      }
    }
  }

  const std::string peer_name_;
  const std::string address_;
  const TcpTransportOptions options_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread loop_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> disconnect_{false};

  // Loop-thread state.
  std::vector<Conn> conns_;
  uint64_t next_id_ = 1;
  char* scratch_ = nullptr;

  // Shared with submitters.
  std::mutex mu_;
  std::vector<OpPtr> pending_;                     // guarded by mu_
  std::vector<std::pair<size_t, int>> new_conns_;  // guarded by mu_
  std::vector<std::atomic<bool>> dead_;
  std::atomic<int> dead_count_{0};
  std::mutex dial_mu_;
  absl::Time last_redial_ = absl::InfinitePast();  // guarded by dial_mu_
};

// Several TcpChannels to one peer, each with its own loop thread and a share of the connections:
// receiving (a copy per byte, plus hashing for checked reads) runs on as many cores as there are
// lanes instead of one.
class TcpLanes : public Channel {
 public:
  static constexpr uint64_t kSpreadBytes = 512 << 10;

  explicit TcpLanes(std::vector<std::unique_ptr<TcpChannel>> lanes)
      : lanes_(std::move(lanes)), outstanding_(lanes_.size()) {}
  // Closed here, while outstanding_ still exists: closing completes what is pending.
  ~TcpLanes() override { Close(); }

  void Submit(std::vector<TransferRequest> requests, CompletionFn done) override {
    struct Split {
      std::vector<TransferRequest> requests;
      std::vector<size_t> index;  // of each request in the caller's batch
      uint64_t bytes = 0;
    };
    std::vector<Split> split(lanes_.size());
    std::vector<uint64_t> load(lanes_.size());
    for (size_t l = 0; l < lanes_.size(); ++l) load[l] = outstanding_[l].load();
    // Lanes fill in order: a request goes to the first lane with less than kSpreadBytes
    // outstanding, else to the least loaded one. Light traffic stays on one thread (one wakeup
    // per batch, as with a single loop); bulk traffic spreads over all of them.
    auto pick = [&load] {
      for (size_t l = 0; l < load.size(); ++l) {
        if (load[l] < kSpreadBytes) return l;
      }
      return size_t(std::min_element(load.begin(), load.end()) - load.begin());
    };
    for (size_t i = 0; i < requests.size(); ++i) {
      const size_t l = pick();
      load[l] += requests[i].length;
      split[l].bytes += requests[i].length;
      split[l].index.push_back(i);
      split[l].requests.push_back(std::move(requests[i]));
    }
    auto shared_done = std::make_shared<CompletionFn>(std::move(done));
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (split[l].requests.empty()) continue;
      outstanding_[l].fetch_add(split[l].bytes);
      auto index = std::make_shared<std::vector<size_t>>(std::move(split[l].index));
      auto lengths = std::make_shared<std::vector<uint64_t>>();
      for (const TransferRequest& r : split[l].requests) lengths->push_back(r.length);
      lanes_[l]->Submit(std::move(split[l].requests),
                        [this, l, index, lengths, shared_done](size_t i, const absl::Status& st) {
                          outstanding_[l].fetch_sub((*lengths)[i]);
                          (*shared_done)((*index)[i], st);
                        });
    }
  }

  void Close() override {
    for (auto& lane : lanes_) lane->Close();
  }

  void Disconnect() override {
    for (auto& lane : lanes_) lane->Disconnect();
  }

 private:
  std::vector<std::unique_ptr<TcpChannel>> lanes_;
  std::vector<std::atomic<uint64_t>> outstanding_;  // payload bytes submitted, not completed
};

}  // namespace

absl::StatusOr<std::unique_ptr<Channel>> TcpTransport::Connect(const PeerSpec& peer,
                                                               const Endpoint& endpoint,
                                                               absl::Duration timeout) {
  if (endpoint.kind != TransportKind::kTcp) {
    return absl::InvalidArgumentError("tcp transport given a non-tcp endpoint");
  }
  const int connections = std::max(1, options_.connections_per_peer);
  const int lanes = std::clamp(options_.threads_per_peer, 1, connections);
  std::vector<std::unique_ptr<TcpChannel>> channels;
  for (int l = 0; l < lanes; ++l) {
    // Connections dealt out as evenly as they go: 4 over 3 lanes is 2 + 1 + 1.
    const int mine = connections / lanes + (l < connections % lanes ? 1 : 0);
    auto channel = std::make_unique<TcpChannel>(peer, endpoint, options_, mine);
    RETURN_IF_ERROR(channel->Start(timeout));
    channels.push_back(std::move(channel));
  }
  if (channels.size() == 1) return std::unique_ptr<Channel>(std::move(channels[0]));
  return std::make_unique<TcpLanes>(std::move(channels));
}

}  // namespace strata::transfer
