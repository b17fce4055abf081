#include "scheduler/server/worker_backend.h"

#include <chrono>

#include "common/block_key.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/tokenizer/chat_template.h"
#include "spdlog/spdlog.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::scheduler {

struct WorkerBackend::Call {
  std::shared_ptr<CompletionSink> sink;
  std::mutex mu;
  grpc::ClientContext* context = nullptr;  // guarded by mu
  bool cancelled = false;                  // guarded by mu
  absl::Time start = absl::Now();
  // What reached the client so far, over every attempt (the request's own thread only).
  std::vector<uint32_t> streamed_tokens;
  std::string streamed_text;

  // Makes `context` the one to cancel; false when the request is already cancelled.
  bool Attach(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(mu);
    context = ctx;
    return !cancelled;
  }
  void Detach() {
    std::lock_guard<std::mutex> lock(mu);
    context = nullptr;
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu);
    cancelled = true;
    if (context != nullptr) context->TryCancel();
  }
  bool Cancelled() {
    std::lock_guard<std::mutex> lock(mu);
    return cancelled;
  }
  // Passes a chunk's text to the client and records what was streamed (and the TTFT).
  void Deliver(const v1::TokenChunk& chunk);
};

struct WorkerBackend::Prepared {
  std::vector<uint32_t> tokens;
  Namespace ns;
  std::vector<BlockKey> keys;
  uint32_t block_tokens = kDefaultBlockTokens;
  double kv_bytes_per_token = 0;  // the reference worker's (0: unknown)
  v1::SamplingParams sampling;
  std::string id_prefix;
};

struct WorkerBackend::Attempt {
  absl::Status status;
  NodeIndex failed_node = kNoNode;  // whose call failed (for the retry)
  FinishReason finish = FinishReason::kStop;
  CompletionUsage usage;
};

namespace {

// The scheduler's view of requests, on the gateway's /metrics.
struct BackendMetrics {
  Counter& requests;
  Counter& rejected;
  Counter& retried;
  Counter& resumed;
  Histogram& decision;
  Histogram& ttft;
};

BackendMetrics& Metrics() {
  static BackendMetrics* m = [] {
    MetricsRegistry& r = MetricsRegistry::Default();
    auto& retries =
        r.AddCounter("strata_scheduler_retries_total",
                     "Requests retried on another worker, by when the failure came", {"when"});
    return new BackendMetrics{
        .requests = r.AddCounter("strata_scheduler_requests_total",
                                 "Completion requests that reached the workers' backend", {})
                        .Labels({}),
        .rejected =
            r.AddCounter("strata_scheduler_rejected_total",
                         "Requests refused early: their TTFT/TBT objectives could not be met", {})
                .Labels({}),
        .retried = retries.Labels({"before_text"}),
        .resumed = retries.Labels({"mid_stream"}),
        .decision =
            r.AddHistogram("strata_scheduler_decision_seconds", "Time to decide a placement", {},
                           ExponentialBuckets(1e-6, 2, 20))
                .Labels({}),
        .ttft = r.AddHistogram("strata_scheduler_ttft_seconds",
                               "From the request's arrival at the backend to its first text", {},
                               ExponentialBuckets(1e-3, 2, 18))
                    .Labels({}),
    };
  }();
  return *m;
}

absl::StatusOr<std::vector<uint32_t>> Tokenize(const tokenizer::Tokenizer& tok,
                                               const CompletionRequest& request) {
  std::vector<int32_t> ids;
  if (request.chat) {
    std::vector<tokenizer::ChatMessage> messages;
    messages.reserve(request.messages.size());
    for (const ChatMessage& m : request.messages) messages.push_back({m.role, m.content});
    // The rendered chat starts with BOS itself, so no special tokens are added when encoding.
    ASSIGN_OR_RETURN(std::string text, tokenizer::RenderChat(messages, true, tok.bos_token()));
    ASSIGN_OR_RETURN(ids, tok.Encode(text, false));
  } else {
    ASSIGN_OR_RETURN(ids, tok.Encode(request.prompt, true));
  }
  if (ids.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

template <typename T>
void SetPrompt(T* req, const std::vector<uint32_t>& tokens) {
  req->mutable_prompt_tokens()->Add(tokens.begin(), tokens.end());
}

void FillUsage(const v1::CachedTokens& cached, CompletionUsage& usage) {
  usage.cached_tokens = cached.total();
  usage.cached_tokens_by_tier[static_cast<int>(CacheTier::kGpu)] = cached.gpu();
  usage.cached_tokens_by_tier[static_cast<int>(CacheTier::kDram)] = cached.dram();
  usage.cached_tokens_by_tier[static_cast<int>(CacheTier::kSsd)] = cached.ssd();
}

// Retrying elsewhere can help: the node or the path to it failed, not the request.
bool Retryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
}

// How many of the streamed tokens a resumed attempt can take as given: the most whose text is
// exactly what the client received (the worker holds back the bytes of an unfinished UTF-8
// character, so the last token or two may have sent nothing yet). 0 when none fits.
size_t ResumePoint(const tokenizer::Tokenizer& tok, const std::vector<uint32_t>& tokens,
                   const std::string& text) {
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  for (size_t n = ids.size(); n > 0; --n) {
    if (tok.Decode(std::span<const int32_t>(ids.data(), n)) == text) return n;
    if (ids.size() - n >= 4) break;  // at most a character's worth of tokens is held back
  }
  return 0;
}

}  // namespace

void WorkerBackend::Call::Deliver(const v1::TokenChunk& chunk) {
  streamed_tokens.insert(streamed_tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
  if (chunk.text().empty()) return;
  if (streamed_text.empty()) Metrics().ttft.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  sink->OnText(chunk.text());
  streamed_text += chunk.text();
}

WorkerBackend::WorkerBackend(Scheduler* scheduler, NodeDirectory* directory, ChannelPool* channels,
                             WorkerBackendOptions options)
    : scheduler_(scheduler), directory_(directory), channels_(channels), options_(options) {
  watcher_ = std::thread([this] { WatchCancellations(); });
}

WorkerBackend::~WorkerBackend() { Shutdown(); }

void WorkerBackend::Shutdown() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      for (Call* call : calls_) call->Cancel();
    }
    cv_.notify_all();
    cv_.wait(lock, [this] { return calls_.empty(); });
  }
  if (watcher_.joinable()) watcher_.join();
}

