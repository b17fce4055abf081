// The grid barrier of kernels/common/grid_barrier.cuh, exercised: a kernel of resident CTAs that
// runs rounds separated by grid-wide synchronization and checks each one. It measures what a
// persistent kernel's barrier costs against a kernel boundary (`strata bench kernels --only
// barrier`) and proves the barrier's ordering (tests/kernels/grid_barrier_test.cc).
//
// Round r (first_round <= r < first_round + rounds): CTA c checks that CTA (c + r) % num_ctas wrote
// r - 1 into its slot of the previous round (a plain load, as a persistent kernel's phases read
// each other's outputs; each mismatch adds 1 to *errors), then writes r into its own slot
// slots[r % 2][c]. Between two rounds the grid synchronizes as `sync` says:
//   kBarrier            GridBarrier (grid_barrier.cuh) on *barrier_word
//   kCooperativeGroups  cooperative_groups::this_grid().sync() (needs cooperative_launch)
//   kLaunch             nothing inside the kernel: one round per launch (rounds == 1), and the
//                       boundary between this launch and the next is the synchronization
// A launch's first round checks the previous launch's last (first_round > 0).
//
// Preconditions the launcher cannot check: slots holds 2 x num_ctas int32 that no one else
// writes, barrier_word was zero when first used and is used by one grid at a time. Thread
// safety: stateless.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace strata::kernels {

enum class GridSync { kBarrier, kCooperativeGroups, kLaunch };

struct GridRoundsParams {
  int num_ctas = 0;     // 1..GridRoundsMaxCtas()
  int rounds = 1;       // >= 1; kLaunch: 1
  int first_round = 0;  // >= 0
  GridSync sync = GridSync::kBarrier;
  bool cooperative_launch = false;   // launched with cudaLaunchAttributeCooperative
  bool programmatic = false;         // launched with programmatic stream serialization (PDL)
  uint32_t* barrier_word = nullptr;  // kBarrier
  int32_t* slots = nullptr;          // [2][num_ctas]
  int32_t* errors = nullptr;         // [1]
};

// CTAs of the rounds kernel that the current device holds at once (SMs x CTAs per SM); 0 when
// the device cannot be asked.
int GridRoundsMaxCtas();

// InvalidArgument naming the bad field.
absl::Status ValidateGridRoundsParams(const GridRoundsParams& params);
absl::Status LaunchGridRounds(const GridRoundsParams& params, cudaStream_t stream);

}  // namespace strata::kernels
