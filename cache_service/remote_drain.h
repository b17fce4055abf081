// Drain to another cache server: `strata admin cache drain --to HOST:PORT`.
//
// Every block resident in this server's DRAM tier is copied to the target through the target's
// normal put path (CacheControl Reserve -> transfer-engine writes -> Commit, which verifies each
// block's checksum), keeping its index metadata: namespace, tenant, parent (the chain) and pin
// (re-applied on the target through its CacheAdmin Pin, with the remaining TTL). Only then is
// the block dropped here (from every tier). Blocks are held under a local read lease while they
// are copied, so eviction cannot move them underneath the transfer.
//
// Failure model: a block leaves this server only after the target acknowledged its Commit (and
// its pin). An unreachable target, a refused reservation (full, quota), a transfer error or a
// checksum mismatch leaves the block here and counts it in `failed_blocks`; nothing is lost.
// A block the target already holds (ALREADY_EXISTS: same key, same namespace) counts as moved.
//
// Thread safety: one drain at a time per call; the store may serve clients meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache_service/block_store.h"
#include "strata/v1/cache_admin.pb.h"

namespace strata::cache {

struct RemoteDrainOptions {
  std::string host_id;         // this host (a target on the same host may be reached over shm)
  std::string cluster_secret;  // the data plane's capability secret (shared by the cluster)
  std::string admin_token;     // bearer for the target's CacheAdmin (pins); the cluster's token
  std::string client_id = "cache-drain";
  uint32_t batch_blocks = 32;  // blocks per Reserve/transfer/Commit round
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration transfer_timeout = absl::Seconds(30);
};

// Copies every DRAM-resident block of `store` to the cache server at `target_address` and drops
// the copied ones here. Unavailable when the target cannot be reached (nothing moved);
// otherwise OK with per-block outcomes in `resp`.
absl::Status DrainToRemote(BlockStore& store, const std::string& target_address,
                           const RemoteDrainOptions& options, v1::DrainResponse* resp);

}  // namespace strata::cache