void WorkerBackend::WatchCancellations() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    for (Call* call : calls_) {
      if (call->sink->Cancelled()) call->Cancel();
    }
    cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; });
  }
}

void WorkerBackend::Generate(const CompletionRequest& request,
                             std::shared_ptr<CompletionSink> sink) {
  auto call = std::make_unique<Call>();
  call->sink = std::move(sink);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      call->sink->OnDone(absl::UnavailableError("the scheduler is shutting down"),
                         FinishReason::kStop, {});
      return;
    }
    calls_.insert(call.get());
  }
  requests_.fetch_add(1);
  Metrics().requests.Increment();
  std::thread([this, request, call = std::move(call)]() mutable {
    Run(request, *call);
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(call.get());
    call.reset();
    // Notified under the lock: once it is released, Shutdown() may return and destroy `this`.
    cv_.notify_all();
  }).detach();
}

void WorkerBackend::Run(const CompletionRequest& request, Call& call) {
  CompletionSink& sink = *call.sink;
  if (options_.tokenizer == nullptr) {
    sink.OnDone(absl::FailedPreconditionError("the scheduler has no tokenizer"),
                FinishReason::kStop, {});
    return;
  }
  auto tokens = Tokenize(*options_.tokenizer, request);
  if (!tokens.ok()) {
    sink.OnDone(absl::InvalidArgumentError(tokens.status().message()), FinishReason::kStop, {});
    return;
  }
  std::optional<WorkerNode> reference = directory_->Reference();
  if (!reference.has_value()) {
    sink.OnDone(absl::UnavailableError("no worker has registered with the scheduler"),
                FinishReason::kStop, {});
    return;
  }
  Prepared p;
  p.tokens = *std::move(tokens);
  p.block_tokens = reference->block_tokens;
  p.kv_bytes_per_token = reference->kv_bytes_per_token;
  KvFormat format;
  format.codec = reference->codec;
  format.block_tokens = p.block_tokens;
  p.ns = MakeNamespace(reference->fingerprint, format, request.cache_salt);
  p.keys = ComputeBlockKeys(p.ns, p.tokens, p.block_tokens);
  p.sampling.set_max_tokens(request.max_tokens);
  p.sampling.set_temperature(static_cast<float>(request.temperature));
  p.sampling.set_top_p(static_cast<float>(request.top_p));
  for (const std::string& s : request.stop) p.sampling.add_stop(s);
  const std::string request_id = StrCat("sched-", next_id_.fetch_add(1));

  PlacementRequest preq;
  preq.keys = p.keys;
  preq.block_tokens = p.block_tokens;
  preq.kv_bytes_per_token = p.kv_bytes_per_token;
  preq.prompt_tokens = p.tokens.size();
  preq.max_output_tokens = request.max_tokens;
  preq.priority = request.priority;

  const std::vector<uint32_t> prompt = p.tokens;
  for (int attempt = 0;; ++attempt) {
    p.id_prefix = StrCat(request_id, ".", attempt);
    if (call.Cancelled()) {
      sink.OnDone(absl::CancelledError("request cancelled"), FinishReason::kStop, {});
      return;
    }
    const absl::Time decide_start = absl::Now();
    absl::StatusOr<Placement> placement = scheduler_->Decide(preq);
    Metrics().decision.Observe(absl::ToDoubleSeconds(absl::Now() - decide_start));
    if (!placement.ok()) {
      sink.OnDone(placement.status(), FinishReason::kStop, {});
      return;
    }
    if (placement->rejected) {
      Metrics().rejected.Increment();
      sink.OnDone(WithRetryAfter(absl::ResourceExhaustedError(placement->reject_reason),
                                 placement->retry_after_s),
                  FinishReason::kStop, {});
      return;
    }
    std::optional<WorkerNode> prefill = directory_->Get(placement->prefill);
    std::optional<WorkerNode> decode = directory_->Get(placement->decode);
    if (prefill.has_value() && decode.has_value() && prefill->index != decode->index &&
        prefill->role == v1::ROLE_BOTH) {
      // A node that serves both runs the whole request: no block handoff through the cache.
      const uint64_t context_tokens = preq.prompt_tokens + preq.max_output_tokens;
      scheduler_->load().FinishDecode(placement->decode, context_tokens);
      scheduler_->load().AddDecode(placement->prefill, context_tokens);
      placement->decode = placement->prefill;
      decode = prefill;
    }
    Attempt result;
    if (!prefill.has_value() || !decode.has_value()) {
      result.status = absl::UnavailableError("the placed node is not a known worker");
      scheduler_->ReportPrefillDone(*placement, 0, 0, 0);
      scheduler_->ReportDecodeDone(*placement, preq.prompt_tokens + preq.max_output_tokens);
    } else if (prefill->index == decode->index) {
      result = RunGenerate(request, call, p, *placement, *prefill);
    } else {
      result = RunDisaggregated(request, call, p, *placement, *prefill, *decode);
    }
    if (result.status.ok()) {
      // Over every attempt: a resumed one's prompt held the tokens streamed before it.
      result.usage.prompt_tokens = prompt.size();
      result.usage.completion_tokens += p.tokens.size() - prompt.size();
      sink.OnDone(absl::OkStatus(), result.finish, result.usage);
      return;
    }
    if (call.Cancelled()) {
      sink.OnDone(absl::CancelledError("request cancelled"), FinishReason::kStop, {});
      return;
    }
    bool retry = Retryable(result.status) && attempt + 1 < options_.max_attempts;
    const bool streamed = !call.streamed_tokens.empty();
    if (retry && streamed) {
      // Resume: the tokens the client has become part of the prompt of the next attempt.
      const size_t keep =
          ResumePoint(*options_.tokenizer, call.streamed_tokens, call.streamed_text);
      retry = keep > 0 || call.streamed_text.empty();
      if (retry) {
        call.streamed_tokens.resize(keep);
        p.tokens = prompt;
        p.tokens.insert(p.tokens.end(), call.streamed_tokens.begin(), call.streamed_tokens.end());
        p.keys = ComputeBlockKeys(p.ns, p.tokens, p.block_tokens);
        p.sampling.set_max_tokens(static_cast<uint32_t>(request.max_tokens - keep));
        preq.keys = p.keys;
        preq.prompt_tokens = p.tokens.size();
        preq.max_output_tokens = request.max_tokens - keep;
      }
    }
    std::string failed_id;
    if (auto failed = directory_->Get(result.failed_node); failed.has_value()) {
      failed_id = failed->id;
      // Unreachable: out of the candidates until its next heartbeat says otherwise.
      if (absl::IsUnavailable(result.status)) (void)scheduler_->load().MarkDead(failed->id);
    }
    spdlog::warn("scheduler: request {} failed on node {} ({}){}", p.id_prefix, failed_id,
                 ToStd(result.status.message()), retry ? "; retrying elsewhere" : "");
    if (!retry) {
      absl::Status status = streamed
                                ? absl::UnavailableError(StrCat("the worker failed mid-stream: ",
                                                                result.status.message()))
                                : result.status;
      sink.OnDone(std::move(status), FinishReason::kStop, {});
      return;
    }
    retries_.fetch_add(1);
    (streamed ? Metrics().resumed : Metrics().retried).Increment();
    if (streamed) {
      resumed_.fetch_add(1);
      if (p.sampling.max_tokens() == 0) {  // everything was streamed but the finish
        CompletionUsage usage;
        usage.prompt_tokens = prompt.size();
        usage.completion_tokens = call.streamed_tokens.size();
        sink.OnDone(absl::OkStatus(), FinishReason::kLength, usage);
        return;
      }
    }
  }
}

