// strata bench store: put/get throughput and latency of a cache server (in this process, reached
// over gRPC + the transfer engine exactly as a worker reaches it) by block size, client count
// and transport, DRAM hits and SSD hits; side by side a Redis 7 server on loopback doing SET/GET
// of the same sizes with the same client count, and the raw O_DIRECT read speed of the disk the
// SSD tier lives on. Every get lands in the client's own buffer and is checked by checksum.
// Batched like a worker's fetch/save: one operation moves `--batch` blocks with one control
// round trip (Reserve+Commit, Lookup+Release) and one transfer batch; Redis gets the same
// batching as a pipeline of as many SET/GET commands.
#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "cache_service/cache_server.h"
#include "cli/commands.h"
#include "common/block_key.h"
#include "common/checksum.h"
#include "common/config.h"
#include "common/scratch_dir.h"
#include "common/strings.h"
#include "strata/v1/cache.grpc.pb.h"
#include "transfer/transfer_engine.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string system, op, transport, tier;
  uint64_t size = 0;
  int clients = 0;
  int batch = 1;  // blocks per operation (one control round trip + one transfer batch)
  int round = 0;
  uint64_t ops = 0;                            // operations (batches) completed
  double seconds = 0, p50_us = 0, p99_us = 0;  // latency of one operation (a whole batch)
  uint64_t blocks() const { return ops * uint64_t(batch); }
  double gbps() const { return blocks() * double(size) / seconds / 1e9; }
};

Result Summarize(std::vector<std::vector<double>>& lat, double seconds) {
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.ops = all.size();
  r.seconds = seconds;
  if (!all.empty()) {
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  return r;
}

// Runs `fn(client, i)` `ops` times per client on `clients` threads; latencies in µs.
template <typename Fn>
Result RunClients(int clients, int ops, Fn fn) {
  std::vector<std::vector<double>> lat(clients);
  std::atomic<bool> failed{false};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < ops && !failed; ++i) {
        const auto t0 = Clock::now();
        if (!fn(c, i)) {
          failed = true;
          break;
        }
        lat[c].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed) Fail(1, "bench store: an operation failed (see log)");
  return Summarize(lat, secs);
}

// --- Redis over RESP, one connection per client -----------------------------------------------

class Redis {
 public:
  explicit Redis(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~Redis() { close(fd_); }
  bool ok() const { return ok_; }
  // Pipelined: every SET is sent before the replies are read (the same batching the cache
  // server gets: one round trip per batch, not per value).
  bool SetMany(const std::vector<std::string>& keys, const std::string& value) {
    for (const std::string& key : keys) {
      const std::string head =
          StrCat("*3\r\n$3\r\nSET\r\n$", key.size(), "\r\n", key, "\r\n$", value.size(), "\r\n");
      if (!SendAll(head.data(), head.size()) || !SendAll(value.data(), value.size()) ||
          !SendAll("\r\n", 2)) {
        return false;
      }
    }
    std::string line;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!ReadLine(&line) || line != "+OK") return false;
    }
    return true;
  }
  // Pipelined GETs; value i is read straight into out + i * size (the client's own buffer).
  bool GetMany(const std::vector<std::string>& keys, char* out, size_t size) {
    std::string cmds;
    for (const std::string& key : keys) {
      StrAppend(&cmds, "*2\r\n$3\r\nGET\r\n$", key.size(), "\r\n", key, "\r\n");
    }
    if (!SendAll(cmds.data(), cmds.size())) return false;
    std::string line;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!ReadLine(&line) || line.empty() || line[0] != '$') return false;
      const auto n = ParseInt64(std::string_view(line).substr(1));
      if (!n || *n < 0 || static_cast<size_t>(*n) != size) return false;
      if (!ReadExact(out + i * size, size) || !ReadExact(crlf_, 2)) return false;
    }
    return true;
  }

 private:
  bool SendAll(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = send(fd_, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w, n -= w;
    }
    return true;
  }
  bool ReadExact(char* p, size_t n) {
    // Drain what ReadLine buffered first.
    const size_t from_buf = std::min(n, buf_.size());
    std::memcpy(p, buf_.data(), from_buf);
    buf_.erase(0, from_buf);
    p += from_buf, n -= from_buf;
    while (n > 0) {
      const ssize_t r = recv(fd_, p, n, 0);
      if (r <= 0) return false;
      p += r, n -= r;
    }
    return true;
  }
  bool ReadLine(std::string* line) {
    for (;;) {
      if (const size_t pos = buf_.find("\r\n"); pos != std::string::npos) {
        *line = buf_.substr(0, pos);
        buf_.erase(0, pos + 2);
        return true;
      }
      char tmp[256];
      const ssize_t r = recv(fd_, tmp, sizeof(tmp), 0);
      if (r <= 0) return false;
      buf_.append(tmp, r);
    }
  }
  int fd_ = -1;
  bool ok_ = false;
  std::string buf_;
  char crlf_[2];
};

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// --- raw O_DIRECT reads of the SSD tier's own slots --------------------------------------------

