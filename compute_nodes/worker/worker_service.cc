#include "compute_nodes/worker/worker_service.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "common/grpc_status.h"
#include "common/strings.h"

namespace strata::worker {

struct WorkerService::Common {
  const std::string& request_id;
  const google::protobuf::RepeatedField<uint32_t>& prompt;
  const v1::SamplingParams& sampling;
  const v1::CachePlan& cache;
  int32_t priority;
  int64_t deadline_unix_ms;
};

namespace {

std::atomic<uint64_t> next_request{1};

v1::FinishReason ToProto(Finish f) {
  switch (f) {
    case Finish::kStop:
      return v1::FINISH_STOP;
    case Finish::kLength:
      return v1::FINISH_LENGTH;
    case Finish::kCancelled:
      return v1::FINISH_CANCELLED;
    case Finish::kError:
      return v1::FINISH_ERROR;
    case Finish::kNone:
      break;
  }
  return v1::FINISH_UNSPECIFIED;
}

void FillCached(const CachedTokenCounts& c, v1::CachedTokens* out) {
  out->set_total(static_cast<uint32_t>(c.total));
  out->set_gpu(static_cast<uint32_t>(c.gpu));
  out->set_dram(static_cast<uint32_t>(c.dram));
  out->set_ssd(static_cast<uint32_t>(c.ssd));
  out->set_remote(static_cast<uint32_t>(c.remote));
}

// What a request's callbacks hand to the RPC thread that serves it.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int32_t> tokens;
  std::optional<RequestOutcome> done;

  RequestEvents Events() {
    return {.on_tokens =
                [this](std::span<const int32_t> ids) {
                  std::lock_guard<std::mutex> lock(mu);
                  tokens.insert(tokens.end(), ids.begin(), ids.end());
                  cv.notify_all();
                },
            .on_done =
                [this](const RequestOutcome& outcome) {
                  std::lock_guard<std::mutex> lock(mu);
                  done = outcome;
                  cv.notify_all();
                }};
  }
};

bool RoleAllows(v1::NodeRole role, RequestKind kind) {
  if (role == v1::ROLE_BOTH) return true;
  if (kind == RequestKind::kPrefill) return role == v1::ROLE_PREFILL;
  if (kind == RequestKind::kDecode) return role == v1::ROLE_DECODE;
  return false;
}

}  // namespace

WorkerService::WorkerService(WorkerCore& core, WorkerServiceOptions options)
    : core_(core), options_(std::move(options)) {}

