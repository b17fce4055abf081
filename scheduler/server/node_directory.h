// NodeDirectory: what the scheduler must know about a registered worker beyond its load — how to
// reach it (Worker gRPC address), which cache server it uses, and the model fingerprint and block
// size that, with a tenant's salt, name its KV blocks. Filled by the Scheduler gRPC service on
// Register; read by the serving backend and the cache event subscriber.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/block_key.h"
#include "scheduler/types.h"
#include "strata/v1/common.pb.h"

namespace strata::scheduler {

struct WorkerNode {
  NodeIndex index = kNoNode;
  std::string id;
  std::string host;
  std::string grpc_address;   // Worker service
  std::string cache_address;  // its cache server ("" when it runs without one)
  std::string model;
  v1::NodeRole role = v1::ROLE_BOTH;
  ModelFingerprint fingerprint;
  bool has_fingerprint = false;
  uint32_t block_tokens = kDefaultBlockTokens;
  KvCodec codec = KvCodec::kBf16;  // of the blocks it saves and loads (the namespace's codec)
  double kv_bytes_per_token = 0;   // of those blocks, every layer; 0: not reported
};

class NodeDirectory {
 public:
  void Upsert(WorkerNode node);
  std::optional<WorkerNode> Get(NodeIndex index) const;
  std::vector<WorkerNode> All() const;
  // Nodes whose cache server is `cache_address`.
  std::vector<NodeIndex> OnCache(const std::string& cache_address) const;
  // The (fingerprint, block_tokens, codec) of the first registered worker that reported one: the
  // cluster serves one model, so every worker names its blocks alike. nullopt when none.
  std::optional<WorkerNode> Reference() const;

 private:
  mutable std::mutex mu_;
  absl::flat_hash_map<NodeIndex, WorkerNode> nodes_;  // guarded by mu_
};

}  // namespace strata::scheduler
