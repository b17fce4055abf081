#include "compute_nodes/worker/worker_core.h"

#include <algorithm>
#include <chrono>

#include "common/strings.h"
#include "compute_nodes/worker/sequence.h"
#include "compute_nodes/worker/worker_internal.h"
#include "spdlog/spdlog.h"

namespace strata::worker {
namespace {

using internal::AsU32;
using internal::Metrics;
using internal::Ms;

const char* FinishName(Finish f) {
  switch (f) {
    case Finish::kStop:
      return "stop";
    case Finish::kLength:
      return "length";
    case Finish::kCancelled:
      return "cancelled";
    case Finish::kError:
      return "error";
    case Finish::kNone:
      break;
  }
  return "none";
}

}  // namespace

WorkerCore::WorkerCore(runtime::Engine& engine, CacheDirectory& caches, WorkerCoreOptions options)
    : engine_(engine),
      caches_(caches),
      options_(options),
      block_tokens_(engine.kv_pool().layout().block_tokens),
      resident_(engine.kv_pool(), options.resident_blocks) {
  load_.set_total_kv_pages(static_cast<uint32_t>(engine_.kv_pool().num_pages()));
  load_.set_free_kv_pages(static_cast<uint32_t>(resident_.available_pages()));
  Metrics();
}

WorkerCore::~WorkerCore() { Stop(); }

void WorkerCore::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return;
  started_ = true;
  loop_ = std::thread([this] { Loop(); });
  loader_ = std::thread([this] { LoaderLoop(); });
}

void WorkerCore::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  loader_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  if (loader_.joinable()) loader_.join();
  // Save callbacks point at this core: let them all run before it can go away.
  caches_.FlushSaves();
  // Whatever is left ends now; the threads are gone, so this thread owns every sequence.
  std::vector<SeqPtr> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, seq] : by_id_) left.push_back(seq);
    by_id_.clear();
    waiting_.clear();
    swapped_.clear();
    to_load_.clear();
    loaded_.clear();
  }
  running_.clear();
  for (const SeqPtr& seq : left) {
    engine_.ForgetSequence(seq->engine_id());
    resident_.Discard(seq->pages);
    seq->state = Sequence::State::kDone;
    {
      std::lock_guard<std::mutex> lock(seq->done_mu);
      seq->finished = true;
      seq->outcome.finish = Finish::kError;
      seq->outcome.status = absl::UnavailableError("worker stopping");
      seq->pending_saves = 0;
    }
    MaybeDeliverDone(seq);
  }
  resident_.DropIdle();  // the pool may outlive this core
}

int64_t WorkerCore::PagesFor(int64_t tokens) const {
  return (tokens + block_tokens_ - 1) / block_tokens_;
}

