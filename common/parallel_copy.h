// Host memory copies spread over a few threads: fn(i) for every i < count, on up to 8 threads
// when the items add up to megabytes (one thread copies ~6 GB/s on the H200 machines, 8 reach
// ~44 GB/s on warm memory), each thread taking a contiguous range of items; below 2 MiB per
// thread, inline. The threads are a process-wide set of helpers started on first use: starting
// and joining 7 threads costs ~200 us there, as much as copying 1 MB, and a cached load makes
// such a call per run of blocks. Used between the CUDA backend's pinned buffers and ordinary
// host vectors (logits, KV payloads), by the shm transport and by the cache client's checks.
// fn must be safe to call concurrently for different i; it may itself call ForEachCopy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>

#include "absl/functional/function_ref.h"

namespace strata {
namespace internal {

// Runs part(k) for every k < parts, on the calling thread and on up to parts - 1 helpers. The
// caller takes parts itself until none are left, so a busy or missing helper (none could be
// started; a forked child) makes the call slower, never stuck. Returns when every part is done.
void RunParts(int64_t parts, absl::FunctionRef<void(int64_t)> part);

}  // namespace internal

template <typename Fn>
void ForEachCopy(int64_t count, int64_t total_bytes, const Fn& fn) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>({count, 8, cores, total_bytes / (int64_t{2} << 20)});
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  internal::RunParts(threads, [&](int64_t t) {
    for (int64_t i = count * t / threads; i < count * (t + 1) / threads; ++i) fn(i);
  });
}

}  // namespace strata
