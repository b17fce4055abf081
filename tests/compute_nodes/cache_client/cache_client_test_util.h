// The cache client tests' shared parts: a real cache server in this process (gRPC on loopback,
// data over tcp or shm), chains of blocks with payloads determined by their keys, and the
// fixture that starts, restarts and connects to the server.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache_service/cache_server.h"
#include "common/checksum.h"
#include "compute_nodes/cache_client/cache_client.h"

namespace strata::cache_client::testing_util {

inline constexpr char kHost[] = "host-1";
inline constexpr char kSecret[] = "cluster-secret";

// bf16, 2 layers, 16 tokens, rank 32, rope 16: 3,072 payload bytes, 3,248 stored bytes.
inline BlockLayout Layout() {
  return {.codec = KvCodec::kBf16,
          .n_layers = 2,
          .block_tokens = 16,
          .kv_lora_rank = 32,
          .rope_dim = 16};
}

inline Namespace Ns(const std::string& salt) {
  return MakeNamespace({}, {.codec = KvCodec::kBf16, .block_tokens = 16}, salt);
}

inline std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = ::testing::TempDir() + "/cache-client-" + name + "-" +
                          std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// `n` blocks of tokens picked by `seed`.
inline std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n * Layout().block_tokens);
  for (size_t i = 0; i < t.size(); ++i) t[i] = seed * 7919u + static_cast<uint32_t>(i);
  return t;
}

// Payload bytes determined by the key, so any mix-up shows.
inline std::vector<uint8_t> Payload(const BlockKey& key) {
  std::vector<uint8_t> out(Layout().PayloadBytes());
  uint64_t state = Checksum64(key.View());
  for (size_t i = 0; i < out.size(); i += 8) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(out.data() + i, &state, std::min<size_t>(8, out.size() - i));
  }
  return out;
}

struct Chain {
  std::vector<uint32_t> tokens;
  std::vector<BlockKey> keys;
  std::vector<BlockToSave> blocks;
};

inline Chain MakeChain(const Namespace& ns, size_t n, uint32_t seed) {
  Chain c;
  c.tokens = Tokens(n, seed);
  c.keys = ComputeBlockKeys(ns, c.tokens, Layout().block_tokens);
  for (size_t i = 0; i < n; ++i) {
    const auto* t = c.tokens.data() + i * Layout().block_tokens;
    c.blocks.push_back({.key = c.keys[i],
                        .parent = i == 0 ? BlockKey{} : c.keys[i - 1],
                        .tokens = std::vector<uint32_t>(t, t + Layout().block_tokens)});
    c.blocks.back().OwnPayload(Payload(c.keys[i]));
  }
  return c;
}

inline std::vector<BlockToSave> Prefix(const Chain& c, size_t n) {
  return {c.blocks.begin(), c.blocks.begin() + static_cast<std::ptrdiff_t>(n)};
}

inline cache::CacheServerOptions ServerOptions(const std::string& name, uint32_t dram_slots) {
  cache::CacheServerOptions o;
  o.store.server_id = "srv-" + name;
  o.store.data_dir = FreshDir(name);
  o.store.slot_bytes = 4096;
  o.store.dram_capacity_bytes = uint64_t{dram_slots} * 4096;
  o.http_listen = "";
  o.host_id = kHost;
  o.cluster_secret = kSecret;
  o.shm_socket_path = o.store.data_dir + "/shm.sock";
  return o;
}

class CacheClientTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(256); }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  void StartServer(uint32_t dram_slots) { StartServer(ServerOptions("s", dram_slots)); }
  void StartServer(const cache::CacheServerOptions& options) {
    if (server_) server_->Shutdown();
    server_.reset();  // a restart on the same data_dir needs the index closed first
    server_ = std::make_unique<cache::CacheServer>(options);
    ASSERT_TRUE(server_->Start().ok());
  }

  CacheClientOptions Options(transfer::TransportKind kind = transfer::TransportKind::kTcp) {
    return {.address = "127.0.0.1:" + std::to_string(server_->grpc_port()),
            .client_id = "worker-1",
            .host_id = kHost,
            .cluster_secret = kSecret,
            .force_transport = kind,
            .wrap_transport = nullptr,
            .rpc_timeout = absl::Seconds(3),
            .transfer_timeout = absl::Seconds(10)};
  }

  std::unique_ptr<CacheClient> Connect(CacheClientOptions o) {
    auto client = CacheClient::Connect(std::move(o));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  uint64_t ActiveLeases() {
    v1::GetStatsResponse stats;
    server_->store().GetStats(&stats);
    return stats.active_leases();
  }

  FetchResult FetchChain(CacheClient& client, const Namespace& ns, const Chain& c) {
    return client.Fetch(ns, c.keys, c.tokens, Layout(), "req");
  }

  std::unique_ptr<cache::CacheServer> server_;
};

inline void ExpectPayloads(const FetchResult& r, const Chain& c, size_t n,
                           HitTier tier = HitTier::kDram) {
  ASSERT_EQ(r.blocks.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::ranges::equal(r.blocks[i].payload, c.blocks[i].payload)) << "block " << i;
    EXPECT_EQ(r.blocks[i].tier, tier);
  }
}

// Records the region offered for reads in place and answers `take`.
struct InPlace {
  bool take = true;
  int asked = 0;
  std::span<const uint8_t> region;
  InPlaceFn Fn() {
    return [this](std::span<const uint8_t> r, const std::shared_ptr<const void>& owner) {
      ++asked;
      region = r;
      EXPECT_NE(owner, nullptr);
      return take;
    };
  }
  bool Holds(std::span<const uint8_t> bytes) const {
    return bytes.data() >= region.data() &&
           bytes.data() + bytes.size() <= region.data() + region.size();
  }
};

}  // namespace strata::cache_client::testing_util
