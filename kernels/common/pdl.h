// The host side of kernels/common/pdl.cuh (plain C++: the backend's .cc files include it).
#pragma once

namespace strata::kernels {

// Whether LaunchPdl launches programmatically, for the calling host thread (default on). The CUDA
// backend turns it off for steps of many rows: measured on the H200, a batch-64 decode step ran
// 36% slower with it, batch 1 and 16 3-6% faster (docs/gpu-benchmarks.md).
inline bool& ProgrammaticLaunchEnabled() {
  thread_local bool enabled = true;
  return enabled;
}

}  // namespace strata::kernels