absl::Status WorkerCore::Submit(RequestSpec spec, RequestEvents events) {
  const model::ModelConfig& config = engine_.config();
  if (spec.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  for (int32_t id : spec.prompt) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          StrCat("token id ", id, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(spec.prompt.size());
  if (n >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(StrCat("prompt of ", n, " tokens reaches the context limit (",
                                             config.max_position_embeddings, ")"));
  }
  if (spec.kind == RequestKind::kDecode &&
      (spec.first_token < 0 || spec.first_token >= config.vocab_size)) {
    return absl::InvalidArgumentError("decode request without a valid first_token");
  }
  if (PagesFor(n + 1) > engine_.kv_pool().num_pages()) {
    return absl::ResourceExhaustedError(StrCat("prompt of ", n, " tokens needs ", PagesFor(n + 1),
                                               " KV pages; this worker has ",
                                               engine_.kv_pool().num_pages()));
  }
  if (spec.sampling.max_tokens <= 0) spec.sampling.max_tokens = 1;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || !started_) return absl::UnavailableError("worker is not running");
  if (by_id_.contains(spec.id)) {
    return absl::InvalidArgumentError(StrCat("request id '", spec.id, "' is already running"));
  }
  if (static_cast<int64_t>(waiting_.size()) >= options_.max_queued) {
    return absl::ResourceExhaustedError(
        StrCat("worker queue is full (", options_.max_queued, " requests)"));
  }
  auto seq = std::make_shared<Sequence>(std::move(spec), std::move(events), next_serial_++);
  seq->tokens = seq->spec.prompt;
  seq->prompt_len = n;
  if (seq->spec.kind == RequestKind::kDecode) {
    seq->tokens.push_back(seq->spec.first_token);
    seq->sampler.SkipOne();  // the prefill worker drew the first token from this stream
  }
  seq->outcome.prompt_tokens = n;
  by_id_[seq->spec.id] = seq;
  waiting_.push_back(seq);
  cv_.notify_all();
  return absl::OkStatus();
}

bool WorkerCore::Cancel(const std::string& id) {
  SeqPtr queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    SeqPtr seq = it->second;
    seq->cancelled = true;
    for (auto* q : {&waiting_, &swapped_}) {
      auto pos = std::find(q->begin(), q->end(), seq);
      if (pos != q->end()) {
        q->erase(pos);
        by_id_.erase(it);
        queued = seq;
        break;
      }
    }
  }
  if (queued != nullptr) {
    // Not in the loop's hands: finish it here (a swapped sequence holds no pages).
    {
      std::lock_guard<std::mutex> lock(queued->done_mu);
      queued->finished = true;
      queued->outcome.finish = Finish::kCancelled;
      queued->outcome.status = absl::CancelledError("cancelled");
    }
    queued->state = Sequence::State::kDone;
    MaybeDeliverDone(queued);
  }
  cv_.notify_all();
  return true;
}

v1::WorkerLoad WorkerCore::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_;
}

WorkerStats WorkerCore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void WorkerCore::Loop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (!Step()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return stopping_ || !loaded_.empty() || !waiting_.empty() || !swapped_.empty();
      });
    }
  }
}

// ---- Admission ----

