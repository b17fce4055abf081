// Host memory copies spread over a few threads: fn(i) for every i < count, on up to 8 threads
// when the items add up to megabytes (one thread copies ~6 GB/s on the H200 machines, 8 reach
// ~17 GB/s), each thread taking a contiguous range of items; below 2 MiB per thread, inline.
// Used between the CUDA backend's pinned buffers and ordinary host vectors (logits, KV payloads)
// and by the shm transport for large batches.
// fn must be safe to call concurrently for different i.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace strata {

template <typename Fn>
void ForEachCopy(int64_t count, int64_t total_bytes, const Fn& fn) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>({count, 8, cores, total_bytes / (int64_t{2} << 20)});
  auto range = [&](int64_t t) {
    for (int64_t i = count * t / threads; i < count * (t + 1) / threads; ++i) fn(i);
  };
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(range, t);
  range(0);
  for (std::thread& th : pool) th.join();
}

}  // namespace strata
