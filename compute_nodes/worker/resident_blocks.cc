#include "compute_nodes/worker/resident_blocks.h"

#include "common/check.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace strata::worker {

ResidentBlocks::ResidentBlocks(runtime::KvPool& pool, bool enabled)
    : pool_(pool), enabled_(enabled) {}

ResidentBlocks::~ResidentBlocks() {
  DropIdle();
  std::lock_guard<std::mutex> lock(mu_);
  if (!blocks_.empty()) {
    spdlog::error("resident blocks: {} blocks still held by sequences at shutdown", blocks_.size());
  }
}

int64_t ResidentBlocks::Acquire(std::span<const BlockKey> keys, runtime::PageTable* table,
                                int64_t* saved) {
  STRATA_CHECK(table->pages.empty(), "ResidentBlocks::Acquire: the table already has pages");
  std::lock_guard<std::mutex> lock(mu_);
  *saved = 0;
  bool saved_run = true;
  for (const BlockKey& key : keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || it->second.forgotten) break;
    Block& b = it->second;
    if (b.refs++ == 0) idle_.erase(b.idle);
    table->pages.push_back(b.page);
    if (track_touches_ && touched_.size() < kMaxChanges) touched_.insert(key);
    saved_run = saved_run && b.saved;
    if (saved_run) ++*saved;
  }
  const int64_t n = static_cast<int64_t>(table->pages.size());
  hits_ += n;
  return n;
}

int64_t ResidentBlocks::available_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.free_pages() + static_cast<int64_t>(idle_.size());
}

absl::Status ResidentBlocks::EnsureCapacity(runtime::PageTable& table, int64_t tokens) {
  const int64_t b = pool_.layout().block_tokens;
  const int64_t need = (tokens + b - 1) / b - static_cast<int64_t>(table.pages.size());
  if (need <= 0) return absl::OkStatus();
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t idle = static_cast<int64_t>(idle_.size());
    if (need > pool_.free_pages() + idle) {
      return absl::ResourceExhaustedError(StrCat("KV pool: ", need, " pages needed, ",
                                                 pool_.free_pages(), " free and ", idle,
                                                 " held by idle cached blocks"));
    }
    while (pool_.free_pages() < need) ReclaimOneLocked();
  }
  return runtime::EnsureCapacity(pool_, table, tokens);
}

void ResidentBlocks::Publish(std::span<const BlockKey> keys, int64_t saved,
                             const runtime::PageTable& table, size_t from) {
  if (!enabled_) return;
  STRATA_CHECK(keys.size() <= table.pages.size(), "ResidentBlocks::Publish: more keys than pages");
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = from; i < keys.size(); ++i) {
    const int32_t page = table.pages[i];
    if (by_page_.contains(page) || blocks_.contains(keys[i])) continue;
    Block& b = blocks_[keys[i]];
    b.parent = i == 0 ? BlockKey{} : keys[i - 1];
    b.page = page;
    b.refs = 1;
    b.saved = static_cast<int64_t>(i) < saved;
    by_page_[page] = keys[i];
    NoteLocked({.key = keys[i], .parent = b.parent, .added = true});
  }
}

void ResidentBlocks::Release(std::span<const BlockKey> keys, int64_t saved,
                             runtime::PageTable& table) {
  STRATA_CHECK(keys.size() <= table.pages.size(), "ResidentBlocks::Release: more keys than pages");
  std::lock_guard<std::mutex> lock(mu_);
  // Tail first: idle_ is reclaimed from its front, so the chain's head goes last.
  for (size_t i = table.pages.size(); i-- > 0;) {
    const int32_t page = table.pages[i];
    if (auto held = by_page_.find(page); held != by_page_.end()) {
      Block& b = blocks_.at(held->second);
      if (static_cast<int64_t>(i) < saved) b.saved = true;
      STRATA_CHECK(b.refs > 0, "ResidentBlocks::Release: a resident page released twice");
      if (--b.refs == 0) LetGoLocked(held->second);
      continue;
    }
    if (!enabled_ || i >= keys.size() || blocks_.contains(keys[i])) {
      pool_.Free(page);
      continue;
    }
    Block& b = blocks_[keys[i]];
    b.parent = i == 0 ? BlockKey{} : keys[i - 1];
    b.page = page;
    b.saved = static_cast<int64_t>(i) < saved;
    b.idle = idle_.insert(idle_.end(), keys[i]);
    by_page_[page] = keys[i];
    NoteLocked({.key = keys[i], .parent = b.parent, .added = true});
  }
  table.pages.clear();
}

