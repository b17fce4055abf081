#include "cache_service/cache_admin_service.h"

#include "common/bearer_auth.h"
#include "common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace strata::cache {

CacheAdminService::CacheAdminService(BlockStore& store, std::string admin_token,
                                     RemoteDrainOptions drain)
    : store_(store), token_(std::move(admin_token)), drain_(std::move(drain)) {}

grpc::Status CacheAdminService::Authorize(const grpc::ServerContext* ctx) const {
  return CheckBearerToken(*ctx, token_, "cache admin");
}

#define STRATA_ADMIN_AUTH()                             \
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) { \
    return auth;                                        \
  }

grpc::Status CacheAdminService::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*,
                                         v1::GetStatsResponse* resp) {
  STRATA_ADMIN_AUTH();
  store_.GetStats(resp);
  return grpc::Status::OK;
}

grpc::Status CacheAdminService::SetTierCapacity(grpc::ServerContext* ctx,
                                                const v1::SetTierCapacityRequest* req,
                                                v1::SetTierCapacityResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.SetTierCapacity(*req, resp));
}

grpc::Status CacheAdminService::ListBlocks(grpc::ServerContext* ctx,
                                           const v1::ListBlocksRequest* req,
                                           v1::ListBlocksResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.ListBlocks(*req, resp));
}

grpc::Status CacheAdminService::Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                                      v1::EvictResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.Evict(*req, resp));
}

grpc::Status CacheAdminService::Pin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                                    v1::PinResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.Pin(*req, resp));
}

grpc::Status CacheAdminService::Unpin(grpc::ServerContext* ctx, const v1::UnpinRequest* req,
                                      v1::UnpinResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.Unpin(*req, resp));
}

grpc::Status CacheAdminService::Flush(grpc::ServerContext* ctx, const v1::FlushRequest*,
                                      v1::FlushResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.Flush(resp));
}

grpc::Status CacheAdminService::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                                       v1::VerifyResponse* resp) {
  STRATA_ADMIN_AUTH();
  return ToGrpcStatus(store_.Verify(*req, resp));
}

grpc::Status CacheAdminService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                                      v1::DrainResponse* resp) {
  STRATA_ADMIN_AUTH();
  if (!req->target_address().empty()) {
    return ToGrpcStatus(DrainToRemote(store_, req->target_address(), drain_, resp));
  }
  return ToGrpcStatus(store_.Drain(*req, resp));
}

}  // namespace strata::cache
