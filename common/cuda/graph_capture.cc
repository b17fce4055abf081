#include "common/cuda/graph_capture.h"

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"

namespace strata {

absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream,
                                             const std::function<absl::Status()>& enqueue,
                                             const char* what) {
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // a failed capture leaves its error behind
    if (!enqueued.ok()) return enqueued;
    return CudaStatus(ended, absl::StrCat("cudaStreamEndCapture (", what, ")").c_str());
  }
  cudaGraphExec_t exec = nullptr;
  // Each kernel node keeps the priority of the stream it was captured from (CUDA copies it into
  // the node); without this flag a replay would run every node at its launch stream's priority.
  const cudaError_t made =
      cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  (void)cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    return CudaStatus(made, absl::StrCat("cudaGraphInstantiate (", what, ")").c_str());
  }
  return exec;
}

}  // namespace strata
