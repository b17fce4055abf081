// The worker loop's traffic with the cache: loading cached prefixes (the loader thread), saving
// blocks write-behind, and swapping sequences out under page pressure.
#include <algorithm>

#include "compute_nodes/worker/sequence.h"
#include "compute_nodes/worker/worker_core.h"
#include "compute_nodes/worker/worker_internal.h"
#include "spdlog/spdlog.h"

namespace strata::worker {

using internal::AsU32;
using internal::BlockLayoutOf;
using internal::Metrics;
using internal::PayloadDtypeOf;

// ---- Loading ----

void WorkerCore::LoaderLoop() {
  runtime::KvPool& pool = engine_.kv_pool();
  const BlockLayout layout = BlockLayoutOf(pool.layout(), options_.cache_codec);
  const runtime::PayloadDtype dtype = PayloadDtypeOf(options_.cache_codec);
  while (true) {
    SeqPtr seq;
    {
      std::unique_lock<std::mutex> lock(mu_);
      loader_cv_.wait(lock, [&] { return stopping_ || !to_load_.empty(); });
      if (stopping_) return;
      seq = to_load_.front();
      to_load_.pop_front();
    }
    // The loop does not touch a loading sequence: its keys, tokens and pages are ours.
    const std::string address = seq->first_load ? seq->spec.cache_address : std::string();
    const bool remote = !address.empty() && address != caches_.local_address();
    cache_client::CacheClient* client = caches_.Get(address);
    int64_t imported = 0;
    CachedTokenCounts counts;
    bool failed = false;
    if (client != nullptr) {
      // Blocks [from, n): the ones before came from the pool's resident blocks.
      const int64_t from = seq->resident_blocks, n = seq->fetch_blocks - from;
      const std::vector<uint32_t> tokens = AsU32(
          std::span<const int32_t>(seq->tokens).subspan(from * block_tokens_, n * block_tokens_));
      // Each run of fetched blocks goes into its pages in one batched move while the cache
      // client reads the next run; on an error, the pages before `imported` hold their blocks.
      // Blocks come from the server's shm arena itself when the pool reads it in place.
      const std::span<const int32_t> pages =
          std::span<const int32_t>(seq->pages.pages).subspan(from);
      std::vector<std::span<const uint8_t>> payloads;
      auto import_run = [&](size_t first, std::span<const cache_client::FetchedBlock> blocks) {
        const size_t fit = std::min(blocks.size(), pages.size() - std::min(pages.size(), first));
        if (fit == 0) return false;  // more blocks than pages: the rest is not needed
        payloads.clear();
        for (size_t i = 0; i < fit; ++i) payloads.push_back(blocks[i].payload);
        int64_t done = 0;
        const absl::Status st = pool.ImportPages(pages.subspan(first, fit), dtype, payloads, &done);
        imported += done;
        if (!st.ok()) {
          failed = true;
          spdlog::warn("request {}: importing cached blocks into pages failed after {}: {}",
                       seq->spec.id, imported, st.ToString());
          return false;
        }
        return fit == blocks.size();
      };
      cache_client::FetchResult r = client->Fetch(
          seq->spec.ns, std::span<const BlockKey>(seq->keys).subspan(from, n), tokens, layout,
          seq->spec.id,
          {.buffer = [this](size_t bytes) { return LoadBuffer(bytes); },
           .on_blocks = import_run,
           .in_place =
               [&pool](std::span<const uint8_t> region, const std::shared_ptr<const void>& owner) {
                 return pool.ReadsInPlace(region, owner);
               }});
      for (int64_t i = 0; i < imported; ++i) {
        const cache_client::FetchedBlock& b = r.blocks[i];
        int64_t* tier = remote                                  ? &counts.remote
                        : b.tier == cache_client::HitTier::kSsd ? &counts.ssd
                        : b.tier == cache_client::HitTier::kGpu ? &counts.gpu
                                                                : &counts.dram;
        *tier += block_tokens_;
        counts.total += block_tokens_;
      }
      if (!r.first_failure.ok() && !failed) {
        failed = true;
        spdlog::warn("request {}: fetched {} of {} cached blocks ({}); recomputing the rest",
                     seq->spec.id, imported, r.hit_blocks, r.first_failure.ToString());
      }
    } else {
      failed = true;
    }
    const int64_t from = seq->resident_blocks;
    seq->kv_len = (from + imported) * block_tokens_;
    // (The loop publishes the imported blocks in CollectLoaded: the pool's bookkeeping is its.)
    // The fetched blocks are in the cache; the resident ones before them may not all be known
    // to be (then the later save starts at the first that is not).
    if (seq->saved_blocks == from) seq->saved_blocks = from + imported;
    {
      std::lock_guard<std::mutex> lock(seq->done_mu);
      seq->block_in_cache.resize(from + imported, 1);
    }
    if (seq->first_load) {
      seq->cached.total += counts.total;
      seq->cached.gpu += counts.gpu;
      seq->cached.dram += counts.dram;
      seq->cached.ssd += counts.ssd;
      seq->cached.remote += counts.remote;
      Metrics().cached.Increment(static_cast<double>(counts.total));
    } else if (from + imported < seq->fetch_blocks) {
      // A swap-in that could not get every saved block back recomputes the rest.
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.recomputed_swaps;
    }
    seq->first_load = false;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed) ++stats_.fetch_failures;
    stats_.cached_tokens += counts.total;
    --loading_count_;
    loaded_.push_back(seq);
    cv_.notify_all();
  }
}

