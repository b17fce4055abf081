// Programmatic dependent launch (sm_90): a kernel launched with LaunchPdl may be scheduled while
// the kernel before it on the stream is still finishing, hiding the launch latency between the
// many small kernels of a decode step (in a CUDA graph too: the capture keeps the programmatic
// edges). Every such kernel calls PdlGridSync() first, before it touches global memory: that waits
// until the previous grid has completed with its writes visible (so the ordering is the stream's),
// then lets the next kernel launch. In a kernel launched the ordinary way both are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/common/pdl.h"

namespace strata::kernels {

__device__ __forceinline__ void PdlGridSync() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// The other order, for a kernel that runs beside the one before it, which calls PdlGridSync:
// this kernel is launched only once every block of that one has passed its wait, so what the
// kernels before that one wrote is complete, and this kernel may read it at once if that one
// neither writes what it reads nor reads what it writes. PdlLaunchNext() first (the next kernel
// may launch; it waits for this one), the work, then PdlWaitBeforeExit(): the grid completes only
// after the one before it, so the next kernel's PdlGridSync finds both done. Launched the
// ordinary way, both are no-ops and the stream orders the three.
__device__ __forceinline__ void PdlLaunchNext() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void PdlWaitBeforeExit() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute
// when enabled. Returns the launch error, which is also the runtime's last error (as after <<<>>>).
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = ProgrammaticLaunchEnabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace strata::kernels
