// The cache client (ARCHITECTURE.md §6): how a worker reads and writes KV blocks of one cache
// server. Control over gRPC (CacheControl: Connect, Lookup, Reserve, Commit, Release), bytes
// through the transfer engine (shm on the same host, rdma or tcp otherwise).
//
//   ASSIGN_OR_RETURN(auto client, CacheClient::Connect({.address = "127.0.0.1:7400", ...}));
//   FetchResult hit = client->Fetch(ns, keys, tokens, layout, "req-1");
//   for (const FetchedBlock& b : hit.blocks) pool.ImportPage(page, kBf16, b.payload);
//   // or, importing each run of blocks while the next one is read:
//   client->Fetch(ns, keys, tokens, layout, "req-1", {.on_blocks = import_run});
//   client->SaveAsync(ns, "tenant", layout, std::move(blocks), "req-1", [](auto r) { ... });
//
// A fetch reads all its blocks into one host buffer (FetchResult::buffer), and each block's
// payload is a span into it: no copy after the transfer. The caller may supply the buffer
// (FetchBuffer), e.g. pinned memory of a GPU pool, whose kernels then read the payloads in place.
// A block to save likewise names its payload by a span and the object that owns its memory.
//
// What is stored under a key is a whole block in the block format (common/block_format.h):
// header + token ids + payload. A fetched block is checked before it is returned — its bytes
// against the checksum the server verified at commit (in transit), then the token ids and the key
// recomputed from them — so a corrupt, truncated or foreign block is never imported: the fetch
// stops at it and the caller recomputes from there.
//
// Failure model: Fetch never fails a request. A dead or slow server, a transfer error or a bad
// block ends the verified prefix early and is reported in FetchResult::first_failure; the worker
// recomputes the rest. Saves are best effort too (a full cache is not an error of the request),
// but their outcome is reported per block. Leases taken by Fetch are released before it returns;
// write leases end with Commit (or expire on the server if the client dies).
//
// Reconnection: the gRPC channel reconnects by itself (backoff capped at 2 s). The data path
// (the transfer peer) is re-opened — CacheControl.Connect again, a new peer — by the next Fetch
// or Save after a failure that a restarted server causes (unreachable server, transfer
// Unavailable / DataLoss / ...), at most once a second, so a worker finds a restarted cache
// server at the same address without being rebuilt.
//
// Thread safety: every method may be called from any thread, concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/block_format.h"
#include "common/block_key.h"
#include "common/host_buffer.h"
#include "transfer/transfer_engine.h"
#include "transfer/transport.h"

namespace strata::cache_client {

struct CacheClientOptions {
  std::string address;         // the cache server's gRPC "host:port"
  std::string client_id;       // this worker's node id (server logs, leases)
  std::string host_id;         // this host: a server with the same host id is reached over shm
  std::string cluster_secret;  // for the transfer engine's capabilities; empty in dev clusters
  std::optional<transfer::TransportKind> force_transport;  // tests and benches
  // Config `transfer.*` (StrataConfig::transfer.ToEngineOptions): transports, connections and
  // QPs per peer, connect timeout. The client sets host_id, secret and wrap_transport itself;
  // force_transport above, when set, wins.
  std::optional<transfer::EngineOptions> transfer;
  // Tests: wraps every transport (fault injection, transfer/fault/fault_transport.h).
  std::function<std::unique_ptr<transfer::Transport>(std::unique_ptr<transfer::Transport>)>
      wrap_transport;
  absl::Duration rpc_timeout = absl::Seconds(5);        // each control RPC
  absl::Duration transfer_timeout = absl::Seconds(10);  // each batch of block reads or writes
  // Write-behind bound: SaveAsync blocks its caller while more than this many bytes of blocks
  // are queued or in flight (bounded memory under a slow or full cache).
  uint64_t max_pending_save_bytes = 256ull << 20;
};

// Where a fetched block was served from, for cached-token accounting (CachedTokens in the API).
enum class HitTier { kGpu, kDram, kSsd };

struct FetchedBlock {
  HitTier tier = HitTier::kDram;
  // The verified payload only (no header, no tokens), inside FetchResult::buffer; 16-byte
  // aligned when the buffer is.
  std::span<const uint8_t> payload;
};

// Gives Fetch a buffer of at least `bytes` for one fetch (whole blocks, one after another). The
// fetch holds it until every transfer into it has ended, which may be after Fetch returns when a
// transfer timed out: reuse a buffer only when nothing else holds it (use_count() == 1). An
// error, or a buffer that is too small, makes the fetch use heap memory instead.
using FetchBuffer = std::function<absl::StatusOr<std::shared_ptr<HostBuffer>>(size_t bytes)>;

// Takes a run of verified blocks while Fetch reads the next one: `first` is the index of
// blocks[0] in the fetch (runs come in order, on the calling thread, and cover FetchResult::blocks
// exactly). The payloads stay valid as long as FetchResult::buffer. Returning false stops the
// fetch: no later block is read (first_failure says Cancelled).
using FetchedBlocksFn = std::function<bool(size_t first, std::span<const FetchedBlock> blocks)>;

// Whether the caller takes payloads straight from `region`, the server's memory as this process
// maps it (shm), keeping `owner` if it needs the mapping beyond the fetch (e.g. registered with
// CUDA). Asked once per fetch, before any block is read.
using InPlaceFn =
    std::function<bool(std::span<const uint8_t> region, const std::shared_ptr<const void>& owner)>;

struct FetchOptions {
  FetchBuffer buffer;         // where the blocks are copied to; unset: a heap buffer per fetch
  FetchedBlocksFn on_blocks;  // unset: the blocks are only returned
  // Set, and the data path maps the server's memory: no copy. Each block is checked where it
  // lies (its checksum hashed in place) and its payload points into the server's memory, which
  // the read lease keeps unchanged only until Fetch returns: consume the payloads in on_blocks.
  // Unset, declined or not mappable (tcp, rdma): the blocks are copied into `buffer`.
  InPlaceFn in_place;
  // The blocks are read in runs of about this many bytes (at least one block): run k + 1 is read
  // while run k is verified and handed to on_blocks, so a caller that moves blocks on (into KV
  // pages) overlaps that with the reads.
  uint64_t run_bytes = uint64_t{32} << 20;
  // Whether run k + 1 is read on a helper thread while run k is handed over (else one run after
  // the other); unset: on hosts of 4 cores or more, where the threads have cores to run on.
  std::optional<bool> read_ahead;
};

struct FetchResult {
  int64_t hit_blocks = 0;  // what Lookup reported present (a prefix of the keys)
  // Where the blocks were copied to (null when nothing was copied); blocks[i].payload points
  // into it, or, when the fetch read in place, into `mapping` (the server's memory: valid to
  // read while this result lives, but what it holds may change once Fetch has returned).
  std::shared_ptr<HostBuffer> buffer;
  std::shared_ptr<const void> mapping;
  std::vector<FetchedBlock> blocks;  // verified, in key order: blocks.size() <= hit_blocks
  // Why blocks.size() < hit_blocks (OK when equal). Also set when the Lookup itself failed
  // (hit_blocks 0: Unavailable / DeadlineExceeded) or the arguments were bad (InvalidArgument).
  // Codes: DataLoss (corrupt in transit or at rest), NotFound (an intact block that is not the
  // one asked for: IsBlockIdentityMismatch), Unavailable (server or link down, or the block is
  // not remotely readable), DeadlineExceeded (too slow).
  absl::Status first_failure;
  double lookup_ms = 0;
  double transfer_ms = 0;  // reading and verifying the blocks, on_blocks included
};

// One block to save: its key, its parent's key (all zero for the first block), its B tokens
// and its payload in the layout's codec. `payload_owner` keeps the payload's memory alive until
// the save is done; it may stay null for Save when the caller keeps the memory alive, not for
// SaveAsync. OwnPayload makes the block hold its payload itself.
struct BlockToSave {
  BlockKey key;
  BlockKey parent;
  std::vector<uint32_t> tokens;
  std::span<const uint8_t> payload;
  std::shared_ptr<const void> payload_owner;