absl::StatusOr<std::shared_ptr<HostBuffer>> WorkerCore::LoadBuffer(size_t bytes) {
  if (static_cast<int64_t>(bytes) > options_.load_buffer_bytes || load_buffer_failed_) {
    return HostBuffer::Allocate(bytes);
  }
  // A buffer that a timed-out transfer still holds is left to it; pinning is slow, so the
  // buffer grows at least 2x at a time.
  if (load_buffer_ == nullptr || load_buffer_.use_count() > 1 || load_buffer_->size() < bytes) {
    const size_t grown = load_buffer_ == nullptr ? 0 : 2 * load_buffer_->size();
    const size_t want = std::min<size_t>(std::max(bytes, grown), options_.load_buffer_bytes);
    load_buffer_.reset();
    absl::StatusOr<std::shared_ptr<HostBuffer>> b = engine_.kv_pool().AllocateHostBuffer(want);
    if (!b.ok()) {
      load_buffer_failed_ = true;
      spdlog::warn("worker: no {}-byte load buffer from the KV pool ({}); fetching to heap memory",
                   want, b.status().ToString());
      return HostBuffer::Allocate(bytes);
    }
    load_buffer_ = *std::move(b);
  }
  return load_buffer_;
}

std::shared_ptr<HostBuffer> WorkerCore::SaveBuffer(size_t bytes) {
  std::shared_ptr<HostBuffer>* best = nullptr;
  int64_t held = 0;
  for (std::shared_ptr<HostBuffer>& b : save_buffers_) {
    held += static_cast<int64_t>(b->size());
    if (b.use_count() == 1 && b->size() >= bytes &&
        (best == nullptr || b->size() < (*best)->size())) {
      best = &b;
    }
  }
  if (best != nullptr) return *best;
  // A new one, rounded up to 8 MiB so that small saves share buffers.
  const size_t want = (bytes + (size_t{8} << 20) - 1) / (size_t{8} << 20) * (size_t{8} << 20);
  if (save_buffer_failed_ || held + static_cast<int64_t>(want) > options_.save_buffer_bytes) {
    return nullptr;
  }
  absl::StatusOr<std::shared_ptr<HostBuffer>> b = engine_.kv_pool().AllocateHostBuffer(want);
  if (!b.ok()) {
    save_buffer_failed_ = true;
    spdlog::warn("worker: no {}-byte save buffer from the KV pool ({}); saving from heap memory",
                 want, b.status().ToString());
    return nullptr;
  }
  save_buffers_.push_back(*std::move(b));
  return save_buffers_.back();
}

void WorkerCore::CollectLoaded() {
  std::vector<SeqPtr> loaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loaded.swap(loaded_);
  }
  for (SeqPtr& seq : loaded) {
    seq->state = Sequence::State::kRunning;
    PublishFullBlocks(*seq);  // the blocks it loaded, for prompts admitted from now on
    running_.push_back(std::move(seq));
  }
  std::sort(running_.begin(), running_.end(),
            [](const SeqPtr& a, const SeqPtr& b) { return a->serial < b->serial; });
}

// ---- Keys and saves ----

void WorkerCore::ExtendKeys(Sequence& seq, int64_t blocks) const {
  while (static_cast<int64_t>(seq.keys.size()) < blocks) {
    const int64_t i = static_cast<int64_t>(seq.keys.size());
    const BlockKey parent = i == 0 ? BlockKey{} : seq.keys[i - 1];
    const std::vector<uint32_t> tokens =
        AsU32(std::span<const int32_t>(seq.tokens).subspan(i * block_tokens_, block_tokens_));
    seq.keys.push_back(ChainBlockKey(seq.spec.ns, parent, tokens));
  }
}

