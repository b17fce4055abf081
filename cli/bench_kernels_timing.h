// Timing helpers of `strata bench kernels` (CUDA events on the default stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::cli::bench_kernels {

// A cudaMalloc'ed buffer, freed on destruction.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  absl::Status Allocate(size_t bytes);
};

// Random bf16 (normal-ish, never all zeros): a 64 MiB host pattern copied over the buffer.
absl::Status FillRandomBf16(void* dst, size_t bytes, uint32_t seed);

// Median milliseconds of each of `fns` over `iters` rounds after `warmup` rounds; a round runs
// every fn once, in turns, each timed by its own events on the default stream behind a gate that
// holds the stream until the whole round is enqueued, so the variants of one point meet the same
// clocks and none is timed with its launcher's host work (timed one at a time onto an idle
// stream, the first of a round read up to 9 % slower than the same kernel later in it on the
// H200).
absl::StatusOr<std::vector<double>> MedianMsInTurns(
    const std::vector<std::function<absl::Status()>>& fns, int warmup, int iters);

// Median milliseconds of `fn` over `iters` event-timed runs after `warmup` runs.
absl::StatusOr<double> MedianMs(std::function<absl::Status()> fn, int warmup, int iters);

}  // namespace strata::cli::bench_kernels