void WorkerCore::AdmitLocked(std::vector<SeqPtr>* ready) {
  runtime::KvPool& pool = engine_.kv_pool();
  const absl::Time now = absl::Now();
  while (static_cast<int64_t>(running_.size()) + loading_count_ < options_.max_running) {
    // Swapped-out sequences come back first (they are older), once their blocks are saved.
    std::deque<SeqPtr>* queue = nullptr;
    if (!swapped_.empty()) {
      std::lock_guard<std::mutex> lock(swapped_.front()->done_mu);
      if (swapped_.front()->pending_saves == 0) queue = &swapped_;
    }
    if (queue == nullptr && !waiting_.empty()) queue = &waiting_;
    if (queue == nullptr) return;
    SeqPtr seq = queue->front();
    if (seq->spec.deadline < now && seq->generated() == 0) {
      queue->pop_front();
      by_id_.erase(seq->spec.id);
      {
        std::lock_guard<std::mutex> lock(seq->done_mu);
        seq->finished = true;
        seq->outcome.finish = Finish::kError;
        seq->outcome.status = absl::DeadlineExceededError("deadline passed while queued");
      }
      seq->state = Sequence::State::kDone;
      ready->push_back(seq);  // delivered by the caller, outside the lock
      continue;
    }
    const int64_t need = seq->prefill_target() + 1;
    if (PagesFor(need) > pool.num_pages()) {
      queue->pop_front();
      by_id_.erase(seq->spec.id);
      {
        std::lock_guard<std::mutex> lock(seq->done_mu);
        seq->finished = true;
        seq->outcome.finish = Finish::kLength;
      }
      seq->state = Sequence::State::kDone;
      ready->push_back(seq);
      continue;
    }
    // The prompt's leading full blocks that may come from elsewhere than a prefill: a request
    // that must sample keeps at least one token to compute (its logits). The pool's resident
    // blocks come first; the cache server is asked for the rest.
    const bool must_sample = seq->generated() == 0;
    const int64_t reusable = (seq->prefill_target() - (must_sample ? 1 : 0)) / block_tokens_;
    const bool has_cache =
        (seq->first_load && !seq->spec.cache_address.empty()) || caches_.has_local();
    if (reusable > 0 && (options_.resident_blocks || has_cache)) ExtendKeys(*seq, reusable);
    int64_t saved = 0;
    const int64_t resident =
        options_.resident_blocks
            ? resident_.Acquire(std::span<const BlockKey>(seq->keys).first(reusable), &seq->pages,
                                &saved)
            : 0;
    if (!resident_.EnsureCapacity(seq->pages, need).ok()) {
      resident_.Release({}, 0, seq->pages);  // only the references taken above
      return;                                // first come, first served: wait for pages
    }
    queue->pop_front();
    seq->admitted = now;
    if (queue == &swapped_) {
      ++stats_.swapped_in;
      Metrics().swaps.Labels({"in"}).Increment();
    }
    seq->resident_blocks = resident;
    seq->published_blocks = resident;
    seq->kv_len = resident * block_tokens_;
    seq->saved_blocks = saved;
    {
      std::lock_guard<std::mutex> lock(seq->done_mu);
      seq->block_in_cache.assign(resident, 0);
      std::fill_n(seq->block_in_cache.begin(), saved, 1);
    }
    if (resident > 0) {
      stats_.resident_tokens += seq->kv_len;
      if (seq->first_load) {
        seq->cached.gpu += seq->kv_len;
        seq->cached.total += seq->kv_len;
        stats_.cached_tokens += seq->kv_len;
        Metrics().resident.Increment(static_cast<double>(seq->kv_len));
      }
    }
    int64_t fetchable = reusable;
    if (options_.max_fetch_blocks > 0) {
      fetchable = std::min(fetchable, resident + options_.max_fetch_blocks);
    }
    const bool fetch = fetchable > resident && has_cache;
    if (queue == &swapped_ && !fetch && resident < reusable) {
      ++stats_.recomputed_swaps;  // no cache to bring the rest back (the loader counts its own)
    }
    if (fetch) {
      seq->fetch_blocks = fetchable;
      seq->state = Sequence::State::kLoading;
      ++loading_count_;
      to_load_.push_back(seq);
      loader_cv_.notify_one();
    } else {
      seq->first_load = false;
      seq->state = Sequence::State::kRunning;
      running_.push_back(seq);
    }
  }
}

void WorkerCore::PublishFullBlocks(Sequence& seq) {
  const int64_t full = seq.kv_len / block_tokens_;
  if (!options_.resident_blocks || full <= seq.published_blocks) return;
  ExtendKeys(seq, full);
  resident_.Publish(std::span<const BlockKey>(seq.keys).first(full), seq.saved_blocks, seq.pages,
                    seq.published_blocks);
  seq.published_blocks = full;
}

void WorkerCore::ReleaseSequencePages(Sequence& seq, bool discard) {
  if (discard) {
    resident_.Discard(seq.pages);
    return;
  }
  const int64_t full = seq.kv_len / block_tokens_;
  if (options_.resident_blocks) ExtendKeys(seq, full);
  const size_t keep = std::min<size_t>(seq.keys.size(), full);
  resident_.Release(std::span<const BlockKey>(seq.keys).first(keep), seq.saved_blocks, seq.pages);
}

// ---- Finishing ----

void WorkerCore::End(const SeqPtr& seq, Finish finish, absl::Status status) {
  const bool ok = finish == Finish::kStop || finish == Finish::kLength;
  if (ok && seq->spec.save_blocks && seq->spec.kind != RequestKind::kPrefill) {
    // The full blocks of prompt + output, so the next turn of a chat hits.
    SaveBlocks(seq, seq->kv_len / block_tokens_);
  }
  engine_.ForgetSequence(seq->engine_id());
  // The full blocks stay in the pool for a later prompt, unless the engine failed on them.
  ReleaseSequencePages(*seq, /*discard=*/finish == Finish::kError);
  seq->state = Sequence::State::kDone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    by_id_.erase(seq->spec.id);
  }
  {
    std::lock_guard<std::mutex> lock(seq->done_mu);
    seq->finished = true;
    seq->outcome.finish = finish;
    seq->outcome.status = std::move(status);
  }
  MaybeDeliverDone(seq);
}

