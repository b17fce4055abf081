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
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
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
#include <thread>

#include "absl/strings/str_format.h"
#include "cache_service/cache_server.h"
#include "cli/commands.h"
#include "common/block_key.h"
#include "common/checksum.h"
#include "common/config.h"
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
  int batch = 1;     // blocks per operation (one control round trip + one transfer batch)
  uint64_t ops = 0;  // operations (batches) completed
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

// --- raw O_DIRECT reads of one file on the SSD tier's disk -------------------------------------

// `streams` threads each pread() `per_stream` blocks of `size` with O_DIRECT: as many reads in
// flight as the store's SSD hits have (clients x blocks per batch), so the ratio compares the
// store with the disk at the same queue depth.
double RawDirectReadGBps(const std::string& dir, uint64_t size, int streams, int per_stream) {
  const std::string path = dir + "/raw-read.dat";
  const uint64_t blocks = uint64_t(streams) * per_stream;
  {
    const int wfd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (wfd < 0) return 0;
    std::string chunk(size, 'r');
    for (uint64_t i = 0; i < blocks; ++i) {
      if (write(wfd, chunk.data(), chunk.size()) != static_cast<ssize_t>(size)) break;
    }
    fsync(wfd);
    close(wfd);
  }
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return 0;
  posix_fadvise(fd, 0, blocks * size, POSIX_FADV_DONTNEED);
  std::vector<std::unique_ptr<char, decltype(&std::free)>> bufs;
  for (int t = 0; t < streams; ++t) {
    bufs.emplace_back(static_cast<char*>(std::aligned_alloc(4096, size)), &std::free);
    std::memset(bufs.back().get(), 0, size);
  }
  Result r = RunClients(streams, per_stream, [&](int c, int i) {
    const uint64_t off = (uint64_t(c) * per_stream + i) * size;
    return pread(fd, bufs[c].get(), size, off) == static_cast<ssize_t>(size);
  });
  close(fd);
  std::filesystem::remove(path);
  r.size = size;
  return r.gbps();
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
    const std::string dir = f->dir.empty() ? StrCat(std::filesystem::temp_directory_path().string(),
                                                    "/strata-bench-store-", getpid())
                                           : f->dir;
    std::filesystem::create_directories(dir);
    const uint64_t slot = (max_size + 4095) / 4096 * 4096;
    const uint64_t blocks = uint64_t(f->clients) * nblocks * 2 + batch + 16;

    cache::CacheServerOptions o;
    o.store.data_dir = dir + "/data";
    o.store.slot_bytes = slot;
    o.store.dram_capacity_bytes = blocks * slot;
    o.store.ssd_capacity_bytes = blocks * slot;
    o.store.dram_prefault = true;  // as `strata cache` does by default
    o.store.ssd_slots_per_file = 64;
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
    const pid_t redis = fork();
    if (redis == 0) {
      const std::string port = std::to_string(redis_port);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning",
             "--proto-max-bulk-len", "1gb", (char*)nullptr);
      _exit(127);
    }
    for (int i = 0; i < 100 && !Redis(redis_port).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }

    std::vector<Result> results;
    int round = 0;
    for (const uint64_t size : sizes) {
      for (const auto kind : {transfer::TransportKind::kShm, transfer::TransportKind::kTcp}) {
        const std::string tname(transfer::TransportKindName(kind));
        auto engine = transfer::TransferEngine::Create({.host_id = "bench-host",
                                                        .secret = transfer::ClusterSecret("bench"),
                                                        .force_transport = kind,
                                                        .enable_rdma = false});
        if (!engine.ok()) Fail(1, StrCat("engine: ", engine.status().message()));
        auto peer = (*engine)->OpenPeer(spec);
        if (!peer.ok()) Fail(1, StrCat("peer: ", peer.status().message()));
        const Namespace ns = MakeNamespace({}, {}, StrCat("bench-", ++round));
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
                           .capability = loc.capability()});
          }
          auto tb = (*engine)->Submit(**peer, std::move(ops));
          bool ok = tb->Wait(absl::Seconds(30)) && tb->FirstError().ok();
          for (int j = 0; ok && j < batch; ++j) {
            ok = Checksum64(buf + size_t(j) * size, size) == resp.locations(j).checksum();
          }
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
          results.push_back(r);
        };
        // Untimed warm-up batch: opens the data path (the shm transport maps the arena).
        if (!put(0, batches)) Fail(1, "bench store: warm-up put failed");
        add(RunClients(f->clients, batches, put), "put", "dram");
        add(RunClients(f->clients, batches, get), "get", "dram");
        // SSD hits: everything leaves DRAM for SSD, then each get promotes (checksum-verified).
        v1::DrainResponse dresp;
        if (!server.store().Drain({}, &dresp).ok()) Fail(1, "drain failed");
        add(RunClients(f->clients, batches, get), "get", "ssd");
        v1::EvictRequest ev;
        ev.mutable_selector()->set_all(true);
        v1::EvictResponse eresp;
        (void)server.store().Evict(ev, &eresp);
      }
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
      Result raw;
      raw.system = "raw_odirect";
      raw.op = "read";
      raw.transport = "-";
      raw.tier = "ssd";
      raw.size = size;
      raw.clients = f->clients * batch;
      raw.seconds = 1;
      const double gbps = RawDirectReadGBps(dir, size, f->clients * batch, batches);
      raw.ops = static_cast<uint64_t>(gbps * 1e9 / size);
      results.push_back(raw);
    }
    kill(redis, SIGTERM);
    waitpid(redis, nullptr, 0);
    server.Shutdown();

    // The best figure of a system for a case (Redis is measured unbatched and pipelined).
    auto find = [&](const std::string& sys, const std::string& op, const std::string& tr,
                    const std::string& tier, uint64_t size) -> double {
      double best = 0;
      for (const auto& r : results) {
        if (r.system == sys && r.op == op && r.transport == tr && r.tier == tier &&
            r.size == size) {
          best = std::max(best, r.gbps());
        }
      }
      return best;
    };
    std::cout << absl::StrFormat("%-12s %-5s %-5s %-5s %9s %8s %6s %10s %9s %9s %9s\n", "SYSTEM",
                                 "OP", "VIA", "TIER", "SIZE", "CLIENTS", "BATCH", "BLOCKS/S",
                                 "GB/S", "P50_US", "P99_US");
    nlohmann::json j;
    for (const auto& r : results) {
      std::cout << absl::StrFormat("%-12s %-5s %-5s %-5s %9s %8d %6d %10.0f %9.3f %9.1f %9.1f\n",
                                   r.system, r.op, r.transport, r.tier, FormatBytes(r.size),
                                   r.clients, r.batch, r.blocks() / r.seconds, r.gbps(), r.p50_us,
                                   r.p99_us);
      j["results"].push_back({{"system", r.system},
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
    j["ratios"] = {{"get_shm_vs_redis_1MiB", ratio(find("strata", "get", "shm", "dram", ref),
                                                   find("redis", "get", "tcp", "dram", ref))},
                   {"get_tcp_vs_redis_1MiB", ratio(find("strata", "get", "tcp", "dram", ref),
                                                   find("redis", "get", "tcp", "dram", ref))},
                   {"put_tcp_vs_redis_1MiB", ratio(find("strata", "put", "tcp", "dram", ref),
                                                   find("redis", "put", "tcp", "dram", ref))},
                   {"ssd_read_vs_raw", ratio(find("strata", "get", "shm", "ssd", ref),
                                             find("raw_odirect", "read", "-", "ssd", ref))}};
    std::cout << "ratios: " << j["ratios"].dump() << "\n";
    if (!f->json.empty()) std::ofstream(f->json) << j.dump(2) << "\n";
    if (f->dir.empty()) std::filesystem::remove_all(dir);
  });
}

}  // namespace strata::cli
