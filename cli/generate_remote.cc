#include "cli/generate_remote.h"

#include <grpcpp/grpcpp.h>

#include <iostream>

#include "cli/commands.h"
#include "common/grpc_status.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::cli {
namespace {

v1::SamplingParams ToProto(const runtime::SamplingParams& s) {
  v1::SamplingParams p;
  p.set_temperature(s.temperature);
  p.set_top_p(s.top_p);
  p.set_top_k(static_cast<int32_t>(s.top_k));
  p.set_seed(s.seed);
  p.set_max_tokens(static_cast<uint32_t>(s.max_tokens));
  for (int32_t id : s.stop_ids) p.add_stop_token_ids(static_cast<uint32_t>(id));
  for (const std::string& stop : s.stop_strings) p.add_stop(stop);
  return p;
}

std::unique_ptr<v1::Worker::Stub> Connect(const std::string& address) {
  return v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void Check(const grpc::Status& st, const std::string& what) {
  if (!st.ok()) Fail(1, StrCat(what, ": ", FromGrpcStatus(st).ToString()));
}

std::string Cached(const v1::CachedTokens& c) {
  return fmt::format("{} (worker pool {}, dram {}, ssd {}, remote {})", c.total(), c.gpu(),
                     c.dram(), c.ssd(), c.remote());
}

// Prints the stream's text (or ids when the worker has no tokenizer); returns the last chunk.
v1::TokenChunk Print(grpc::ClientReader<v1::TokenChunk>& reader, const std::string& what) {
  v1::TokenChunk chunk, last;
  while (reader.Read(&chunk)) {
    if (!chunk.text().empty() || chunk.tokens_size() == 0) {
      std::cout << chunk.text();
    } else {
      for (uint32_t id : chunk.tokens()) std::cout << id << ' ';
    }
    std::cout << std::flush;
    last = chunk;
  }
  Check(reader.Finish(), what);
  std::cout << "\n";
  return last;
}

}  // namespace

void RunRemoteGenerate(const RemoteGenerate& r) {
  v1::CachePlan plan;
  plan.set_tenant(r.cache_salt);
  const v1::SamplingParams sampling = ToProto(r.sampling);
  v1::TokenChunk last;
  if (!r.worker.empty()) {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    for (int32_t id : r.prompt) req.add_prompt_tokens(static_cast<uint32_t>(id));
    *req.mutable_sampling() = sampling;
    *req.mutable_cache() = plan;
    auto stub = Connect(r.worker);
    last = Print(*stub->Generate(&ctx, req), StrCat("Generate on ", r.worker));
  } else {
    grpc::ClientContext pctx;
    v1::PrefillRequest preq;
    for (int32_t id : r.prompt) preq.add_prompt_tokens(static_cast<uint32_t>(id));
    *preq.mutable_sampling() = sampling;
    *preq.mutable_cache() = plan;
    v1::PrefillResponse pre;
    Check(Connect(r.prefill)->Prefill(&pctx, preq, &pre), StrCat("Prefill on ", r.prefill));
    std::cout << fmt::format(
        "[prefill {}: computed {} tokens, cached {}, {:.1f} ms; handing {} blocks to {}]\n",
        r.prefill, pre.computed_tokens(), Cached(pre.cached()), pre.prefill_ms(),
        pre.block_keys_size(), r.decode);
    grpc::ClientContext dctx;
    v1::DecodeRequest dreq;
    for (int32_t id : r.prompt) dreq.add_prompt_tokens(static_cast<uint32_t>(id));
    dreq.set_first_token(pre.first_token());
    *dreq.mutable_sampling() = sampling;
    *dreq.mutable_cache() = plan;
    *dreq.mutable_cache()->mutable_block_keys() = pre.block_keys();
    auto stub = Connect(r.decode);
    last = Print(*stub->Decode(&dctx, dreq), StrCat("Decode on ", r.decode));
  }
  const v1::TokenChunk::Usage& u = last.usage();
  std::cout << fmt::format(
      "prompt {} tokens, cached {}; generated {} tokens ({}); ttft {:.1f} ms, tbt {:.2f} ms\n",
      u.prompt_tokens(), Cached(u.cached()), u.completion_tokens(),
      v1::FinishReason_Name(last.finish_reason()), u.ttft_ms(), u.mean_tbt_ms());
}

}  // namespace strata::cli
