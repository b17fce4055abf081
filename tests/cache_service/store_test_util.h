// Helpers for cache_service tests: chains of keys, deterministic payloads, and a put/get
// through a BlockStore in the same process (the payload goes straight into the DRAM arena, as
// the shm transport would put it).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cache_service/block_store.h"
#include "common/block_key.h"
#include "common/checksum.h"

namespace strata::cache::testing_util {

inline Namespace Ns(const std::string& salt) { return MakeNamespace({}, {}, salt); }

// `n` chained keys of a random-ish token sequence picked by `seed`.
inline std::vector<BlockKey> Chain(const Namespace& ns, size_t n, uint32_t seed) {
  std::vector<uint32_t> tokens(n * 64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 100003u + static_cast<uint32_t>(i);
  return ComputeBlockKeys(ns, tokens);
}

// Payload bytes determined by the key, so any mix-up shows.
inline std::string Payload(const BlockKey& key, size_t bytes) {
  std::string out(bytes, '\0');
  uint64_t state = Checksum64(key.View());
  for (size_t i = 0; i < bytes; i += 8) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(out.data() + i, &state, std::min<size_t>(8, bytes - i));
  }
  return out;
}

inline std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = ::testing::TempDir() + "/cache-" + name + "-" + std::to_string(getpid()) +
                          "-" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct PutResult {
  std::vector<int> codes;  // per block, Reserve's or Commit's code
  bool durable = false;
};

// Reserve → write into the arena → Commit, for blocks keys[0..n) of one chain.
inline PutResult Put(BlockStore& store, const Namespace& ns, const std::vector<BlockKey>& keys,
                     size_t bytes, const std::string& tenant = "t") {
  PutResult out;
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.View()));
  req.set_tenant(tenant);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto* b = req.add_blocks();
    b->set_key(std::string(keys[i].View()));
    if (i > 0) b->set_parent_key(std::string(keys[i - 1].View()));
    b->set_payload_bytes(bytes);
  }
  v1::ReserveResponse resp;
  EXPECT_TRUE(store.Reserve(req, &resp).ok());
  v1::CommitRequest commit;
  commit.set_lease_id(resp.lease().lease_id());
  std::vector<int> commit_index(keys.size(), -1);
  for (size_t i = 0; i < keys.size(); ++i) {
    out.codes.push_back(resp.slots(i).status().code());
    if (resp.slots(i).status().code() != 0) continue;
    const std::string data = Payload(keys[i], bytes);
    std::memcpy(store.dram().base() + resp.slots(i).location().offset(), data.data(), bytes);
    auto* c = commit.add_blocks();
    c->set_key(std::string(keys[i].View()));
    c->set_checksum(Checksum64(data));
    commit_index[i] = commit.blocks_size() - 1;
  }
  if (commit.blocks_size() == 0) return out;
  v1::CommitResponse cresp;
  EXPECT_TRUE(store.Commit(commit, &cresp).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (commit_index[i] >= 0) out.codes[i] = cresp.results(commit_index[i]).code();
  }
  out.durable = cresp.durable();
  return out;
}

struct GetResult {
  uint32_t hits = 0;
  bool all_valid = true;  // every hit's bytes match its payload and checksum
  std::vector<v1::BlockLocation> locations;
};

// Lookup with promotion under a read lease, read every hit from the arena into a private buffer,
// check it, then Release.
inline GetResult Get(BlockStore& store, const Namespace& ns, const std::vector<BlockKey>& keys,
                     size_t bytes) {
  GetResult out;
  v1::LookupRequest req;
  req.set_namespace_id(std::string(ns.View()));
  for (const auto& k : keys) req.add_keys(std::string(k.View()));
  req.set_lease(true);
  req.set_promote(true);
  v1::LookupResponse resp;
  const absl::Status st = store.Lookup(req, &resp);
  EXPECT_TRUE(st.ok()) << st;
  out.hits = resp.hit_blocks();
  std::string buf(bytes, '\0');
  for (uint32_t i = 0; i < resp.hit_blocks(); ++i) {
    const auto& loc = resp.locations(i);
    out.locations.push_back(loc);
    if (loc.tier() != v1::TIER_DRAM || loc.length() != bytes) {
      out.all_valid = false;
      continue;
    }
    std::memcpy(buf.data(), store.dram().base() + loc.offset(), bytes);
    if (Checksum64(buf) != loc.checksum() || buf != Payload(keys[i], bytes)) {
      out.all_valid = false;
    }
  }
  if (resp.has_lease() && resp.lease().lease_id() != 0) {
    EXPECT_TRUE(store.Release(resp.lease().lease_id()).ok());
  }
  return out;
}

}  // namespace strata::cache::testing_util
