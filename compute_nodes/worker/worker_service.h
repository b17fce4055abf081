// The Worker gRPC service (proto/strata/v1/worker.proto) over a WorkerCore.
//
// Prefill answers once the prompt's blocks are committed to the cache; Decode and Generate stream
// TokenChunks (text detokenized without splitting UTF-8 when the model has a tokenizer) and end
// with a chunk carrying the finish reason and usage. A client that goes away cancels its request.
// A role mismatch (Decode on a prefill worker, ...) is FAILED_PRECONDITION; a bad request
// INVALID_ARGUMENT; a full queue RESOURCE_EXHAUSTED; an engine failure INTERNAL.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "common/block_key.h"
#include "compute_nodes/tokenizer/tokenizer.h"
#include "compute_nodes/worker/worker_core.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::worker {

struct WorkerServiceOptions {
  std::string node_id;
  v1::NodeRole role = v1::ROLE_BOTH;
  std::string model;    // name reported by GetStatus
  std::string backend;  // "cpu" | "cuda"
  ModelFingerprint fingerprint;
  KvFormat format;                                  // of the blocks this worker reads and writes
  const tokenizer::Tokenizer* tokenizer = nullptr;  // optional: text, EOS, stop strings
};

class WorkerService final : public v1::Worker::Service {
 public:
  WorkerService(WorkerCore& core, WorkerServiceOptions options);

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override;
  grpc::Status Decode(grpc::ServerContext* context, const v1::DecodeRequest* request,
                      grpc::ServerWriter<v1::TokenChunk>* writer) override;
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::TokenChunk>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetWorkerStatusRequest* request,
                         v1::WorkerStatus* response) override;

 private:
  struct Common;  // the fields Prefill, Decode and Generate requests share
  absl::StatusOr<RequestSpec> MakeSpec(const Common& common, RequestKind kind) const;
  grpc::Status Stream(grpc::ServerContext* context, RequestSpec spec,
                      grpc::ServerWriter<v1::TokenChunk>* writer);

  WorkerCore& core_;
  WorkerServiceOptions options_;
};

}  // namespace strata::worker
