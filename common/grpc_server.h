// How every Strata daemon (cache, worker, scheduler) starts its gRPC server, so that they agree on
// the options: insecure credentials (the daemons talk on a private network; admin calls carry a
// bearer token, common/bearer_auth.h), server reflection on (grpcurl and grpc_cli can list and
// call the APIs), messages up to 64 MiB, and no SO_REUSEPORT (a busy address is an error, not a
// port shared with another daemon).
//
//   ASSIGN_OR_RETURN(server_, StartGrpcServer(listen, {service_.get(), admin_.get()}, &port_));
#pragma once

#include <grpcpp/impl/service_type.h>
#include <grpcpp/server.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

inline constexpr int kMaxGrpcMessageBytes = 64 << 20;

// Binds `listen` ("host:port"; port 0 picks a free one), registers `services` (borrowed: they
// must outlive the server) and starts serving. `*port` receives the bound port. Unavailable when
// the address cannot be bound, e.g. when another process listens there.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, std::initializer_list<grpc::Service*> services, int* port);

}  // namespace strata