void WorkerCore::SaveBlocks(const SeqPtr& seq, int64_t upto) {
  upto = std::min(upto, seq->kv_len / block_tokens_);
  if (upto <= seq->saved_blocks) return;
  cache_client::CacheClient* client = caches_.Get("");
  if (client == nullptr) return;
  runtime::KvPool& pool = engine_.kv_pool();
  const BlockLayout layout = BlockLayoutOf(pool.layout(), options_.cache_codec);
  const runtime::PayloadDtype dtype = PayloadDtypeOf(options_.cache_codec);
  ExtendKeys(*seq, upto);
  std::vector<cache_client::BlockToSave> blocks;
  const int64_t from = seq->saved_blocks, n = upto - from;
  // The pages' payloads in one batched move, into a save buffer when one is free (else heap
  // vectors); blocks past a failed export are not saved (they stay in the pages, so nothing is
  // lost but the cache copy).
  const size_t page_bytes = pool.PayloadBytes(dtype);
  const std::shared_ptr<HostBuffer> buffer = SaveBuffer(n * page_bytes);
  std::vector<std::vector<uint8_t>> heap(buffer == nullptr ? n : 0);
  std::vector<std::span<uint8_t>> outs;
  for (int64_t i = 0; i < n; ++i) {
    if (buffer != nullptr) {
      outs.emplace_back(buffer->data() + i * page_bytes, page_bytes);
    } else {
      heap[i].resize(page_bytes);
      outs.emplace_back(heap[i]);
    }
  }
  int64_t exported = 0;
  const absl::Status st = pool.ExportPagesInto(
      std::span<const int32_t>(seq->pages.pages).subspan(from, n), dtype, outs, &exported);
  if (!st.ok()) {
    spdlog::warn("request {}: exporting blocks {}..{} failed after {}: {}", seq->spec.id, from,
                 upto, exported, st.ToString());
  }
  for (int64_t b = from; b < from + exported; ++b) {
    cache_client::BlockToSave block;
    block.key = seq->keys[b];
    if (b > 0) block.parent = seq->keys[b - 1];
    block.tokens =
        AsU32(std::span<const int32_t>(seq->tokens).subspan(b * block_tokens_, block_tokens_));
    if (buffer != nullptr) {
      block.payload = outs[b - from];
      block.payload_owner = buffer;
    } else {
      block.OwnPayload(std::move(heap[b - from]));
    }
    blocks.push_back(std::move(block));
  }
  seq->saved_blocks = upto;
  if (blocks.empty()) return;
  {
    std::lock_guard<std::mutex> lock(seq->done_mu);
    ++seq->pending_saves;
  }
  const std::vector<BlockKey> keys(seq->keys.begin() + from, seq->keys.begin() + upto);
  client->SaveAsync(seq->spec.ns, seq->spec.tenant, layout, std::move(blocks), seq->spec.id,
                    [this, seq, from, keys](absl::StatusOr<cache_client::SaveResult> result) {
                      int64_t saved = 0;
                      {
                        std::lock_guard<std::mutex> lock(seq->done_mu);
                        if (result.ok()) {
                          if (seq->block_in_cache.size() < from + keys.size()) {
                            seq->block_in_cache.resize(from + keys.size(), 0);
                          }
                          for (const BlockKey& k : result->keys_in_cache) {
                            auto it = std::find(keys.begin(), keys.end(), k);
                            if (it != keys.end())
                              seq->block_in_cache[from + (it - keys.begin())] = 1;
                          }
                          saved = result->stored;
                        } else {
                          spdlog::warn("request {}: saving blocks failed: {}", seq->spec.id,
                                       result.status().ToString());
                        }
                        --seq->pending_saves;
                      }
                      {
                        std::lock_guard<std::mutex> lock(mu_);
                        stats_.blocks_saved += saved;
                      }
                      cv_.notify_all();  // a swapped sequence may now come back
                      MaybeDeliverDone(seq);
                    });
}

// ---- Swapping ----

bool WorkerCore::SwapOutVictim(const SeqPtr& needing) {
  SeqPtr victim;
  for (const SeqPtr& s : running_) {
    if (s->state != Sequence::State::kRunning) continue;
    if (victim == nullptr || s->spec.priority < victim->spec.priority ||
        (s->spec.priority == victim->spec.priority && s->serial > victim->serial)) {
      victim = s;
    }
  }
  if (victim == nullptr) return false;
  int64_t holders = 0;
  for (const SeqPtr& s : running_) holders += s->state == Sequence::State::kRunning;
  if (victim == needing && holders == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    if (loading_count_ == 0) return false;  // alone and still short: the pool is too small
  }
  // The KV of the full blocks goes to the cache; the partial tail is recomputed on the way back.
  // Its full blocks also stay resident in the pool until their pages are needed, so a quick
  // swap-in finds them there.
  const bool to_cache = caches_.Get("") != nullptr;
  SaveBlocks(victim, victim->kv_len / block_tokens_);
  engine_.ForgetSequence(victim->engine_id());
  ReleaseSequencePages(*victim);
  victim->kv_len = 0;
  victim->saved_blocks = 0;
  victim->published_blocks = 0;
  victim->state = Sequence::State::kSwapped;
  {
    std::lock_guard<std::mutex> lock(victim->done_mu);
    victim->block_in_cache.clear();
  }
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  spdlog::info("request {}: swapped out ({} tokens{})", victim->spec.id, victim->tokens.size(),
               to_cache ? "" : ", no cache server: will recompute");
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.swapped_out;
    auto pos = std::find_if(swapped_.begin(), swapped_.end(),
                            [&](const SeqPtr& s) { return s->serial > victim->serial; });
    swapped_.insert(pos, victim);
  }
  Metrics().swaps.Labels({"out"}).Increment();
  return true;
}

}  // namespace strata::worker
