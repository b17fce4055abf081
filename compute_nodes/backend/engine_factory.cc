#include "compute_nodes/backend/engine_factory.h"

#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/model/weights.h"
#if STRATA_WITH_CUDA
#include "compute_nodes/backend/cuda/cuda_engine.h"
#endif

namespace strata::backend {

std::vector<std::string> CompiledBackends() {
#if STRATA_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

absl::StatusOr<OpenedEngine> OpenEngine(const EngineOptions& options) {
  OpenedEngine opened;
  if (options.backend == "cpu") {
    ASSIGN_OR_RETURN_WITH(auto weights, model::LoadModel(options.model_dir),
                          StrCat("loading the model from ", options.model_dir));
    opened.fingerprint = weights->fingerprint;
    opened.engine = std::make_unique<cpu::CpuEngine>(
        std::shared_ptr<const model::ModelWeights>(std::move(weights)), options.num_pages,
        options.block_tokens, options.kv_precision);
    return opened;
  }
  if (options.backend == "cuda") {
#if STRATA_WITH_CUDA
    cuda::CudaEngineOptions o;
    o.num_pages = options.num_pages;
    o.block_tokens = options.block_tokens;
    o.device = options.device;
    o.read_cache_in_place = options.read_cache_in_place;
    ASSIGN_OR_RETURN_WITH(
        opened.engine,
        cuda::CudaEngine::FromCheckpoint(options.model_dir, o,
                                         options.want_fingerprint ? &opened.fingerprint : nullptr),
        StrCat("cuda backend, model ", options.model_dir));
    return opened;
#else
    return absl::UnimplementedError(
        "backend 'cuda' is not available: this binary was built without CUDA "
        "(configure with -DSTRATA_WITH_CUDA=ON on a machine with nvcc)");
#endif
  }
  return absl::InvalidArgumentError(
      StrCat("unknown backend '", options.backend, "' (", StrJoin(CompiledBackends(), ", "), ")"));
}

}  // namespace strata::backend
