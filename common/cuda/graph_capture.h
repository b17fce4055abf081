// Captures what a function enqueues on a stream into an instantiated CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "absl/status/statusor.h"

namespace strata {

// Begins a thread-local capture on `stream` (not the legacy default stream), runs enqueue(), ends
// the capture and instantiates the graph; the caller owns the returned exec
// (cudaGraphExecDestroy). Kernel nodes replay at the priorities of the streams they were captured
// from. When enqueue() or the capture fails, its status (the capture's error
// cleared from the thread), and nothing is left allocated. `what` names the capture in errors.
absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream,
                                             const std::function<absl::Status()>& enqueue,
                                             const char* what);

}  // namespace strata