namespace {

// Reads a TokenChunk stream, handing each chunk to `deliver`. Returns the final status of the
// stream.
absl::Status ReadTokens(grpc::ClientReader<v1::TokenChunk>& reader,
                        const std::function<void(const v1::TokenChunk&)>& deliver,
                        FinishReason& finish, v1::TokenChunk::Usage& usage,
                        const std::function<void()>& on_first_chunk) {
  v1::TokenChunk chunk;
  bool first = true;
  v1::FinishReason reason = v1::FINISH_UNSPECIFIED;
  while (reader.Read(&chunk)) {
    if (first) {
      first = false;
      on_first_chunk();
    }
    deliver(chunk);
    if (chunk.finish_reason() != v1::FINISH_UNSPECIFIED) {
      reason = chunk.finish_reason();
      usage = chunk.usage();
    }
  }
  if (first) on_first_chunk();
  RETURN_IF_ERROR(FromGrpcStatus(reader.Finish()));
  switch (reason) {
    case v1::FINISH_STOP:
      finish = FinishReason::kStop;
      return absl::OkStatus();
    case v1::FINISH_LENGTH:
      finish = FinishReason::kLength;
      return absl::OkStatus();
    case v1::FINISH_CANCELLED:
      return absl::CancelledError("the worker cancelled the request");
    case v1::FINISH_ERROR:
      return absl::InternalError("the worker reported an error");
    default:
      return absl::InternalError("the worker's stream ended without a finish reason");
  }
}

void FillPlan(v1::CachePlan* plan, const std::string& ns, const std::string& tenant) {
  plan->set_namespace_id(ns);
  plan->set_tenant(tenant);
  plan->set_save_blocks(true);
}

}  // namespace