absl::StatusOr<RequestSpec> WorkerService::MakeSpec(const Common& c, RequestKind kind) const {
  if (!RoleAllows(options_.role, kind)) {
    return absl::FailedPreconditionError(
        StrCat("this worker's role is ", v1::NodeRole_Name(options_.role), "; it does not serve ",
               kind == RequestKind::kPrefill  ? "Prefill"
               : kind == RequestKind::kDecode ? "Decode"
                                              : "Generate"));
  }
  RequestSpec spec;
  spec.kind = kind;
  spec.id = c.request_id.empty() ? StrCat(options_.node_id, "-", next_request++) : c.request_id;
  // Ids past the vocabulary (including those that wrap to negative) are refused by Submit.
  spec.prompt.assign(c.prompt.begin(), c.prompt.end());
  runtime::SamplingParams& s = spec.sampling;
  s.temperature = c.sampling.temperature();
  s.top_p = c.sampling.top_p() > 0 ? c.sampling.top_p() : 1.0f;
  s.top_k = c.sampling.top_k();
  s.seed = c.sampling.seed();
  s.max_tokens = c.sampling.max_tokens() > 0 ? c.sampling.max_tokens() : 16;
  s.stop_ids.assign(c.sampling.stop_token_ids().begin(), c.sampling.stop_token_ids().end());
  s.stop_strings.assign(c.sampling.stop().begin(), c.sampling.stop().end());
  if (const tokenizer::Tokenizer* tok = options_.tokenizer; tok != nullptr) {
    if (!c.sampling.ignore_eos() && tok->eos_id() >= 0) s.stop_ids.push_back(tok->eos_id());
    s.detokenize = [tok](std::span<const int32_t> ids) { return tok->Decode(ids); };
  }
  spec.tenant = c.cache.tenant();
  if (!c.cache.namespace_id().empty()) {
    const std::optional<Namespace> ns = Namespace::FromBytes(c.cache.namespace_id());
    if (!ns.has_value()) {
      return absl::InvalidArgumentError(
          StrCat("cache.namespace_id has ", c.cache.namespace_id().size(), " bytes, not 32"));
    }
    spec.ns = *ns;
    // The plan names blocks as this worker would for the tenant, or it was made for another
    // model, block size or cache codec: its blocks would be stored under names no reader of this
    // kind asks for (or read in a layout this worker does not write).
    if (spec.ns != MakeNamespace(options_.fingerprint, options_.format, spec.tenant)) {
      return absl::InvalidArgumentError(
          StrCat("cache.namespace_id is not this worker's for tenant '", spec.tenant,
                 "' (a plan for another model, block size or cache codec "
                 "(",
                 KvCodecName(options_.format.codec), " here)?)"));
    }
  } else {
    spec.ns = MakeNamespace(options_.fingerprint, options_.format, spec.tenant);
  }
  if (c.cache.block_keys_size() > 0) {
    // The plan's keys must be the ones this worker computes, or the plan is for another model,
    // format or tenant: refusing is better than caching under the wrong names.
    const std::vector<uint32_t> u32(spec.prompt.begin(), spec.prompt.end());
    const std::vector<BlockKey> keys = ComputeBlockKeys(spec.ns, u32, options_.format.block_tokens);
    for (int i = 0; i < c.cache.block_keys_size() && i < static_cast<int>(keys.size()); ++i) {
      if (c.cache.block_keys(i) != keys[i].View()) {
        return absl::InvalidArgumentError(StrCat(
            "cache plan block key ", i, " does not match the prompt (another model or tenant?)"));
      }
    }
  }
  spec.save_blocks = !c.cache.has_save_blocks() || c.cache.save_blocks();
  spec.cache_address = c.cache.cache_address();
  spec.priority = c.priority;
  if (c.deadline_unix_ms > 0) spec.deadline = absl::FromUnixMillis(c.deadline_unix_ms);
  return spec;
}

grpc::Status WorkerService::Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) {
  auto spec = MakeSpec({request->request_id(), request->prompt_tokens(), request->sampling(),
                        request->cache(), request->priority(), request->deadline_unix_ms()},
                       RequestKind::kPrefill);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  const std::string id = spec->id;
  Mailbox box;
  if (absl::Status st = core_.Submit(*std::move(spec), box.Events()); !st.ok()) {
    return ToGrpcStatus(st);
  }
  std::unique_lock<std::mutex> lock(box.mu);
  bool cancel_sent = false;
  while (!box.done) {
    box.cv.wait_for(lock, std::chrono::milliseconds(100));
    if (!cancel_sent && context->IsCancelled()) {
      cancel_sent = true;
      lock.unlock();
      core_.Cancel(id);
      lock.lock();
    }
  }
  const RequestOutcome& o = *box.done;
  if (!o.status.ok()) return ToGrpcStatus(o.status);
  response->set_first_token(static_cast<uint32_t>(o.first_token));
  for (const BlockKey& k : o.block_keys) response->add_block_keys(std::string(k.View()));
  FillCached(o.cached, response->mutable_cached());
  response->set_computed_tokens(static_cast<uint32_t>(o.computed_tokens));
  response->set_queue_ms(o.queue_ms);
  response->set_prefill_ms(o.prefill_ms);
  response->set_tail_tokens(static_cast<uint32_t>(o.tail_tokens));
  return grpc::Status::OK;
}

