// OpenIbvContext for builds without ibverbs (STRATA_WITH_RDMA=OFF).
#include "transfer/rdma/verbs.h"

namespace strata::transfer::rdma {

absl::StatusOr<std::shared_ptr<VerbsContext>> OpenIbvContext() {
  return absl::UnavailableError("rdma: not built (STRATA_WITH_RDMA=OFF)");
}

}  // namespace strata::transfer::rdma
