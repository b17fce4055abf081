// CacheAdmin gRPC service (proto/strata/v1/cache_admin.proto). Every call must carry
// `authorization: Bearer <token>`; with no token configured every call is refused
// (PERMISSION_DENIED), a missing or wrong token is UNAUTHENTICATED.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "cache_service/block_store.h"
#include "cache_service/remote_drain.h"
#include "strata/v1/cache_admin.grpc.pb.h"

namespace strata::cache {

class CacheAdminService final : public v1::CacheAdmin::Service {
 public:
  // `admin_token`: empty refuses every call. `drain`: how Drain with a target address reaches the
  // other cache server (remote_drain.h).
  CacheAdminService(BlockStore& store, std::string admin_token, RemoteDrainOptions drain = {});

  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req,
                        v1::GetStatsResponse* resp) override;
  grpc::Status SetTierCapacity(grpc::ServerContext* ctx, const v1::SetTierCapacityRequest* req,
                               v1::SetTierCapacityResponse* resp) override;
  grpc::Status ListBlocks(grpc::ServerContext* ctx, const v1::ListBlocksRequest* req,
                          v1::ListBlocksResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                     v1::EvictResponse* resp) override;
  grpc::Status Pin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                   v1::PinResponse* resp) override;
  grpc::Status Unpin(grpc::ServerContext* ctx, const v1::UnpinRequest* req,
                     v1::UnpinResponse* resp) override;
  grpc::Status Flush(grpc::ServerContext* ctx, const v1::FlushRequest* req,
                     v1::FlushResponse* resp) override;
  grpc::Status Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                      v1::VerifyResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext* ctx) const;

  BlockStore& store_;
  const std::string token_;
  const RemoteDrainOptions drain_;
};

}  // namespace strata::cache