WorkerBackend::Attempt WorkerBackend::RunGenerate(const CompletionRequest& request, Call& call,
                                                  const Prepared& p, const Placement& placement,
                                                  const WorkerNode& node) {
  Attempt out;
  out.failed_node = node.index;
  v1::GenerateRequest req;
  req.set_request_id(StrCat(p.id_prefix, "-", node.id));
  SetPrompt(&req, p.tokens);
  *req.mutable_sampling() = p.sampling;
  req.set_priority(request.priority);
  v1::CachePlan* plan = req.mutable_cache();
  FillPlan(plan, std::string(p.ns.View()), request.cache_salt);
  for (const BlockKey& k : p.keys) plan->add_block_keys(std::string(k.View()));
  plan->set_cached_blocks(placement.local_blocks);
  if (placement.move.has_value()) {
    // The prefix lives on another node's cache server: load it from there.
    if (auto source = directory_->Get(placement.move->source);
        source.has_value() && source->cache_address != node.cache_address) {
      plan->set_cache_address(source->cache_address);
      plan->set_cached_blocks(placement.move->first_block + placement.move->num_blocks);
    }
  }

  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(options_.request_timeout));
  bool prefill_reported = false;
  auto report_prefill = [&] {
    if (prefill_reported) return;
    prefill_reported = true;
    scheduler_->ReportPrefillDone(placement, placement.new_tokens, placement.cached_tokens, 0);
  };
  v1::TokenChunk::Usage usage;
  if (!call.Attach(&ctx)) {
    out.status = absl::CancelledError("request cancelled");
  } else {
    auto stub = v1::Worker::NewStub(channels_->Get(node.grpc_address));
    auto reader = stub->Generate(&ctx, req);
    out.status = ReadTokens(
        *reader, [&](const v1::TokenChunk& c) { call.Deliver(c); }, out.finish, usage,
        report_prefill);
    call.Detach();
  }
  report_prefill();
  scheduler_->ReportDecodeDone(placement, p.tokens.size() + request.max_tokens);
  out.usage.completion_tokens = usage.completion_tokens();
  FillUsage(usage.cached(), out.usage);
  return out;
}

