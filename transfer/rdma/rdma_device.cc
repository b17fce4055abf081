#include "transfer/rdma/rdma_device.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

#include "common/strings.h"

namespace strata::transfer {

absl::StatusOr<std::vector<RdmaDeviceInfo>> ProbeRdma() {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr) {
    return absl::UnavailableError(StrCat("rdma: ibv_get_device_list failed: ", strerror(errno)));
  }
  std::vector<RdmaDeviceInfo> out;
  for (int i = 0; i < num; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) continue;
    ibv_device_attr attr{};
    RdmaDeviceInfo info{.name = ibv_get_device_name(list[i])};
    if (ibv_query_device(ctx, &attr) == 0) {
      for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
        ibv_port_attr pattr{};
        if (ibv_query_port(ctx, port, &pattr) == 0 && pattr.state == IBV_PORT_ACTIVE) {
          ++info.active_ports;
        }
      }
    }
    ibv_close_device(ctx);
    if (info.active_ports > 0) out.push_back(std::move(info));
  }
  ibv_free_device_list(list);
  if (out.empty()) {
    return absl::UnavailableError(
        StrCat("rdma: no RDMA device with an active port (ibv_get_device_list found ", num, ")"));
  }
  return out;
}

}  // namespace strata::transfer
