// ScriptedTestBackend: a TEST-ONLY CompletionBackend for driving the OpenAI gateway without
// workers. Never linked into the `strata` binary.
//
// It "generates" tokens "tok0 ", "tok1 ", ... (up to max_tokens, default script length 8) on its
// own thread, one every `token_interval`. Prompts containing
//   REJECT      → ResourceExhausted with Retry-After 7 s (the 429 path)
//   FAIL_MIDWAY → two tokens, then an Internal error
// Cached tokens are real: the prompt's bytes are tokens, keyed with common/block_key.h under
// MakeNamespace(model, format, cache_salt) in 16-token blocks, and a block counts as cached when
// an earlier request produced the same key — so two tenants with different salts never share.
// With `hold_until` > 0, no token is sent until that many requests are in flight (or 60 s pass),
// which makes concurrency tests deterministic.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "common/block_key.h"
#include "scheduler/http/completion_backend.h"

namespace strata::scheduler::testing_backend {

class ScriptedTestBackend : public CompletionBackend {
 public:
  struct Options {
    uint32_t script_tokens = 8;
    std::chrono::milliseconds token_interval{1};
    size_t hold_until = 0;
  };

  explicit ScriptedTestBackend(Options options)
      : options_(options), work_(boost::asio::make_work_guard(ioc_)) {
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ScriptedTestBackend() : ScriptedTestBackend(Options{}) {}
  ~ScriptedTestBackend() override {
    work_.reset();
    ioc_.stop();
    thread_.join();
  }

  std::vector<std::string> Models() const override { return {"strata-test"}; }

  void Generate(const CompletionRequest& request, std::shared_ptr<CompletionSink> sink) override {
    std::string prompt = request.prompt;
    for (const ChatMessage& m : request.messages) prompt += m.role + ": " + m.content + "\n";
    if (prompt.find("REJECT") != std::string::npos) {
      sink->OnDone(WithRetryAfter(absl::ResourceExhaustedError("cluster is saturated"), 7),
                   FinishReason::kStop, {});
      return;
    }
    auto job = std::make_shared<Job>();
    job->sink = std::move(sink);
    job->limit = std::min(request.max_tokens, options_.script_tokens);
    job->finish =
        request.max_tokens < options_.script_tokens ? FinishReason::kLength : FinishReason::kStop;
    job->fail_midway = prompt.find("FAIL_MIDWAY") != std::string::npos;
    job->usage = CachedUsage(prompt, request.cache_salt);
    job->timer = std::make_unique<boost::asio::steady_timer>(ioc_);
    const size_t active = ++active_;
    size_t seen = max_active_.load();
    while (active > seen && !max_active_.compare_exchange_weak(seen, active)) {
    }
    boost::asio::post(ioc_, [this, job] {
      job->started = std::chrono::steady_clock::now();
      Step(job);
    });
  }

  size_t max_active() const { return max_active_.load(); }

 private:
  struct Job {
    std::shared_ptr<CompletionSink> sink;
    uint32_t limit = 0;
    uint32_t sent = 0;
    FinishReason finish = FinishReason::kStop;
    bool fail_midway = false;
    CompletionUsage usage;
    std::unique_ptr<boost::asio::steady_timer> timer;
    std::chrono::steady_clock::time_point started;
  };

  CompletionUsage CachedUsage(const std::string& prompt, const std::string& salt) {
    std::vector<uint32_t> tokens(prompt.begin(), prompt.end());
    KvFormat format;
    format.block_tokens = 16;
    const Namespace ns = MakeNamespace(ModelFingerprint{}, format, salt);
    const std::vector<BlockKey> keys = ComputeBlockKeys(ns, tokens, 16);
    CompletionUsage usage;
    usage.prompt_tokens = tokens.size();
    std::lock_guard<std::mutex> lock(mu_);
    size_t hit = 0;
    while (hit < keys.size() && seen_.contains(keys[hit])) ++hit;
    for (const BlockKey& k : keys) seen_.insert(k);
    usage.cached_tokens = hit * 16;
    usage.cached_tokens_by_tier[static_cast<int>(CacheTier::kDram)] = usage.cached_tokens;
    return usage;
  }

  void Step(const std::shared_ptr<Job>& job) {
    if (active_.load() >= options_.hold_until) released_ = true;
    if (!released_.load() &&
        std::chrono::steady_clock::now() - job->started < std::chrono::seconds(60)) {
      job->timer->expires_after(std::chrono::milliseconds(5));
      job->timer->async_wait([this, job](auto) { Step(job); });
      return;
    }
    if (job->sink->Cancelled()) return Finish(job, absl::CancelledError("client went away"));
    if (job->fail_midway && job->sent == 2) {
      return Finish(job, absl::InternalError("worker failed mid-generation"));
    }
    if (job->sent == job->limit) return Finish(job, absl::OkStatus());
    job->sink->OnText("tok" + std::to_string(job->sent) + " ");
    ++job->sent;
    job->timer->expires_after(options_.token_interval);
    job->timer->async_wait([this, job](auto) { Step(job); });
  }

  void Finish(const std::shared_ptr<Job>& job, absl::Status status) {
    --active_;
    job->usage.completion_tokens = job->sent;
    job->sink->OnDone(std::move(status), job->finish, job->usage);
  }

  Options options_;
  boost::asio::io_context ioc_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::atomic<size_t> active_{0};
  std::atomic<size_t> max_active_{0};
  std::atomic<bool> released_{false};   // hold_until was reached once
  std::mutex mu_;                       // std::mutex: visible to ThreadSanitizer
  absl::flat_hash_set<BlockKey> seen_;  // guarded by mu_
};

}  // namespace strata::scheduler::testing_backend
