// The worker's engine loop (ARCHITECTURE.md §6): continuous batching with chunked prefill under
// a token budget, cache loads and saves, swap-out under page pressure.
//
//   WorkerCore core(engine, &caches, options);
//   core.Start();
//   RETURN_IF_ERROR(core.Submit(spec, {.on_tokens = ..., .on_done = ...}));
//
// Threads: one loop thread owns the engine and runs one step at a time — every decoding sequence
// adds a token, and prefill chunks fill the rest of `token_budget`. A loader thread fetches cached
// blocks into the pages of admitted sequences (so a slow cache never stalls the running batch);
// saves go out write-behind through the cache client.
//
// Life of a sequence: queued → (pages reserved for its prompt) loading → prefill chunks over what
// the cache did not have → first token → decode steps → finished (its full blocks saved, pages
// freed). A kPrefill request ends at its first token once its blocks are committed; a kDecode
// request loads the handed-over blocks, recomputes the missing tail and starts from first_token.
// When a decoding sequence needs a page and none is free, the lowest-priority, newest sequence is
// swapped out: its full blocks are saved to the cache, its pages freed, and it waits to be swapped
// back in (blocks fetched, the partial tail recomputed). Nothing is dropped: a block that cannot be
// fetched or verified is recomputed; without a cache server a swap is a recomputation.
//
// Thread safety: Submit, Cancel and Load may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/host_buffer.h"
#include "compute_nodes/runtime/engine.h"
#include "compute_nodes/worker/cache_directory.h"
#include "compute_nodes/worker/request.h"
#include "compute_nodes/worker/resident_blocks.h"
#include "strata/v1/worker.pb.h"

namespace strata::worker {

struct WorkerCoreOptions {
  int64_t token_budget = 512;    // tokens per engine step (decode tokens + prefill chunks)
  int64_t max_running = 64;      // sequences holding pages (loading, prefilling, decoding)
  int64_t max_queued = 1024;     // waiting requests beyond this are refused (ResourceExhausted)
  int64_t max_fetch_blocks = 0;  // 0: no limit on the cached prefix fetched per request
  // Upper bound of the loader's fetch buffer, kept and reused across fetches: the KV pool's host
  // memory (KvPool::AllocateHostBuffer: pinned with the CUDA backend, so the import kernels read
  // the fetched payloads in place). A larger fetch reads to heap memory; 0 always does.
  int64_t load_buffer_bytes = int64_t{1} << 30;
  // Upper bound of the host buffers that block saves export pages into, kept and reused (the
  // KV pool's host memory: pinned with the CUDA backend, so the export kernels write in place and
  // the loop thread waits for PCIe, not for host copies). A save finding none free exports into
  // heap vectors; 0 always does.
  int64_t save_buffer_bytes = int64_t{256} << 20;
  // The codec of the blocks saved to and loaded from the cache (swaps included): bf16 restores
  // the pages bit for bit; fp8 (e4m3, one scale per 128 latent values of a token) halves the
  // bytes a block takes in every tier and on the wire, at fp8's precision. It enters the block
  // keys' namespace, so bf16 and fp8 blocks never mix. fp8 needs a latent dim that is a multiple
  // of 128 (KvPool::CheckPayload).
  KvCodec cache_codec = KvCodec::kBf16;
  // Keep a finished (or swapped-out) sequence's full blocks in the KV pool, found again by key
  // (ResidentBlocks): a later prompt that starts with them takes the pages as they are, before
  // anything is fetched from the cache server. Their pages go back as soon as a sequence needs
  // one and none is free, so this costs no capacity.
  bool resident_blocks = true;
};

// Counters since start (also exported as Prometheus metrics).
struct WorkerStats {
  int64_t steps = 0;
  int64_t computed_tokens = 0;  // prompt (and recomputed) tokens run through prefill
  int64_t cached_tokens = 0;    // prompt tokens loaded from the cache
  int64_t generated_tokens = 0;
  int64_t swapped_out = 0;
  int64_t swapped_in = 0;
  // Swap-ins that recomputed some of their full blocks (no cache server, or blocks lost there
  // and no longer resident in the pool).
  int64_t recomputed_swaps = 0;
  int64_t fetch_failures = 0;  // fetches that ended before the cache's hit count
  int64_t blocks_saved = 0;
  int64_t resident_tokens = 0;  // prompt tokens found in the KV pool itself (ResidentBlocks)
};

class WorkerCore {
 public:
  // `engine` and `caches` must outlive the core.
  WorkerCore(runtime::Engine& engine, CacheDirectory& caches, WorkerCoreOptions options);
  ~WorkerCore();  // Stop()

