// RDMA device discovery (ibverbs). Compiled only when STRATA_WITH_RDMA.
//
// TransferEngine asks ProbeRdma() once at start: with no device (ibv_get_device_list returns an
// empty list, as on every machine this project was developed on), the rdma transport is
// reported unavailable with the reason, and peers fall back to tcp.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::transfer {

struct RdmaDeviceInfo {
  std::string name;      // e.g. "mlx5_0"
  int active_ports = 0;  // ports in IBV_PORT_ACTIVE state
};

// The RDMA devices of this host that have at least one active port. Unavailable (with the
// reason) when there is none or the verbs library cannot list devices.
absl::StatusOr<std::vector<RdmaDeviceInfo>> ProbeRdma();

}  // namespace strata::transfer