void WorkerCore::MaybeDeliverDone(const SeqPtr& seq) {
  RequestOutcome outcome;
  {
    std::lock_guard<std::mutex> lock(seq->done_mu);
    if (!seq->finished || seq->pending_saves > 0 || seq->done_sent) return;
    seq->done_sent = true;
    outcome = seq->outcome;
    // The hand-off: the prompt's leading full blocks that are in the cache now.
    const int64_t prompt_blocks = seq->prompt_len / block_tokens_;
    for (int64_t b = 0; b < prompt_blocks && b < static_cast<int64_t>(seq->block_in_cache.size()) &&
                        seq->block_in_cache[b];
         ++b) {
      outcome.block_keys.push_back(seq->keys[b]);
    }
  }
  outcome.cached = seq->cached;
  outcome.computed_tokens = seq->computed_tokens;
  outcome.completion_tokens = seq->generated();
  outcome.tail_tokens = seq->prompt_len % block_tokens_;
  if (seq->admitted != absl::InfinitePast()) {
    outcome.queue_ms = Ms(seq->admitted - seq->submitted);
    if (seq->first_token_at != absl::InfinitePast()) {
      outcome.prefill_ms = Ms(seq->first_token_at - seq->admitted);
      outcome.ttft_ms = Ms(seq->first_token_at - seq->submitted);
    }
  }
  outcome.mean_tbt_ms = seq->tbt_count > 0 ? seq->tbt_sum_ms / seq->tbt_count : 0;
  Metrics().requests.Labels({FinishName(outcome.finish)}).Increment();
  if (seq->events.on_done) seq->events.on_done(outcome);
}

// ---- The step ----

void WorkerCore::EmitTokens(const SeqPtr& seq, std::span<const int32_t> tokens) {
  const absl::Time now = absl::Now();
  if (seq->first_token_at == absl::InfinitePast()) {
    seq->first_token_at = now;
  } else {
    seq->tbt_sum_ms += Ms(now - seq->last_token_at);
    ++seq->tbt_count;
  }
  seq->last_token_at = now;
  seq->emitted += static_cast<int64_t>(tokens.size());
  if (seq->events.on_tokens) seq->events.on_tokens(tokens);
}

void WorkerCore::AfterPrefill(const SeqPtr& seq, const std::vector<float>& logits) {
  if (seq->generated() == 0) {
    const int32_t next = seq->sampler.Sample(logits);
    seq->tokens.push_back(next);
    {
      std::lock_guard<std::mutex> lock(seq->done_mu);
      seq->outcome.first_token = next;
    }
    if (seq->spec.kind == RequestKind::kPrefill) {
      seq->first_token_at = absl::Now();
      if (seq->spec.save_blocks) SaveBlocks(seq, seq->prompt_len / block_tokens_);
      End(seq, Finish::kStop, absl::OkStatus());
      return;
    }
    Metrics().generated.Increment();
  }
  if (seq->emitted < seq->generated()) {
    // The first token (sampled here, or handed over with a kDecode request).
    EmitTokens(seq, std::span<const int32_t>(seq->tokens).subspan(seq->prompt_len + seq->emitted));
  }
  const std::span<const int32_t> generated =
      std::span<const int32_t>(seq->tokens).subspan(seq->prompt_len);
  const runtime::StopReason stop = runtime::CheckStop(seq->spec.sampling, generated);
  if (stop != runtime::StopReason::kNone) {
    End(seq, stop == runtime::StopReason::kMaxTokens ? Finish::kLength : Finish::kStop,
        absl::OkStatus());
  }
}

