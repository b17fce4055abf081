#include "transfer/transport.h"

#include "common/strings.h"

namespace strata::transfer {

std::string_view TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kRdma:
      return "rdma";
    case TransportKind::kCuda:
      return "cuda";
    case TransportKind::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::StatusOr<MappedBytes> Channel::MapRead(const TransferRequest& /*request*/) {
  return absl::UnimplementedError("this transport copies reads; it does not map the peer's memory");
}

absl::StatusOr<TransportKind> ParseTransportKind(std::string_view name) {
  for (TransportKind k :
       {TransportKind::kShm, TransportKind::kTcp, TransportKind::kRdma, TransportKind::kCuda}) {
    if (EqualsIgnoreCase(name, TransportKindName(k))) return k;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown transport '", name, "' (expected shm, tcp, rdma or cuda)"));
}

}  // namespace strata::transfer
