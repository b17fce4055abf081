// The grid-rounds kernel (see grid_barrier.h).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/grid_barrier.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/sm90_device.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;  // as the decode kernels a persistent one would hold

template <GridSync kSync>
__global__ void __launch_bounds__(kThreads) GridRoundsKernel(GridRoundsParams p) {
  PdlGridSync();
  const int n = p.num_ctas, cta = static_cast<int>(blockIdx.x);
  for (int i = 0; i < p.rounds; ++i) {
    const int r = p.first_round + i;
    if (threadIdx.x == 0) {
      if (r > 0 && p.slots[((r - 1) & 1) * n + (cta + r) % n] != r - 1) atomicAdd(p.errors, 1);
      p.slots[(r & 1) * n + cta] = r;
    }
    if (i + 1 == p.rounds) break;
    if constexpr (kSync == GridSync::kBarrier) {
      GridBarrier(p.barrier_word, n, cta);
    } else if constexpr (kSync == GridSync::kCooperativeGroups) {
      cooperative_groups::this_grid().sync();
    }
  }
}

auto* KernelFor(GridSync sync) {
  switch (sync) {
    case GridSync::kCooperativeGroups:
      return GridRoundsKernel<GridSync::kCooperativeGroups>;
    case GridSync::kLaunch:
      return GridRoundsKernel<GridSync::kLaunch>;
    case GridSync::kBarrier:
      break;
  }
  return GridRoundsKernel<GridSync::kBarrier>;
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError("LaunchGridRounds: " + what);
}

}  // namespace

int GridRoundsMaxCtas() {
  // Asked once per device: every launch validates against it.
  static std::atomic<int> most_of[64] = {};
  return RememberedForCurrentDevice(most_of, [](int) {
    int per_sm = 0;
    for (GridSync sync : {GridSync::kBarrier, GridSync::kCooperativeGroups, GridSync::kLaunch}) {
      int blocks = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, KernelFor(sync), kThreads, 0) !=
          cudaSuccess) {
        return 0;
      }
      per_sm = per_sm == 0 ? blocks : std::min(per_sm, blocks);
    }
    return per_sm * CurrentDeviceSmCount();
  });
}

absl::Status ValidateGridRoundsParams(const GridRoundsParams& p) {
  if (p.rounds < 1 || p.first_round < 0) return Invalid("rounds >= 1 and first_round >= 0");
  if (p.sync == GridSync::kLaunch && p.rounds != 1) return Invalid("kLaunch runs one round");
  if (p.sync == GridSync::kCooperativeGroups && !p.cooperative_launch) {
    return Invalid("kCooperativeGroups needs cooperative_launch");
  }
  if (p.slots == nullptr || p.errors == nullptr ||
      (p.sync == GridSync::kBarrier && p.barrier_word == nullptr)) {
    return Invalid("slots, errors and (kBarrier) barrier_word must be set");
  }
  if (p.num_ctas < 1) return Invalid("num_ctas must be >= 1");
  if (p.sync == GridSync::kLaunch) return absl::OkStatus();  // no co-residency needed
  if (const int most = GridRoundsMaxCtas(); p.num_ctas > most) {
    return Invalid("num_ctas " + std::to_string(p.num_ctas) +
                   " exceeds the CTAs the device holds at once (" + std::to_string(most) +
                   "): a barrier would wait on CTAs that never start");
  }
  return absl::OkStatus();
}

absl::Status LaunchGridRounds(const GridRoundsParams& p, cudaStream_t stream) {
  if (absl::Status st = ValidateGridRoundsParams(p); !st.ok()) return st;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(p.num_ctas);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  int count = 0;
  if (p.cooperative_launch) {
    attributes[count].id = cudaLaunchAttributeCooperative;
    attributes[count++].val.cooperative = 1;
  }
  if (p.programmatic) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t err = cudaLaunchKernelEx(&config, KernelFor(p.sync), p);
  if (err != cudaSuccess) {
    return absl::InternalError(std::string("LaunchGridRounds: ") + cudaGetErrorString(err));
  }
  return absl::OkStatus();
}

}  // namespace strata::kernels