  void Start();
  // Ends every request with Unavailable("worker stopping") and joins the threads. Idempotent.
  void Stop();

  // InvalidArgument: empty prompt, token ids out of range, a prompt at the context limit, a
  // duplicate id, a kDecode without first_token. ResourceExhausted: the queue is full or the
  // prompt can never fit the KV pool. Unavailable: stopped. On error no callback runs.
  absl::Status Submit(RequestSpec spec, RequestEvents events);
  // True when the request was running or queued; it ends with Finish::kCancelled.
  bool Cancel(const std::string& id);

  v1::WorkerLoad Load() const;
  WorkerStats stats() const;
  // The blocks kept in the KV pool (for the scheduler's prefix index: TakeChanges, Keys).
  ResidentBlocks& resident() { return resident_; }

 private:
  struct Sequence;
  using SeqPtr = std::shared_ptr<Sequence>;

  void Loop();
  void LoaderLoop();
  // One engine step. Returns false when there was nothing to run.
  bool Step();
  void AdmitLocked(std::vector<SeqPtr>* to_load);
  void CollectLoaded();
  void End(const SeqPtr& seq, Finish finish, absl::Status status);
  void MaybeDeliverDone(const SeqPtr& seq);
  bool SwapOutVictim(const SeqPtr& needing);
  void SaveBlocks(const SeqPtr& seq, int64_t upto_blocks);
  void ExtendKeys(Sequence& seq, int64_t blocks) const;
  void EmitTokens(const SeqPtr& seq, std::span<const int32_t> tokens);
  void AfterPrefill(const SeqPtr& seq, const std::vector<float>& logits);
  void AfterDecode(const SeqPtr& seq, const runtime::SequenceOutput& out);
  int64_t PagesFor(int64_t tokens) const;
  // Gives the sequence's pages back: its full blocks stay resident unless `discard`.
  void ReleaseSequencePages(Sequence& seq, bool discard = false);
  // Makes the sequence's newly filled blocks resident (shared with prompts admitted meanwhile).
  void PublishFullBlocks(Sequence& seq);
  // The loader's fetch buffer for `bytes` (load_buffer_, grown or replaced when needed).
  absl::StatusOr<std::shared_ptr<HostBuffer>> LoadBuffer(size_t bytes);
  // A free save buffer of at least `bytes` (save_buffers_), or null when none is free and no
  // more may be pinned. Loop thread.
  std::shared_ptr<HostBuffer> SaveBuffer(size_t bytes);
  // Recomputes load_ (and the gauges) from the queues and the pool. Loop thread, mu_ held.
  void RefreshLoadLocked(size_t decode_batch);

  runtime::Engine& engine_;
  CacheDirectory& caches_;
  WorkerCoreOptions options_;
  int64_t block_tokens_;
  ResidentBlocks resident_;

  mutable std::mutex mu_;
  std::condition_variable cv_;         // loop: work arrived
  std::condition_variable loader_cv_;  // loader: a sequence to load
  bool stopping_ = false;
  bool started_ = false;
  uint64_t next_serial_ = 0;
  std::deque<SeqPtr> waiting_;           // guarded by mu_
  std::deque<SeqPtr> swapped_;           // guarded by mu_
  std::deque<SeqPtr> to_load_;           // guarded by mu_, for the loader
  std::vector<SeqPtr> loaded_;           // guarded by mu_, from the loader
  std::map<std::string, SeqPtr> by_id_;  // guarded by mu_: every live request
  std::vector<SeqPtr> running_;          // loop thread only: prefilling and decoding
  int64_t loading_count_ = 0;            // guarded by mu_
  v1::WorkerLoad load_;                  // guarded by mu_, refreshed every step
  WorkerStats stats_;                    // guarded by mu_
  double prefill_ms_per_token_ = 0;      // EWMA, loop thread
  double decode_step_ms_ = 0;            // EWMA, loop thread

  std::shared_ptr<HostBuffer> load_buffer_;  // loader thread only
  bool load_buffer_failed_ = false;          // loader thread only: pinning failed once
  // Loop thread only. A buffer is free when nothing else holds it (use_count() == 1): the blocks
  // of a save hold theirs until the save is done.
  std::vector<std::shared_ptr<HostBuffer>> save_buffers_;
  bool save_buffer_failed_ = false;  // pinning failed once

  std::thread loop_;
  std::thread loader_;
};

}  // namespace strata::worker