WorkerBackend::Attempt WorkerBackend::RunDisaggregated(const CompletionRequest& request, Call& call,
                                                       const Prepared& p,
                                                       const Placement& placement,
                                                       const WorkerNode& prefill,
                                                       const WorkerNode& decode) {
  Attempt out;
  const std::string ns(p.ns.View());
  auto finish_decode = [&] {
    scheduler_->ReportDecodeDone(placement, p.tokens.size() + request.max_tokens);
  };

  // 1. Prefill: computes what is not cached and publishes the prompt's full blocks.
  v1::PrefillRequest preq;
  preq.set_request_id(StrCat(p.id_prefix, "-p-", prefill.id));
  SetPrompt(&preq, p.tokens);
  *preq.mutable_sampling() = p.sampling;
  preq.set_priority(request.priority);
  FillPlan(preq.mutable_cache(), ns, request.cache_salt);
  for (const BlockKey& k : p.keys) preq.mutable_cache()->add_block_keys(std::string(k.View()));
  preq.mutable_cache()->set_cached_blocks(placement.local_blocks);
  if (placement.move.has_value()) {
    if (auto source = directory_->Get(placement.move->source);
        source.has_value() && source->cache_address != prefill.cache_address) {
      preq.mutable_cache()->set_cache_address(source->cache_address);
      preq.mutable_cache()->set_cached_blocks(placement.move->first_block +
                                              placement.move->num_blocks);
    }
  }
  v1::PrefillResponse presp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options_.request_timeout));
    if (!call.Attach(&ctx)) {
      out.status = absl::CancelledError("request cancelled");
    } else {
      auto stub = v1::Worker::NewStub(channels_->Get(prefill.grpc_address));
      out.status = FromGrpcStatus(stub->Prefill(&ctx, preq, &presp));
      call.Detach();
    }
  }
  if (!out.status.ok()) {
    out.failed_node = prefill.index;
    scheduler_->ReportPrefillDone(placement, 0, 0, 0);
    finish_decode();
    return out;
  }
  scheduler_->ReportPrefillDone(placement, presp.computed_tokens(), presp.cached().total(),
                                presp.prefill_ms() / 1000.0);
  FillUsage(presp.cached(), out.usage);

  // 2. Decode: loads the handed-over blocks, recomputes the partial tail, streams from the first
  // token on.
  v1::DecodeRequest dreq;
  dreq.set_request_id(StrCat(p.id_prefix, "-d-", decode.id));
  SetPrompt(&dreq, p.tokens);
  dreq.set_first_token(presp.first_token());
  *dreq.mutable_sampling() = p.sampling;
  dreq.set_priority(request.priority);
  v1::CachePlan* plan = dreq.mutable_cache();
  FillPlan(plan, ns, request.cache_salt);
  *plan->mutable_block_keys() = presp.block_keys();
  plan->set_cached_blocks(static_cast<uint32_t>(presp.block_keys_size()));
  if (prefill.cache_address != decode.cache_address) {
    plan->set_cache_address(prefill.cache_address);
  }
  out.failed_node = decode.index;
  v1::TokenChunk::Usage usage;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(options_.request_timeout));
  if (!call.Attach(&ctx)) {
    out.status = absl::CancelledError("request cancelled");
  } else {
    auto stub = v1::Worker::NewStub(channels_->Get(decode.grpc_address));
    auto reader = stub->Decode(&ctx, dreq);
    out.status = ReadTokens(
        *reader, [&](const v1::TokenChunk& c) { call.Deliver(c); }, out.finish, usage, [] {});
    call.Detach();
  }
  finish_decode();
  out.usage.completion_tokens = usage.completion_tokens();
  return out;
}

}  // namespace strata::scheduler
