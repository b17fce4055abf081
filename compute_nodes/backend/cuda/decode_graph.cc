#include "compute_nodes/backend/cuda/decode_graph.h"

#include "common/cuda/cuda_status.h"
#include "common/cuda/graph_capture.h"
#include "common/status.h"

namespace strata::cuda {

void DecodeGraphs::Clear() {
  for (auto& [key, exec] : graphs_) (void)cudaGraphExecDestroy(exec);
  graphs_.clear();
}

absl::Status DecodeGraphs::Run(const DecodeGraphKey& key, cudaStream_t stream,
                               const std::function<absl::Status()>& enqueue) {
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    ++replays_;
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream));
    return absl::OkStatus();
  }
  // Graphs of older buffer addresses can never be replayed again; a bounded cache otherwise.
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (it->first.grows != key.grows || graphs_.size() >= kMaxGraphs) {
      (void)cudaGraphExecDestroy(it->second);
      it = graphs_.erase(it);
    } else {
      ++it;
    }
  }
  ASSIGN_OR_RETURN(cudaGraphExec_t exec, CaptureGraph(stream, enqueue, "decode step"));
  graphs_[key] = exec;
  ++captures_;
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
  return absl::OkStatus();
}

}  // namespace strata::cuda
