// ChannelPool: one gRPC channel per peer address, created on first use and reused (a channel
// multiplexes every call to its peer and reconnects by itself).
//
// Thread safety: Get is safe to call concurrently.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/grpc_server.h"

namespace strata::scheduler {

class ChannelPool {
 public:
  std::shared_ptr<grpc::Channel> Get(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& channel = channels_[address];
    if (channel == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);  // what the servers accept
      // Reconnect quickly after a peer restarts (the default backoff grows to minutes).
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
      channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    }
    return channel;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_
};

}  // namespace strata::scheduler