void ResidentBlocks::Discard(runtime::PageTable& table) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const int32_t page : table.pages) {
    auto held = by_page_.find(page);
    if (held == by_page_.end()) {
      pool_.Free(page);
      continue;
    }
    // A resident block: only the reference goes (its KV was complete before the failure).
    Block& b = blocks_.at(held->second);
    if (--b.refs == 0) LetGoLocked(held->second);
  }
  table.pages.clear();
}

int64_t ResidentBlocks::DropIdle() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = static_cast<int64_t>(idle_.size());
  while (!idle_.empty()) ReclaimOneLocked();
  return n;
}

int64_t ResidentBlocks::Forget(std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const BlockKey& key : keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || it->second.forgotten) continue;
    ++n;
    Block& b = it->second;
    if (b.refs > 0) {
      b.forgotten = true;
      NoteLocked({.key = key, .parent = {}, .added = false});
      continue;
    }
    idle_.erase(b.idle);
    EraseLocked(it);
  }
  return n;
}

int64_t ResidentBlocks::MarkUnsaved(std::span<const BlockKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const BlockKey& key : keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || it->second.forgotten || !it->second.saved) continue;
    it->second.saved = false;
    ++n;
  }
  return n;
}

void ResidentBlocks::LetGoLocked(BlockKey key) {
  auto it = blocks_.find(key);
  if (it->second.forgotten) {
    pool_.Free(it->second.page);
    by_page_.erase(it->second.page);
    blocks_.erase(it);  // its removal was noted when it was forgotten
    return;
  }
  it->second.idle = idle_.insert(idle_.end(), key);
}

void ResidentBlocks::EraseLocked(absl::flat_hash_map<BlockKey, Block>::iterator it) {
  const BlockKey key = it->first;
  pool_.Free(it->second.page);
  by_page_.erase(it->second.page);
  blocks_.erase(it);
  NoteLocked({.key = key, .parent = {}, .added = false});
}

void ResidentBlocks::ReclaimOneLocked() {
  const BlockKey key = idle_.front();
  idle_.pop_front();
  EraseLocked(blocks_.find(key));
}

void ResidentBlocks::NoteLocked(Change change) {
  if (changes_.overflowed) return;
  if (changes_.list.size() >= kMaxChanges) {
    changes_.list.clear();
    changes_.overflowed = true;
    return;
  }
  changes_.list.push_back(change);
}

int64_t ResidentBlocks::resident_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(blocks_.size());
}

int64_t ResidentBlocks::idle_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(idle_.size());
}

int64_t ResidentBlocks::hit_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

ResidentBlocks::Changes ResidentBlocks::TakeChanges() {
  std::lock_guard<std::mutex> lock(mu_);
  Changes out = std::move(changes_);
  changes_ = Changes{};
  return out;
}

void ResidentBlocks::TrackTouches() {
  std::lock_guard<std::mutex> lock(mu_);
  track_touches_ = true;
}

std::vector<BlockKey> ResidentBlocks::TakeTouched() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockKey> keys(touched_.begin(), touched_.end());
  touched_.clear();
  return keys;
}

std::vector<BlockKey> ResidentBlocks::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockKey> keys;
  keys.reserve(blocks_.size());
  for (const auto& [key, block] : blocks_) keys.push_back(key);
  return keys;
}

std::vector<BlockKey> ResidentBlocks::SavedKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockKey> keys;
  for (const auto& [key, block] : blocks_) {
    if (block.saved && !block.forgotten) keys.push_back(key);
  }
  return keys;
}

}  // namespace strata::worker