// Where one block sits on the SSD tier: a slot file and an offset in it.
struct SlotExtent {
  std::string path;
  uint64_t offset = 0;
};

// Reads every extent once with O_DIRECT through io_uring, keeping `queue_depth` reads in flight
// from one thread: the same bytes on the same disk that the store's SSD hits read, with as many
// reads in flight as they can have (clients x blocks per batch), by the cheapest way Linux has
// to read a disk. GB/s.
double RawDirectReadGBps(const std::vector<SlotExtent>& extents, uint64_t size, int queue_depth) {
  std::map<std::string, int> fds;
  for (const SlotExtent& e : extents) {
    if (fds.contains(e.path)) continue;
    const int fd = open(e.path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) Fail(1, StrCat("bench store: open ", e.path, ": ", std::strerror(errno)));
    fds[e.path] = fd;
  }
  const uint64_t length = (size + 4095) / 4096 * 4096;
  std::vector<std::unique_ptr<char, decltype(&std::free)>> bufs;
  for (int t = 0; t < queue_depth; ++t) {
    bufs.emplace_back(static_cast<char*>(std::aligned_alloc(4096, length)), &std::free);
    std::memset(bufs.back().get(), 0, length);
  }
  io_uring ring;
  if (const int rc = io_uring_queue_init(queue_depth, &ring, 0); rc < 0) {
    Fail(1, StrCat("bench store: io_uring_queue_init: ", std::strerror(-rc)));
  }
  size_t next = 0, done = 0;
  auto submit = [&](int buf) {
    const SlotExtent& e = extents[next++];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fds[e.path], bufs[buf].get(), length, e.offset);
    io_uring_sqe_set_data64(sqe, buf);
  };
  const auto start = Clock::now();
  for (int b = 0; b < queue_depth && next < extents.size(); ++b) submit(b);
  while (done < extents.size()) {
    io_uring_cqe* cqe = nullptr;
    if (const int rc = io_uring_submit_and_wait(&ring, 1); rc < 0 && rc != -EINTR) {
      Fail(1, StrCat("bench store: io_uring_submit: ", std::strerror(-rc)));
    }
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      if (cqe->res != static_cast<int>(length)) Fail(1, "bench store: raw O_DIRECT read failed");
      const int buf = static_cast<int>(io_uring_cqe_get_data64(cqe));
      io_uring_cqe_seen(&ring, cqe);
      ++done;
      if (next < extents.size()) submit(buf);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  io_uring_queue_exit(&ring);
  for (const auto& [path, fd] : fds) close(fd);
  return extents.size() * double(size) / seconds / 1e9;
}

}  // namespace

