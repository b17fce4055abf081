#include "common/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "common/strings.h"

namespace strata {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, std::initializer_list<grpc::Service*> services, int* port) {
  *port = 0;
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();  // applies to builders made after
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  // gRPC binds with SO_REUSEPORT by default: a second daemon on a busy port would then start
  // without an error and take a share of the first one's connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(StrCat("cannot listen for gRPC on ", listen));
  }
  return server;
}

}  // namespace strata
