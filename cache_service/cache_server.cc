#include "cache_service/cache_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <unistd.h>

#include "common/status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

CacheServer::CacheServer(CacheServerOptions options) : options_(std::move(options)) {
  if (options_.host_id.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    options_.host_id = name;
  }
}

CacheServer::~CacheServer() { Shutdown(); }

absl::Status CacheServer::Start() {
  ASSIGN_OR_RETURN(store_, BlockStore::Open(options_.store));
  control_ = std::make_unique<CacheControlService>(
      *store_, CacheControlService::Options{.server_id = options_.store.server_id,
                                            .host_id = options_.host_id,
                                            .digest_interval = options_.digest_interval});
  admin_ = std::make_unique<CacheAdminService>(*store_, options_.admin_token);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(), &grpc_port_);
  builder.RegisterService(control_.get());
  builder.RegisterService(admin_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(StrCat("cannot listen for gRPC on ", options_.listen));
  }
  if (!options_.http_listen.empty()) {
    ASSIGN_OR_RETURN(auto hp, ParseHostPort(options_.http_listen));
    http_ = std::make_unique<HttpListener>(
        HttpListener::Options{.address = hp.first, .port = hp.second});
    AddDiagnosticsRoutes(*http_, MetricsRegistry::Default(), [] { return absl::OkStatus(); });
    RETURN_IF_ERROR(http_->Start());
  }
  spdlog::info("cache server {} serving gRPC on port {}, http on port {}", options_.store.server_id,
               grpc_port_, http_port());
  return absl::OkStatus();
}

int CacheServer::http_port() const { return http_ ? http_->port() : 0; }

void CacheServer::Wait() {
  if (server_) server_->Wait();
}

void CacheServer::Shutdown() {
  if (control_) control_->Shutdown();
  if (store_) store_->events().Close();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (http_) http_->Stop();
}

}  // namespace strata::cache