  void OwnPayload(std::vector<uint8_t> bytes) {
    auto held = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
    payload = *held;
    payload_owner = std::move(held);
  }
};

struct SaveResult {
  int64_t stored = 0;        // committed by this save
  int64_t present = 0;       // already in the cache (ALREADY_EXISTS), skipped
  int64_t failed = 0;        // refused (full, quota) or lost in transit (DataLoss at commit)
  absl::Status first_error;  // OK unless failed > 0
  std::vector<BlockKey> keys_in_cache;  // stored + present, in request order
};

class CacheClient {
 public:
  // Connects the control channel (CacheControl.Connect) and opens a transfer peer to the
  // server's "dram" segment. Unavailable when the server cannot be reached within rpc_timeout.
  static absl::StatusOr<std::unique_ptr<CacheClient>> Connect(CacheClientOptions options);
  ~CacheClient();

  const std::string& address() const;
  const std::string& server_id() const;       // as answered by Connect
  transfer::TransportKind transport() const;  // the transport of the current data path

  // Looks up `keys` (a chain: keys[i] is the parent of keys[i+1]), reads the longest present
  // prefix under a read lease and verifies each block against its key and its tokens
  // (`tokens` holds keys.size() · layout.block_tokens ids, block i at i·B). Stops at the first
  // block that cannot be read or verified. `options` name the memory the blocks are read into
  // and a callback that takes them run by run, while later runs are still being read.
  FetchResult Fetch(const Namespace& ns, std::span<const BlockKey> keys,
                    std::span<const uint32_t> tokens, const BlockLayout& layout,
                    const std::string& request_id, const FetchOptions& options = {});

  // Reserve → write every block (encoded with its header and tokens) → Commit. Blocks must form
  // a chain in order (each one's parent is the previous one's key, or the stated parent for the
  // first). Returns an error only when the server could not be asked at all (Unavailable,
  // DeadlineExceeded) or the blocks are malformed (InvalidArgument: not a chain, a key that does
  // not name its tokens, sizes that disagree with the layout); per-block refusals are counted in
  // the result.
  absl::StatusOr<SaveResult> Save(const Namespace& ns, const std::string& tenant,
                                  const BlockLayout& layout, std::vector<BlockToSave> blocks,
                                  const std::string& request_id);

  // Save on a background thread (write-behind). `done` runs once, on that thread, after the
  // blocks are committed or refused. Blocks the caller while max_pending_save_bytes are pending
  // (one batch is always admitted when nothing is pending, however large). Saves run in FIFO
  // order on one thread, started by the first SaveAsync. `done` must not call FlushSaves (it
  // would return at once) and should not block for long: it holds up every later save.
  // The destructor runs (drains) every queued save before returning.
  void SaveAsync(const Namespace& ns, const std::string& tenant, const BlockLayout& layout,
                 std::vector<BlockToSave> blocks, const std::string& request_id,
                 std::function<void(absl::StatusOr<SaveResult>)> done);

  // Waits until every SaveAsync issued so far has completed.
  void FlushSaves();

  // Bytes of blocks (payload + tokens) queued or in flight in SaveAsync.
  uint64_t pending_save_bytes() const;

 private:
  struct Impl;
  explicit CacheClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cache_client
