// RunCudaBench for builds without CUDA.
#include "transfer/bench/transfer_bench.h"

namespace strata::transfer {

absl::StatusOr<nlohmann::json> RunCudaBench(const TransferBenchOptions&) {
  return absl::UnavailableError("cuda: not built (STRATA_WITH_CUDA=OFF)");
}

}  // namespace strata::transfer
