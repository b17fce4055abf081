#include "cli/bench_kernels_timing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

#include "common/cuda/cuda_status.h"
#include "common/status.h"

namespace strata::cli::bench_kernels {

DeviceBuffer::~DeviceBuffer() {
  if (ptr != nullptr) (void)cudaFree(ptr);
}

absl::Status DeviceBuffer::Allocate(size_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
  return absl::OkStatus();
}

namespace {
// Holds the stream at a host function until the host has enqueued a whole round, so that every
// launch of the round is queued before the GPU reaches it: the events then time the device work
// alone, not the launcher's host work (tensor maps, attributes: tens of microseconds, which a
// launch onto an idle stream would add to its figure; a decode step replays a CUDA graph).
class StreamGate {
 public:
  absl::Status Close() {
    open_.store(false);
    CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(nullptr, &StreamGate::Wait, this));
    return absl::OkStatus();
  }
  void Open() { open_.store(true); }

 private:
  static void Wait(void* self) {
    while (!static_cast<StreamGate*>(self)->open_.load()) std::this_thread::yield();
  }
  std::atomic<bool> open_{true};
};

}  // namespace

absl::Status FillRandomBf16(void* dst, size_t bytes, uint32_t seed) {
  const size_t pattern_elems = std::min<size_t>(bytes / 2, size_t{32} << 20);
  std::vector<uint16_t> pattern(pattern_elems);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (uint16_t& h : pattern) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    h = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  for (size_t off = 0; off < bytes; off += pattern_elems * 2) {
    const size_t n = std::min(pattern_elems * 2, bytes - off);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(static_cast<char*>(dst) + off, pattern.data(), n, cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> MedianMsInTurns(
    const std::vector<std::function<absl::Status()>>& fns, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) {
    for (const auto& fn : fns) RETURN_IF_ERROR(fn());
  }
  std::vector<cudaEvent_t> events(2 * fns.size(), nullptr);
  absl::Status status = [&]() -> absl::Status {
    for (cudaEvent_t& e : events) CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    return absl::OkStatus();
  }();
  StreamGate gate;
  std::vector<std::vector<double>> ms(fns.size());
  for (int i = 0; i < iters && status.ok(); ++i) {
    status = [&]() -> absl::Status {
      RETURN_IF_ERROR(gate.Close());
      absl::Status enqueued = [&]() -> absl::Status {
        for (size_t k = 0; k < fns.size(); ++k) {
          CUDA_RETURN_IF_ERROR(cudaEventRecord(events[2 * k]));
          RETURN_IF_ERROR(fns[k]());
          CUDA_RETURN_IF_ERROR(cudaEventRecord(events[2 * k + 1]));
        }
        return absl::OkStatus();
      }();
      gate.Open();  // on every path: the stream waits for it
      RETURN_IF_ERROR(enqueued);
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events.back()));
      for (size_t k = 0; k < fns.size(); ++k) {
        float t = 0;
        CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, events[2 * k], events[2 * k + 1]));
        ms[k].push_back(t);
      }
      return absl::OkStatus();
    }();
  }
  if (!status.ok()) (void)cudaDeviceSynchronize();  // the gate is open; drain before destroying
  for (cudaEvent_t e : events) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  RETURN_IF_ERROR(status);
  std::vector<double> medians;
  for (std::vector<double>& v : ms) {
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

absl::StatusOr<double> MedianMs(std::function<absl::Status()> fn, int warmup, int iters) {
  ASSIGN_OR_RETURN(const std::vector<double> ms, MedianMsInTurns({std::move(fn)}, warmup, iters));
  return ms[0];
}

}  // namespace strata::cli::bench_kernels
