// WorkerBackend: the production CompletionBackend of `strata scheduler` — the gateway's requests
// run on the registered workers over gRPC (proto/strata/v1/worker.proto).
//
// One request: render the chat template (or take the completion prompt) and tokenize; name the
// prompt's blocks as the workers do (MakeNamespace(model fingerprint the workers reported,
// bf16/block_tokens, cache_salt) → ComputeBlockKeys); Scheduler::Decide; then
//   - prefill node == decode node, or the prefill node serves both roles: Worker.Generate on it
//     (the decode booking moves there; no block handoff through the cache);
//   - otherwise Worker.Prefill on the prefill node, then Worker.Decode on the decode node with the
//     block keys the prefill published (and the prefill node's cache server when the decode node
//     uses another one).
// A planned block move (placement.move) becomes the CachePlan's cache_address: the prefill node
// loads the prefix from the source node's cache server.
// Token texts stream to the sink as they come; finish reason and usage (cached tokens by tier) end
// the request. The work is reported back to the scheduler (outstanding bookkeeping; the prefill
// model is calibrated from Prefill responses, whose prefill_ms excludes queueing — a Generate
// stream gives no such figure, so it only releases the booking).
//
// Failures: a call that fails is retried once, on a freshly decided placement; a node that was
// unreachable (UNAVAILABLE) is marked dead first so the retry goes elsewhere (its next heartbeat
// revives it). A stream that dies after text reached the client resumes: the retry's prompt is
// the original prompt plus the tokens already streamed (cut back to the last token whose text was
// whole, so no UTF-8 character is split or repeated), and it asks only for the tokens still due;
// the client sees one uninterrupted answer. (A resumed sampled answer continues with fresh draws;
// a stop string split exactly across the failure point is not seen.) With no retry left the
// request ends with Unavailable. No worker registered → Unavailable. A client that goes away
// (sink->Cancelled()) cancels the gRPC call within ~50 ms, which cancels the work on the worker.
//
// Threading: each request runs on its own short-lived thread (blocking gRPC calls); one extra
// thread polls for cancelled clients. Shutdown() cancels everything in flight and waits.
// Thread safety: Generate/Models may be called concurrently from the gateway's threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "compute_nodes/tokenizer/tokenizer.h"
#include "scheduler/http/completion_backend.h"
#include "scheduler/scheduler.h"
#include "scheduler/server/channel_pool.h"
#include "scheduler/server/node_directory.h"

namespace strata::scheduler {

struct WorkerBackendOptions {
  std::string model_id;                             // the one model served (/v1/models)
  const tokenizer::Tokenizer* tokenizer = nullptr;  // required; must outlive the backend
  absl::Duration request_timeout = absl::Minutes(10);
  int max_attempts = 2;  // the first try and one retry elsewhere
};

class WorkerBackend final : public CompletionBackend {
 public:
  WorkerBackend(Scheduler* scheduler, NodeDirectory* directory, ChannelPool* channels,
                WorkerBackendOptions options);
  ~WorkerBackend() override;  // Shutdown()

  std::vector<std::string> Models() const override { return {options_.model_id}; }
  void Generate(const CompletionRequest& request, std::shared_ptr<CompletionSink> sink) override;

  // Cancels every call in flight, waits for the request threads; later requests fail at once.
  void Shutdown();

  uint64_t retries() const { return retries_.load(); }
  // Retries that resumed a stream which had already sent text.
  uint64_t resumed() const { return resumed_.load(); }
  uint64_t requests() const { return requests_.load(); }

  // Defined in worker_backend.cc.
  struct Call;      // one request in flight
  struct Prepared;  // its tokens, block keys, sampling
  struct Attempt;   // the outcome of one placement's calls

 private:
  void Run(const CompletionRequest& request, Call& call);
  Attempt RunGenerate(const CompletionRequest& request, Call& call, const Prepared& p,
                      const Placement& placement, const WorkerNode& node);
  Attempt RunDisaggregated(const CompletionRequest& request, Call& call, const Prepared& p,
                           const Placement& placement, const WorkerNode& prefill,
                           const WorkerNode& decode);
  void WatchCancellations();

  Scheduler* const scheduler_;
  NodeDirectory* const directory_;
  ChannelPool* const channels_;
  const WorkerBackendOptions options_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> resumed_{0};
  std::atomic<uint64_t> requests_{0};

  std::mutex mu_;  // before Call::mu when both are held
  std::condition_variable cv_;
  bool stopping_ = false;             // guarded by mu_
  absl::flat_hash_set<Call*> calls_;  // guarded by mu_
  std::thread watcher_;
};

}  // namespace strata::scheduler