void RegisterBenchStoreCommand(CLI::App& app) {
  CLI::App* cmd = BenchGroup(app).add_subcommand(
      "store", "Cache server put/get (shm, tcp; DRAM and SSD hits) against Redis and raw O_DIRECT");
  struct Flags {
    std::vector<std::string> sizes = {"64KiB", "1MiB", "4MiB"};
    int clients = 4;
    int ops = 64;
    int batch = 8;
    int rounds = 5;
    std::vector<std::string> transports = {"shm", "tcp"};
    bool redis = true;
    int tcp_connections = 4;
    int tcp_threads = 4;
    std::string dir;
    std::string json;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--sizes", f->sizes, "Block sizes")->delimiter(',');
  cmd->add_option("--clients", f->clients, "Concurrent clients");
  cmd->add_option("--ops", f->ops, "Blocks per client per case (rounded down to whole batches)");
  cmd->add_option("--batch", f->batch,
                  "Blocks per operation: one Reserve+Commit or Lookup+Release and one transfer "
                  "batch (Redis: one pipeline of as many SET/GET)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--rounds", f->rounds,
                  "Rounds of every case; each ratio is the median of the rounds' ratios")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--transports", f->transports, "Transports to measure the store over")
      ->delimiter(',')
      ->check(CLI::IsMember({"shm", "tcp"}));
  cmd->add_option("--tcp-connections", f->tcp_connections, "tcp connections per client")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tcp-threads", f->tcp_threads, "tcp receiving threads per client")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--redis", f->redis, "Measure Redis side by side (the *_vs_redis ratios)");
  cmd->add_option("--dir", f->dir, "Where the SSD tier lives (default: a temp dir)");
  cmd->add_option("--json", f->json, "Write results and `ratios` to this file");
  cmd->callback([f] {
    std::vector<uint64_t> sizes;
    for (const auto& s : f->sizes) {
      auto b = ParseBytes(s);
      if (!b.ok() || *b == 0) Fail(2, StrCat("--sizes: bad size '", s, "'"));
      sizes.push_back(*b);
    }
    const uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
    const int batch = f->batch;
    const int batches = std::max(1, f->ops / batch);  // operations per client per case
    const int nblocks = batches * batch;              // blocks per client per case
    std::optional<ScratchDir> scratch;                // without --dir: removed on every way out
    if (f->dir.empty()) {
      auto made = ScratchDir::Create("strata-bench-store-");
      if (!made.ok()) Fail(1, std::string(made.status().message()));
      scratch = std::move(*made);
    }
    const std::string dir = scratch ? scratch->path() : f->dir;
    std::filesystem::create_directories(dir);
    const uint64_t slot = (max_size + 4095) / 4096 * 4096;
    const uint64_t blocks = uint64_t(f->clients) * nblocks * 2 + batch + 16;

    cache::CacheServerOptions o;
    o.store.data_dir = dir + "/data";
    o.store.slot_bytes = slot;
    o.store.dram_capacity_bytes = blocks * slot;
    o.store.ssd_capacity_bytes = blocks * slot;
    o.store.dram_prefault = true;  // as `strata cache` does by default
    constexpr uint32_t kSlotsPerFile = 64;
    o.store.ssd_slots_per_file = kSlotsPerFile;
    o.store.write_policy = cache::WritePolicy::kOnEvict;
    o.host_id = "bench-host";
    o.http_listen = "";
    o.cluster_secret = "bench";
    o.shm_socket_path = dir + "/shm.sock";
    cache::CacheServer server(o);
    if (absl::Status st = server.Start(); !st.ok()) Fail(1, StrCat("cache server: ", st.message()));
    auto channel = grpc::CreateChannel(StrCat("127.0.0.1:", server.grpc_port()),
                                       grpc::InsecureChannelCredentials());
    auto control = v1::CacheControl::NewStub(channel);
    grpc::ClientContext cctx;
    v1::ConnectRequest creq;
    creq.set_host_id("bench-host");
    v1::ConnectResponse cresp;
    if (!control->Connect(&cctx, creq, &cresp).ok()) Fail(1, "connect failed");
    transfer::PeerSpec spec{.name = "cache", .host_id = cresp.host_id()};
    for (const auto& ep : cresp.segments(0).endpoints()) {
      spec.endpoints.push_back({.kind = static_cast<transfer::TransportKind>(ep.kind()),
                                .address = ep.address(),
                                .host_id = ep.host_id()});
    }

    // Redis 7, persistence off, loopback.
    const int redis_port = FreePort();
    const pid_t redis = f->redis ? fork() : -1;
    if (f->redis && redis < 0) Fail(1, StrCat("bench store: fork: ", std::strerror(errno)));
    if (redis == 0) {
      // Ends with the bench, also when the bench fails (exit() runs no destructors here).
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      const std::string port = std::to_string(redis_port);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning",
             "--proto-max-bulk-len", "1gb", (char*)nullptr);
      _exit(127);
    }
    for (int i = 0; f->redis && i < 100 && !Redis(redis_port).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }

    std::vector<Result> results;
    int ns_serial = 0;
    for (int round = 0; round < f->rounds; ++round) {
      for (const uint64_t size : sizes) {
        for (const std::string& tname : f->transports) {
          const auto kind =
              tname == "shm" ? transfer::TransportKind::kShm : transfer::TransportKind::kTcp;
          auto engine =
              transfer::TransferEngine::Create({.host_id = "bench-host",
                                                .secret = transfer::ClusterSecret("bench"),
                                                .force_transport = kind,
                                                .tcp_connections_per_peer = f->tcp_connections,
                                                .tcp_threads_per_peer = f->tcp_threads,
                                                .enable_rdma = false});
          if (!engine.ok()) Fail(1, StrCat("engine: ", engine.status().message()));
          auto peer = (*engine)->OpenPeer(spec);
          if (!peer.ok()) Fail(1, StrCat("peer: ", peer.status().message()));
          const Namespace ns = MakeNamespace({}, {}, StrCat("bench-", ++ns_serial));
          std::vector<std::vector<BlockKey>> keys(f->clients);
          // Per client: the payloads of one batch (put) and a batch-sized read buffer (get), both
          // touched before the clock starts, as Redis's buffers are.
          std::vector<std::string> payload(f->clients, std::string(size * batch, '\0'));
          std::vector<std::string> readbuf(f->clients, std::string(size * batch, '\1'));
          for (int c = 0; c < f->clients; ++c) {
            std::vector<uint32_t> tokens(uint64_t(nblocks + batch) * 64);  // + one warm-up batch
            for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = c * 1000003u + t;
            keys[c] = ComputeBlockKeys(ns, tokens);
            for (size_t b = 0; b < payload[c].size(); b += 8) {
              const uint64_t v = (b + c) * 0x9E3779B97F4A7C15ull;
              std::memcpy(payload[c].data() + b, &v, std::min<size_t>(8, payload[c].size() - b));
            }
          }
          // Operation i of client c covers blocks [i * batch, (i + 1) * batch) of its chain.
          auto put = [&](int c, int i) {
            char* data = payload[c].data();
            v1::ReserveRequest req;
            req.set_namespace_id(std::string(ns.View()));
            for (int j = 0; j < batch; ++j) {
              const int k = i * batch + j;
              std::memcpy(data + size_t(j) * size, &k, sizeof(k));  // every block distinct
              auto* b = req.add_blocks();
              b->set_key(std::string(keys[c][k].View()));
              if (k > 0) b->set_parent_key(std::string(keys[c][k - 1].View()));
              b->set_payload_bytes(size);
            }
            grpc::ClientContext rctx;
            v1::ReserveResponse resp;
            if (!control->Reserve(&rctx, req, &resp).ok()) return false;
            std::vector<transfer::TransferOp> ops;
            for (int j = 0; j < batch; ++j) {
              if (resp.slots(j).status().code() != 0) return false;
              const auto& loc = resp.slots(j).location();
              ops.push_back({.op = transfer::OpKind::kWrite,
                             .local = data + size_t(j) * size,
                             .segment = loc.segment(),
                             .offset = loc.offset(),
                             .length = size,
                             .capability = loc.capability()});
            }
            auto tb = (*engine)->Submit(**peer, std::move(ops));
            if (!tb->Wait(absl::Seconds(30)) || !tb->FirstError().ok()) return false;
            v1::CommitRequest commit;
            commit.set_lease_id(resp.lease().lease_id());
            for (int j = 0; j < batch; ++j) {
              auto* cb = commit.add_blocks();
              cb->set_key(std::string(keys[c][i * batch + j].View()));
              cb->set_checksum(Checksum64(data + size_t(j) * size, size));
            }
            grpc::ClientContext mctx;
            v1::CommitResponse mresp;
            if (!control->Commit(&mctx, commit, &mresp).ok()) return false;
            for (const auto& r : mresp.results()) {
              if (r.code() != 0) return false;
            }
            return true;
          };
          auto get = [&](int c, int i) {
            char* buf = readbuf[c].data();
            v1::LookupRequest req;
            req.set_namespace_id(std::string(ns.View()));
            for (int j = 0; j < batch; ++j) {
              req.add_keys(std::string(keys[c][i * batch + j].View()));
            }
            req.set_lease(true);
            req.set_promote(true);
            grpc::ClientContext lctx;
            v1::LookupResponse resp;
            if (!control->Lookup(&lctx, req, &resp).ok() ||
                resp.hit_blocks() != static_cast<uint32_t>(batch)) {
              return false;
            }
            std::vector<transfer::TransferOp> ops;
            for (int j = 0; j < batch; ++j) {
              const auto& loc = resp.locations(j);
              ops.push_back({.op = transfer::OpKind::kRead,
                             .local = buf + size_t(j) * size,
                             .segment = loc.segment(),
                             .offset = loc.offset(),
                             .length = size,
                             .capability = loc.capability(),
                             // Checked against the bytes in `buf`: by shm while it copies, by
                             // the engine after a tcp read (a mismatch fails the operation).
                             .checksum = loc.checksum()});
            }
            auto tb = (*engine)->Submit(**peer, std::move(ops));
            const bool ok = tb->Wait(absl::Seconds(30)) && tb->FirstError().ok();
            grpc::ClientContext relctx;
            v1::ReleaseRequest rel;
            rel.set_lease_id(resp.lease().lease_id());
            v1::ReleaseResponse relresp;
            control->Release(&relctx, rel, &relresp);
            return ok;
          };
          auto add = [&](Result r, std::string op, std::string tier) {
            r.system = "strata";
            r.op = std::move(op);
            r.transport = tname;
            r.tier = std::move(tier);
            r.size = size;
            r.clients = f->clients;
            r.batch = batch;
            r.round = round;
            results.push_back(r);
          };
          // Untimed warm-up batch: opens the data path (the shm transport maps the arena).
          if (!put(0, batches)) Fail(1, "bench store: warm-up put failed");
          add(RunClients(f->clients, batches, put), "put", "dram");
          add(RunClients(f->clients, batches, get), "get", "dram");
          // SSD hits: everything leaves DRAM for SSD, then each get promotes (checksum-verified).
          v1::DrainResponse dresp;
          if (!server.store().Drain({}, &dresp).ok()) Fail(1, "drain failed");
          // The raw baseline reads the very slots these SSD hits read (a Lookup without lease or
          // promotion answers with their SSD locations), at the same queue depth; which of the two
          // goes first alternates, so neither always finds the disk (or the host's cache) warmer.
          // In the order the clients ask for them: operation i of every client, then i + 1.
          std::vector<SlotExtent> extents(size_t(f->clients) * nblocks);
          for (int c = 0; c < f->clients; ++c) {
            v1::LookupRequest lreq;
            lreq.set_namespace_id(std::string(ns.View()));
            for (int k = 0; k < nblocks; ++k) lreq.add_keys(std::string(keys[c][k].View()));
            grpc::ClientContext lctx;
            v1::LookupResponse lresp;
            if (!control->Lookup(&lctx, lreq, &lresp).ok() ||
                lresp.hit_blocks() != uint32_t(nblocks)) {
              Fail(1, "bench store: the drained blocks are not all on SSD");
            }
            for (int k = 0; k < nblocks; ++k) {
              const auto& loc = lresp.locations(k);
              if (loc.tier() != v1::TIER_SSD) Fail(1, "bench store: a drained block is not on SSD");
              const uint64_t s = loc.offset() / slot;
              extents[(size_t(k / batch) * f->clients + c) * batch + k % batch] = {
                  StrCat(dir, "/data/ssd/slots-", s / kSlotsPerFile, ".dat"),
                  s % kSlotsPerFile * slot};
            }
          }
          auto raw = [&] {
            Result r;
            r.system = "raw_odirect";
            r.op = "read";
            r.transport = "-";
            r.tier = "ssd";
            r.size = size;
            r.clients = f->clients * batch;
            r.round = round;
            r.seconds = 1;
            const double gbps = RawDirectReadGBps(extents, size, f->clients * batch);
            if (gbps <= 0) Fail(1, "bench store: raw O_DIRECT read failed");
            r.ops = static_cast<uint64_t>(gbps * 1e9 / size);
            results.push_back(r);
          };
          const bool raw_first = (round + int(kind == transfer::TransportKind::kTcp)) % 2 == 0;
          if (raw_first) raw();
          add(RunClients(f->clients, batches, get), "get", "ssd");
          if (!raw_first) raw();
          v1::EvictRequest ev;
          ev.mutable_selector()->set_all(true);
          v1::EvictResponse eresp;
          (void)server.store().Evict(ev, &eresp);
        }
        if (!f->redis) continue;
        // Redis, same sizes, clients and batching (pipelined SET/GET).
        std::vector<std::unique_ptr<Redis>> conns;
        for (int c = 0; c < f->clients; ++c) conns.push_back(std::make_unique<Redis>(redis_port));
        std::string value(size, 'v');
        const uint64_t value_sum = Checksum64(value);
        std::vector<std::string> rbuf(f->clients, std::string(size * batch, '\1'));
        // Redis both ways: one command per round trip and pipelines of `batch` (large pipelines can
        // be slower for Redis with big values); the ratios use whichever is faster.
        std::vector<int> redis_batches = {1};
        if (batch > 1) redis_batches.push_back(batch);
        for (const int rb : redis_batches) {
          auto redis_keys = [&](int c, int i) {
            std::vector<std::string> k;
            for (int j = 0; j < rb; ++j) k.push_back(StrCat("k", c, "-", i * rb + j, "-", size));
            return k;
          };
          auto add_redis = [&](Result r, std::string op) {
            r.system = "redis";
            r.op = std::move(op);
            r.transport = "tcp";
            r.tier = "dram";
            r.size = size;
            r.clients = f->clients;
            r.batch = rb;
            r.round = round;
            results.push_back(r);
          };
          const int rops = nblocks / rb;
          add_redis(
              RunClients(f->clients, rops,
                         [&](int c, int i) { return conns[c]->SetMany(redis_keys(c, i), value); }),
              "put");
          add_redis(RunClients(f->clients, rops,
                               [&](int c, int i) {
                                 char* buf = rbuf[c].data();
                                 if (!conns[c]->GetMany(redis_keys(c, i), buf, size)) return false;
                                 for (int j = 0; j < rb; ++j) {
                                   if (Checksum64(buf + size_t(j) * size, size) != value_sum) {
                                     return false;
                                   }
                                 }
                                 return true;
                               }),
                    "get");
        }
      }
    }
    if (redis > 0) {
      kill(redis, SIGTERM);
      waitpid(redis, nullptr, 0);
    }
    server.Shutdown();

    // The best figure of a system for a case (Redis is measured unbatched and pipelined) in one
    // round, or over all rounds (round < 0).
    auto find = [&](const std::string& sys, const std::string& op, const std::string& tr,
                    const std::string& tier, uint64_t size, int round) -> double {
      double best = 0;
      for (const auto& r : results) {
        if (r.system == sys && r.op == op && r.transport == tr && r.tier == tier &&
            r.size == size && (round < 0 || r.round == round)) {
          best = std::max(best, r.gbps());
        }
      }
      return best;
    };
    std::cout << absl::StrFormat("%-5s %-12s %-5s %-5s %-5s %9s %8s %6s %10s %9s %9s %9s\n",
                                 "ROUND", "SYSTEM", "OP", "VIA", "TIER", "SIZE", "CLIENTS", "BATCH",
                                 "BLOCKS/S", "GB/S", "P50_US", "P99_US");
    nlohmann::json j;
    for (const auto& r : results) {
      std::cout << absl::StrFormat(
          "%-5d %-12s %-5s %-5s %-5s %9s %8d %6d %10.0f %9.3f %9.1f %9.1f\n", r.round, r.system,
          r.op, r.transport, r.tier, FormatBytes(r.size), r.clients, r.batch,
          r.blocks() / r.seconds, r.gbps(), r.p50_us, r.p99_us);
      j["results"].push_back({{"round", r.round},
                              {"system", r.system},
                              {"op", r.op},
                              {"transport", r.transport},
                              {"tier", r.tier},
                              {"size", r.size},
                              {"clients", r.clients},
                              {"batch", r.batch},
                              {"ops_per_s", r.ops / r.seconds},
                              {"blocks_per_s", r.blocks() / r.seconds},
                              {"gb_per_s", r.gbps()},
                              {"p50_us", r.p50_us},
                              {"p99_us", r.p99_us}});
    }
    const uint64_t mib = 1 << 20;
    const uint64_t ref = std::find(sizes.begin(), sizes.end(), mib) != sizes.end() ? mib : sizes[0];
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    auto ratios = [&](int round) {
      auto one = [&](const char* op, const char* via, const char* tier, const char* base_sys,
                     const char* base_op, const char* base_via) {
        return ratio(find("strata", op, via, tier, ref, round),
                     find(base_sys, base_op, base_via, tier, ref, round));
      };
      return nlohmann::json{
          {"get_shm_vs_redis_1MiB", one("get", "shm", "dram", "redis", "get", "tcp")},
          {"get_tcp_vs_redis_1MiB", one("get", "tcp", "dram", "redis", "get", "tcp")},
          {"put_tcp_vs_redis_1MiB", one("put", "tcp", "dram", "redis", "put", "tcp")},
          {"ssd_read_vs_raw", one("get", "shm", "ssd", "raw_odirect", "read", "-")}};
    };
    // Each round compares the two sides measured seconds apart (the SSD pair back to back on
    // the same slots); the reported ratio is the median over rounds, so one round that met a busy
    // neighbour on this shared machine (or a lucky moment of the disk) moves it little.
    for (int round = 0; round < f->rounds; ++round) j["ratio_rounds"].push_back(ratios(round));
    const nlohmann::json names = ratios(-1);
    j["ratios"] = nlohmann::json::object();
    for (const auto& [name, all_rounds] : names.items()) {
      if (all_rounds.get<double>() == 0) continue;  // a side not measured (--transports, --redis)
      std::vector<double> per_round;
      for (const auto& r : j["ratio_rounds"]) per_round.push_back(r[name].get<double>());
      std::sort(per_round.begin(), per_round.end());
      const size_t n = per_round.size();
      j["ratios"][name] = n % 2 ? per_round[n / 2] : (per_round[n / 2 - 1] + per_round[n / 2]) / 2;
    }
    j["rounds"] = f->rounds;
    std::cout << "ratios: " << j["ratios"].dump() << "\n";
    if (!f->json.empty()) std::ofstream(f->json) << j.dump(2) << "\n";
  });
}

}  // namespace strata::cli