grpc::Status WorkerService::Decode(grpc::ServerContext* context, const v1::DecodeRequest* request,
                                   grpc::ServerWriter<v1::TokenChunk>* writer) {
  auto spec = MakeSpec({request->request_id(), request->prompt_tokens(), request->sampling(),
                        request->cache(), request->priority(), request->deadline_unix_ms()},
                       RequestKind::kDecode);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  spec->first_token = static_cast<int32_t>(request->first_token());
  return Stream(context, *std::move(spec), writer);
}

grpc::Status WorkerService::Generate(grpc::ServerContext* context,
                                     const v1::GenerateRequest* request,
                                     grpc::ServerWriter<v1::TokenChunk>* writer) {
  auto spec = MakeSpec({request->request_id(), request->prompt_tokens(), request->sampling(),
                        request->cache(), request->priority(), request->deadline_unix_ms()},
                       RequestKind::kGenerate);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  return Stream(context, *std::move(spec), writer);
}

grpc::Status WorkerService::Stream(grpc::ServerContext* context, RequestSpec spec,
                                   grpc::ServerWriter<v1::TokenChunk>* writer) {
  const std::string id = spec.id;
  Mailbox box;
  if (absl::Status st = core_.Submit(std::move(spec), box.Events()); !st.ok()) {
    return ToGrpcStatus(st);
  }
  std::optional<tokenizer::StreamDecoder> text;
  if (options_.tokenizer != nullptr) text.emplace(options_.tokenizer);
  bool cancel_sent = false;
  auto cancel = [&] {
    if (!cancel_sent) core_.Cancel(id);
    cancel_sent = true;
  };
  while (true) {
    std::vector<int32_t> ids;
    std::optional<RequestOutcome> done;
    {
      std::unique_lock<std::mutex> lock(box.mu);
      box.cv.wait_for(lock, std::chrono::milliseconds(100),
                      [&] { return !box.tokens.empty() || box.done.has_value(); });
      ids.assign(box.tokens.begin(), box.tokens.end());
      box.tokens.clear();
      if (box.done) done = box.done;
    }
    if (context->IsCancelled()) cancel();
    v1::TokenChunk chunk;
    for (int32_t id : ids) {
      chunk.add_tokens(static_cast<uint32_t>(id));
      if (text) chunk.mutable_text()->append(text->Add(id));
    }
    if (done) {
      if (!done->status.ok() && done->finish == Finish::kError) {
        if (!ids.empty() && !cancel_sent) writer->Write(chunk);
        return ToGrpcStatus(done->status);
      }
      if (text) chunk.mutable_text()->append(text->Flush());
      chunk.set_finish_reason(ToProto(done->finish));
      v1::TokenChunk::Usage* u = chunk.mutable_usage();
      u->set_prompt_tokens(static_cast<uint32_t>(done->prompt_tokens));
      u->set_completion_tokens(static_cast<uint32_t>(done->completion_tokens));
      FillCached(done->cached, u->mutable_cached());
      u->set_ttft_ms(done->ttft_ms);
      u->set_mean_tbt_ms(done->mean_tbt_ms);
      if (!cancel_sent) writer->Write(chunk);
      return cancel_sent && context->IsCancelled()
                 ? grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled")
                 : grpc::Status::OK;
    }
    if (!ids.empty() && !cancel_sent && !writer->Write(chunk)) cancel();  // the client is gone
  }
}

grpc::Status WorkerService::Cancel(grpc::ServerContext*, const v1::CancelRequest* request,
                                   v1::CancelResponse* response) {
  response->set_found(core_.Cancel(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetStatus(grpc::ServerContext*, const v1::GetWorkerStatusRequest*,
                                      v1::WorkerStatus* response) {
  response->set_node_id(options_.node_id);
  response->set_role(options_.role);
  *response->mutable_load() = core_.Load();
  response->set_model(options_.model);
  response->set_backend(options_.backend);
  return grpc::Status::OK;
}

}  // namespace strata::worker