void WorkerCore::AfterDecode(const SeqPtr& seq, const runtime::SequenceOutput& out) {
  // The engine picked it with this step's draw (SequenceInput::draw): the stream has advanced.
  if (out.token < 0) {
    End(seq, Finish::kError, absl::InternalError("engine returned no token for a decode step"));
    return;
  }
  const int32_t next = out.token;
  seq->tokens.push_back(next);
  Metrics().generated.Increment();
  EmitTokens(seq, {&seq->tokens.back(), 1});
  const runtime::StopReason stop = runtime::CheckStop(
      seq->spec.sampling, std::span<const int32_t>(seq->tokens).subspan(seq->prompt_len));
  if (stop != runtime::StopReason::kNone) {
    End(seq, stop == runtime::StopReason::kMaxTokens ? Finish::kLength : Finish::kStop,
        absl::OkStatus());
  } else if (seq->kv_len + 1 >= engine_.config().max_position_embeddings) {
    End(seq, Finish::kLength, absl::OkStatus());
  }
}

bool WorkerCore::Step() {
  std::vector<SeqPtr> ended;  // finished while queued: deliver outside the lock
  std::vector<SeqPtr> cancelled;
  CollectLoaded();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const SeqPtr& s : running_) {
      if (s->cancelled) cancelled.push_back(s);
    }
    AdmitLocked(&ended);
  }
  for (const SeqPtr& s : ended) MaybeDeliverDone(s);
  for (const SeqPtr& s : cancelled) End(s, Finish::kCancelled, absl::CancelledError("cancelled"));
  std::erase_if(running_, [](const SeqPtr& s) { return s->state != Sequence::State::kRunning; });

  // Sequences that reached their prefill target without sampling (a hand-over or swap-in fully
  // served by the cache) start decoding now.
  for (const SeqPtr& s : std::vector<SeqPtr>(running_)) {
    if (s->generated() > 0 && s->emitted < s->generated() && s->kv_len >= s->prefill_target()) {
      AfterPrefill(s, {});
    }
  }
  std::erase_if(running_, [](const SeqPtr& s) { return s->state != Sequence::State::kRunning; });

  // Decode tokens first (one per decoding sequence), oldest first; each may need a page.
  std::vector<SeqPtr> decode, prefill;
  std::vector<int64_t> chunk;
  for (const SeqPtr& s : std::vector<SeqPtr>(running_)) {
    if (s->state != Sequence::State::kRunning || !s->decoding()) continue;
    while (!resident_.EnsureCapacity(s->pages, s->kv_len + 1).ok()) {
      if (!SwapOutVictim(s)) {
        spdlog::warn("request {}: the KV pool cannot hold {} tokens; ending it", s->spec.id,
                     s->kv_len + 1);
        End(s, Finish::kLength, absl::OkStatus());
        break;
      }
      if (s->state != Sequence::State::kRunning) break;  // it was the victim
    }
    if (s->state == Sequence::State::kRunning) decode.push_back(s);
  }
  std::erase_if(decode, [](const SeqPtr& s) { return s->state != Sequence::State::kRunning; });
  int64_t budget = options_.token_budget - static_cast<int64_t>(decode.size());
  for (const SeqPtr& s : running_) {
    if (s->state != Sequence::State::kRunning || s->decoding()) continue;
    if (budget <= 0 && !(decode.empty() && prefill.empty())) break;
    const int64_t n = std::min(std::max<int64_t>(budget, 1), s->prefill_target() - s->kv_len);
    prefill.push_back(s);
    chunk.push_back(n);
    budget -= n;
  }
  if (decode.empty() && prefill.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    RefreshLoadLocked(0);
    return false;
  }

  std::vector<runtime::SequenceInput> inputs;
  for (const SeqPtr& s : decode) {
    runtime::SequenceInput in{
        {&s->tokens.back(), 1}, s->kv_len, &s->pages, false, runtime::AttentionForm::kAbsorbed};
    in.draw = s->sampler.Draw();  // the engine picks the token where the logits are
    inputs.push_back(in);
  }
  for (size_t i = 0; i < prefill.size(); ++i) {
    const SeqPtr& s = prefill[i];
    inputs.push_back({std::span<const int32_t>(s->tokens).subspan(s->kv_len, chunk[i]), s->kv_len,
                      &s->pages, false, runtime::AttentionForm::kMha, s->engine_id()});
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<runtime::SequenceOutput> outputs;
  const absl::Status st = engine_.Forward(inputs, &outputs);
  const double step_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Metrics().step.Observe(step_s);
  if (!st.ok()) {
    // An engine error is not the request's fault in general, but retrying the same input would
    // fail the same way: end the batch's requests with the error, keep serving.
    spdlog::error("engine step failed: {}", st.ToString());
    for (const SeqPtr& s : decode) End(s, Finish::kError, st);
    for (const SeqPtr& s : prefill) End(s, Finish::kError, st);
    std::erase_if(running_, [](const SeqPtr& s) { return s->state != Sequence::State::kRunning; });
    return true;
  }
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < decode.size(); ++i) {
    decode[i]->kv_len += 1;
    PublishFullBlocks(*decode[i]);
    AfterDecode(decode[i], outputs[i]);
  }
  for (size_t i = 0; i < prefill.size(); ++i) {
    const SeqPtr& s = prefill[i];
    s->kv_len += chunk[i];
    s->computed_tokens += s->generated() == 0 ? chunk[i] : 0;
    prefill_tokens += chunk[i];
    if (s->spec.save_blocks) SaveBlocks(s, s->kv_len / block_tokens_);
    PublishFullBlocks(*s);
    if (s->kv_len >= s->prefill_target()) AfterPrefill(s, outputs[decode.size() + i].logits);
  }
  Metrics().computed.Increment(static_cast<double>(prefill_tokens));
  std::erase_if(running_, [](const SeqPtr& s) { return s->state != Sequence::State::kRunning; });

  // Step-time estimates for the scheduler's cost model (EWMA, alpha 0.2).
  const double ms = step_s * 1e3;
  if (prefill_tokens > 0 && decode.empty()) {
    const double per = ms / prefill_tokens;
    prefill_ms_per_token_ =
        prefill_ms_per_token_ == 0 ? per : 0.8 * prefill_ms_per_token_ + 0.2 * per;
  } else if (prefill_tokens == 0) {
    decode_step_ms_ = decode_step_ms_ == 0 ? ms : 0.8 * decode_step_ms_ + 0.2 * ms;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.computed_tokens += prefill_tokens;
  stats_.generated_tokens += static_cast<int64_t>(decode.size());
  RefreshLoadLocked(decode.size());
  return true;
}

void WorkerCore::RefreshLoadLocked(size_t decode_batch) {
  uint64_t queued_tokens = 0;
  for (const SeqPtr& s : waiting_) queued_tokens += s->prompt_len;
  uint64_t running_tokens = 0;
  for (const SeqPtr& s : running_) running_tokens += s->tokens.size();
  load_.set_queued_requests(static_cast<uint32_t>(waiting_.size() + swapped_.size()));
  load_.set_running_requests(static_cast<uint32_t>(running_.size() + loading_count_));
  load_.set_queued_prefill_tokens(queued_tokens);
  load_.set_running_tokens(running_tokens);
  load_.set_free_kv_pages(static_cast<uint32_t>(resident_.available_pages()));
  load_.set_prefill_ms_per_token(prefill_ms_per_token_);
  load_.set_decode_step_ms(decode_step_ms_);
  load_.set_decode_batch_size(static_cast<uint32_t>(decode_batch));
  Metrics().queued.Set(load_.queued_requests());
  Metrics().running.Set(load_.running_requests());
  Metrics().free_pages.Set(load_.free_kv_pages());
  Metrics().resident_blocks.Set(static_cast<double>(resident_.resident_blocks()));
}

}  // namespace strata::worker
