// Workers as a user runs them: `strata cache` and `strata worker` processes on loopback, driven
// over the Worker gRPC API. Every output is compared token for token with an in-process reference
// (the CPU engine with a bf16 KV pool, greedy, one request alone, nothing cached).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/block_format.h"
#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/runtime/generate.h"
#include "compute_nodes/tokenizer/tokenizer.h"
#include "strata/v1/cache_admin.grpc.pb.h"
#include "strata/v1/worker.grpc.pb.h"
#include "tests/util/child_process.h"
#include "tests/util/http_get.h"
#include "tests/util/subprocess.h"

namespace strata {
namespace {

using testing_util::ChildProcess;

struct Stream {
  std::vector<int32_t> tokens;
  std::string text;
  v1::TokenChunk last;
  grpc::Status status;
  int chunks = 0;
};

class WorkerClusterTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    preset_ = GetParam();
    std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = testing::TempDir() + "/worker_cluster_" + name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    model_dir_ = Model(preset_);
  }

  // One checkpoint per preset for the whole suite.
  static std::string Model(const std::string& preset) {
    static std::map<std::string, std::string> dirs;
    auto it = dirs.find(preset);
    if (it != dirs.end()) return it->second;
    const std::string dir = testing::TempDir() + "/worker_model_" + preset;
    model::MakeRandomOptions o;
    o.seed = 7;
    EXPECT_TRUE(model::MakeRandomCheckpoint(*model::PresetConfig(preset), o, dir).ok());
    dirs[preset] = dir;
    return dir;
  }

  // `shm`: the cache also serves its DRAM arena over a unix socket, so same-host workers map it.
  std::unique_ptr<ChildProcess> StartCache(bool shm = false, const std::string& name = "cache",
                                           std::vector<std::string> extra = {}) {
    auto p = std::make_unique<ChildProcess>();
    const std::string data = dir_ + "/" + name;
    std::filesystem::create_directories(data);
    std::vector<std::string> args = {testing_util::StrataBinaryPath(),
                                     "cache",
                                     "--set",
                                     "cache.listen=127.0.0.1:0",
                                     "--set",
                                     "cache.http_listen=",
                                     "--set",
                                     "cache.transfer_listen=127.0.0.1:0",
                                     "--set",
                                     "cache.data_dir=" + data,
                                     "--set",
                                     "cache.slot_bytes=512KiB",
                                     "--set",
                                     "cache.dram.capacity=96MiB",
                                     "--set",
                                     "log.level=warn"};
    if (shm) extra.push_back("cache.shm_socket=" + data + "/shm.sock");
    for (auto& e : extra) {
      args.push_back("--set");
      args.push_back(std::move(e));
    }
    p->Start(std::move(args), data + "/ready");
    return p;
  }

  std::unique_ptr<ChildProcess> StartWorker(const std::string& name, const std::string& role,
                                            const std::string& cache_address,
                                            std::vector<std::string> extra = {}) {
    auto p = std::make_unique<ChildProcess>();
    std::vector<std::string> args = {testing_util::StrataBinaryPath(),
                                     "worker",
                                     "--role",
                                     role,
                                     "--model",
                                     model_dir_,
                                     "--set",
                                     "worker.node_id=" + name,
                                     "--set",
                                     "worker.listen=127.0.0.1:0",
                                     "--set",
                                     "worker.http_listen=127.0.0.1:0",
                                     "--set",
                                     "worker.cache_address=" + cache_address,
                                     "--set",
                                     "log.level=warn"};
    for (auto& e : extra) {
      args.push_back("--set");
      args.push_back(std::move(e));
    }
    p->Start(std::move(args), dir_ + "/" + name + ".ready");
    return p;
  }

  static std::unique_ptr<v1::Worker::Stub> Stub(const ChildProcess& p) {
    return v1::Worker::NewStub(
        grpc::CreateChannel(p.grpc_address(), grpc::InsecureChannelCredentials()));
  }

  static v1::SamplingParams Greedy(int max_tokens) {
    v1::SamplingParams s;
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    return s;
  }

  static std::vector<int32_t> Prompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 100000);
    return ids;
  }

  template <typename Req>
  static void SetPrompt(Req* req, const std::vector<int32_t>& prompt) {
    for (int32_t id : prompt) req->add_prompt_tokens(static_cast<uint32_t>(id));
  }

  static Stream ReadStream(grpc::ClientReader<v1::TokenChunk>* reader) {
    Stream s;
    v1::TokenChunk chunk;
    while (reader->Read(&chunk)) {
      ++s.chunks;
      for (uint32_t t : chunk.tokens()) s.tokens.push_back(static_cast<int32_t>(t));
      s.text += chunk.text();
      s.last = chunk;
    }
    s.status = reader->Finish();
    return s;
  }

  static Stream Generate(v1::Worker::Stub& stub, const std::vector<int32_t>& prompt, int max_tokens,
                         const std::string& id = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::GenerateRequest req;
    req.set_request_id(id);
    SetPrompt(&req, prompt);
    *req.mutable_sampling() = Greedy(max_tokens);
    auto reader = stub.Generate(&ctx, req);
    return ReadStream(reader.get());
  }

  static grpc::Status Prefill(v1::Worker::Stub& stub, const std::vector<int32_t>& prompt,
                              v1::PrefillResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::PrefillRequest req;
    SetPrompt(&req, prompt);
    *req.mutable_sampling() = Greedy(1);
    return stub.Prefill(&ctx, req, resp);
  }

  // The reference: one request alone, in process, nothing cached.
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens) {
    static std::map<std::string, std::shared_ptr<const model::ModelWeights>> weights;
    auto& w = weights[preset_];
    if (w == nullptr) {
      auto loaded = model::LoadModel(model_dir_);
      EXPECT_TRUE(loaded.ok()) << loaded.status();
      w = std::shared_ptr<const model::ModelWeights>(std::move(*loaded));
    }
    cpu::CpuEngine engine(w, (prompt.size() + max_tokens) / 64 + 2, 64,
                          runtime::KvPrecision::kBf16);
    runtime::SamplingParams params;
    params.max_tokens = max_tokens;
    auto result = runtime::Generate(engine, prompt, params, 512);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->tokens : std::vector<int32_t>{};
  }

  // A metric of a worker's /metrics, summed over the series whose labels contain `labels`.
  static double Metric(const ChildProcess& p, const std::string& name,
                       const std::string& labels = "") {
    return testing_util::MetricSum(p.http_port(), name, labels);
  }

  std::string preset_;
  std::string dir_;
  std::string model_dir_;
};

TEST_P(WorkerClusterTest, CombinedWorkerMatchesTheReference) {
  auto cache = StartCache();
  auto w = StartWorker("both-0", "both", cache->grpc_address());
  auto stub = Stub(*w);
  const auto prompt = Prompt(150, 1);
  const Stream s = Generate(*stub, prompt, 16);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, Reference(prompt, 16));
  EXPECT_EQ(s.last.finish_reason(), v1::FINISH_LENGTH);
  EXPECT_EQ(s.last.usage().prompt_tokens(), 150u);
  EXPECT_EQ(s.last.usage().completion_tokens(), 16u);
  EXPECT_EQ(s.last.usage().cached().total(), 0u);
  EXPECT_GT(s.last.usage().ttft_ms(), 0);
  // With the model's tokenizer the chunks carry the text, split only between whole characters.
  if (std::filesystem::exists(model_dir_ + "/tokenizer.json")) {
    auto tok = tokenizer::Tokenizer::Load(model_dir_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ(s.text, (*tok)->Decode(s.tokens));
    EXPECT_FALSE(s.text.empty());
  }
}

// A cache plan may name another host's cache server: the blocks come from there ("remote").
TEST_P(WorkerClusterTest, BlocksFromTheCacheServerThePlanNames) {
  auto near = StartCache(false, "near");
  auto far = StartCache(false, "far");
  auto writer = StartWorker("writer", "both", far->grpc_address());
  auto reader = StartWorker("reader", "both", near->grpc_address());
  const auto prompt = Prompt(300, 40);
  auto wstub = Stub(*writer);
  v1::PrefillResponse pre;
  ASSERT_TRUE(Prefill(*wstub, prompt, &pre).ok());
  ASSERT_EQ(pre.block_keys_size(), 4);

  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  SetPrompt(&req, prompt);
  *req.mutable_sampling() = Greedy(8);
  req.mutable_cache()->set_cache_address(far->grpc_address());
  auto rstub = Stub(*reader);
  const Stream s = ReadStream(rstub->Generate(&ctx, req).get());
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.usage().cached().total(), 256u);
  EXPECT_EQ(s.last.usage().cached().remote(), 256u);
  EXPECT_EQ(s.tokens, Reference(prompt, 8));
}

// Over shm: the cache server is on the same host and serves its arena on a unix socket.
TEST_P(WorkerClusterTest, PrefillThroughTheCacheToDecode) {
  auto cache = StartCache(/*shm=*/true);
  auto prefill = StartWorker("prefill-0", "prefill", cache->grpc_address());
  auto decode = StartWorker("decode-0", "decode", cache->grpc_address());
  const auto prompt = Prompt(150, 2);
  v1::PrefillResponse pre;
  auto pstub = Stub(*prefill);
  ASSERT_TRUE(Prefill(*pstub, prompt, &pre).ok());
  EXPECT_EQ(pre.block_keys_size(), 2);  // 150 tokens: two full blocks of 64, a tail of 22
  EXPECT_EQ(pre.tail_tokens(), 22u);
  EXPECT_EQ(pre.computed_tokens(), 150u);

  grpc::ClientContext ctx;
  v1::DecodeRequest req;
  SetPrompt(&req, prompt);
  req.set_first_token(pre.first_token());
  *req.mutable_sampling() = Greedy(16);
  *req.mutable_cache()->mutable_block_keys() = pre.block_keys();
  auto dstub = Stub(*decode);
  const Stream s = ReadStream(dstub->Decode(&ctx, req).get());
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, Reference(prompt, 16));
  EXPECT_EQ(s.last.usage().cached().total(), 128u);  // the decode worker loaded both blocks
  EXPECT_GT(Metric(*decode, "strata_cache_client_bytes_total", "transport=\"shm\""), 0);
  EXPECT_EQ(Metric(*decode, "strata_cache_client_bytes_total", "transport=\"tcp\""), 0);

  // A plan that asks not to save publishes nothing (and hands over no blocks).
  {
    grpc::ClientContext nctx;
    v1::PrefillRequest nreq;
    SetPrompt(&nreq, Prompt(150, 3));
    *nreq.mutable_sampling() = Greedy(1);
    nreq.mutable_cache()->set_save_blocks(false);
    v1::PrefillResponse nresp;
    ASSERT_TRUE(pstub->Prefill(&nctx, nreq, &nresp).ok());
    EXPECT_EQ(nresp.block_keys_size(), 0);
    EXPECT_EQ(nresp.computed_tokens(), 150u);
  }

  // Roles are enforced.
  v1::PrefillResponse refused;
  EXPECT_EQ(Prefill(*dstub, prompt, &refused).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// With the worker's resident blocks off, so that the prefix comes from the cache server.
TEST_P(WorkerClusterTest, SharedPrefixComputesOnlyTheRest) {
  auto cache = StartCache();
  auto w = StartWorker("both-0", "both", cache->grpc_address(), {"worker.resident_blocks=false"});
  auto stub = Stub(*w);
  const auto first = Prompt(640, 3);
  std::vector<int32_t> second(first.begin(), first.begin() + 576);  // 90% shared
  const auto tail = Prompt(64, 4);
  second.insert(second.end(), tail.begin(), tail.end());

  v1::PrefillResponse a, b;
  ASSERT_TRUE(Prefill(*stub, first, &a).ok());
  EXPECT_EQ(a.computed_tokens(), 640u);
  ASSERT_TRUE(Prefill(*stub, second, &b).ok());
  EXPECT_EQ(b.cached().total(), 576u);
  EXPECT_EQ(b.cached().dram(), 576u);
  EXPECT_EQ(b.computed_tokens(), 64u);

  const Stream s = Generate(*stub, second, 12);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.usage().cached().total(), 576u);
  EXPECT_EQ(s.tokens, Reference(second, 12));
}

TEST_P(WorkerClusterTest, ChatTurnTwoHitsTheAnswer) {
  auto cache = StartCache();
  auto w = StartWorker("both-0", "both", cache->grpc_address());
  auto stub = Stub(*w);
  const auto turn1 = Prompt(100, 5);  // one full block
  const Stream answer = Generate(*stub, turn1, 60);
  ASSERT_TRUE(answer.status.ok()) << answer.status.error_message();
  EXPECT_EQ(answer.tokens, Reference(turn1, 60));
  // Turn 2 = turn 1 + the answer + a new message: 159 tokens of turn 1 had KV, two full blocks.
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), answer.tokens.begin(), answer.tokens.end());
  const auto message = Prompt(30, 6);
  turn2.insert(turn2.end(), message.begin(), message.end());
  const Stream s = Generate(*stub, turn2, 12);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.usage().cached().total(), 128u);  // > 64: the answer's block hit too
  // Both blocks were still in the worker's KV pool: nothing was read from the cache server.
  EXPECT_EQ(s.last.usage().cached().gpu(), 128u);
  EXPECT_EQ(Metric(*w, "strata_cache_client_bytes_total", "direction=\"read\""), 0);
  EXPECT_EQ(Metric(*w, "strata_worker_prompt_tokens_total", "source=\"resident\""), 128);
  EXPECT_EQ(s.tokens, Reference(turn2, 12));
}

// The worker's pool and its cache server stay in step: the hits the pool serves reach the
// server's LRU, and an operator's eviction on the server reaches the pool (the blocks the worker
// kept are forgotten there too, and the next request computes everything).
TEST_P(WorkerClusterTest, PoolHitsTouchTheServerAndOperatorEvictionsEmptyThePool) {
  const std::string token_file = dir_ + "/admin-token";
  { std::ofstream(token_file) << "operator-token\n"; }
  std::filesystem::permissions(
      token_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto cache = StartCache(false, "cache", {"cluster.admin_token_file=" + token_file});
  auto w = StartWorker("both-0", "both", cache->grpc_address());
  auto stub = Stub(*w);
  const auto prompt = Prompt(200, 61);
  const Stream first = Generate(*stub, prompt, 8);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const int64_t before_hit = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  const Stream resident = Generate(*stub, prompt, 8);
  ASSERT_TRUE(resident.status.ok()) << resident.status.error_message();
  EXPECT_EQ(resident.last.usage().cached().gpu(), 192u);

  auto admin = v1::CacheAdmin::NewStub(
      grpc::CreateChannel(cache->grpc_address(), grpc::InsecureChannelCredentials()));
  // The worker tells the server about the hits it served from its pool (CacheControl.Touch):
  // the server's blocks count as used since then.
  bool touched = false;
  for (int i = 0; i < 100 && !touched; ++i) {
    grpc::ClientContext lctx;
    lctx.AddMetadata("authorization", "Bearer operator-token");
    v1::ListBlocksRequest list;
    v1::ListBlocksResponse blocks;
    ASSERT_TRUE(admin->ListBlocks(&lctx, list, &blocks).ok());
    touched = blocks.blocks_size() == 3;
    for (const v1::BlockInfo& b : blocks.blocks()) {
      touched = touched && b.last_access_unix_ms() >= before_hit;
    }
    if (!touched) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(touched) << "the resident hits never reached the cache server's LRU";
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer operator-token");
  v1::EvictRequest req;
  req.mutable_selector()->set_all(true);
  v1::EvictResponse resp;
  const grpc::Status evicted = admin->Evict(&ctx, req, &resp);
  ASSERT_TRUE(evicted.ok()) << evicted.error_message();
  EXPECT_EQ(resp.evicted_blocks(), 3u);
  for (int i = 0; i < 200 && Metric(*w, "strata_worker_resident_blocks") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Metric(*w, "strata_worker_resident_blocks"), 0);
  const Stream after = Generate(*stub, prompt, 8);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.last.usage().cached().total(), 0u);
  EXPECT_EQ(after.tokens, first.tokens);
}

// worker.cache_codec=fp8: the turn-1 blocks are saved as fp8 (what the worker reads for turn 2 is
// two fp8 blocks' bytes) and turn 2 still hits them; its output is what the fp8 KV gives, so a
// repeat of turn 2 gives it again. (Resident blocks off: they would serve turn 2 from the pool.)
TEST_P(WorkerClusterTest, ChatTurnTwoHitsFp8Blocks) {
  auto cache = StartCache();
  auto w = StartWorker("both-0", "both", cache->grpc_address(),
                       {"worker.cache_codec=fp8", "worker.resident_blocks=false"});
  auto stub = Stub(*w);
  const auto turn1 = Prompt(100, 5);
  const Stream answer = Generate(*stub, turn1, 60);
  ASSERT_TRUE(answer.status.ok()) << answer.status.error_message();
  EXPECT_EQ(answer.tokens, Reference(turn1, 60));  // nothing came from the cache yet
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), answer.tokens.begin(), answer.tokens.end());
  const auto message = Prompt(30, 6);
  turn2.insert(turn2.end(), message.begin(), message.end());
  const double read_before = Metric(*w, "strata_cache_client_bytes_total", "direction=\"read\"");
  const Stream s = Generate(*stub, turn2, 12);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.usage().cached().total(), 128u);
  auto weights = model::LoadModel(model_dir_);
  ASSERT_TRUE(weights.ok());
  const model::ModelConfig& c = (*weights)->config;
  const BlockLayout fp8 = MakeBlockLayout(
      {.codec = KvCodec::kFp8E4M3}, static_cast<uint32_t>(c.num_hidden_layers),
      static_cast<uint32_t>(c.kv_lora_rank), static_cast<uint32_t>(c.qk_rope_head_dim));
  EXPECT_EQ(Metric(*w, "strata_cache_client_bytes_total", "direction=\"read\"") - read_before,
            2.0 * static_cast<double>(fp8.TotalBytes()));
  const Stream again = Generate(*stub, turn2, 12);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.last.usage().cached().total(), 128u);
  EXPECT_EQ(again.tokens, s.tokens);
}

// A plan whose namespace is not the worker's (another model, block size or codec) is refused
// before anything is cached under it; the worker's own namespace for the tenant is taken.
TEST_P(WorkerClusterTest, APlanForAnotherNamespaceIsRefused) {
  auto cache = StartCache();
  auto w = StartWorker("both-0", "both", cache->grpc_address(), {"worker.cache_codec=fp8"});
  auto stub = Stub(*w);
  auto weights = model::LoadModel(model_dir_);
  ASSERT_TRUE(weights.ok());
  auto generate = [&](const KvFormat& format) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest req;
    SetPrompt(&req, Prompt(70, 8));
    *req.mutable_sampling() = Greedy(2);
    req.mutable_cache()->set_tenant("t");
    req.mutable_cache()->set_namespace_id(
        std::string(MakeNamespace((*weights)->fingerprint, format, "t").View()));
    return ReadStream(stub->Generate(&ctx, req).get());
  };
  const Stream bf16 = generate({.codec = KvCodec::kBf16});
  EXPECT_EQ(bf16.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bf16.status.error_message().find("namespace"), std::string::npos)
      << bf16.status.error_message();
  const Stream fp8 = generate({.codec = KvCodec::kFp8E4M3});
  EXPECT_TRUE(fp8.status.ok()) << fp8.status.error_message();
  EXPECT_EQ(fp8.tokens.size(), 2u);
}

TEST_P(WorkerClusterTest, SwapOutAndInUnderPagePressureKeepsOutputs) {
  auto cache = StartCache();
  // 8 pages of 64 tokens; four sequences of 100 + 100 tokens need 16.
  auto w = StartWorker("both-0", "both", cache->grpc_address(), {"worker.kv_pages=8"});
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(Prompt(100, 10 + i));
  std::vector<Stream> streams(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto stub = Stub(*w);
      streams[i] = Generate(*stub, prompts[i], 100);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(streams[i].status.ok()) << i << ": " << streams[i].status.error_message();
    EXPECT_EQ(streams[i].tokens, Reference(prompts[i], 100)) << i;
  }
  EXPECT_GT(Metric(*w, "strata_worker_swaps_total", "direction=\"out\""), 0);
  EXPECT_GT(Metric(*w, "strata_worker_swaps_total", "direction=\"in\""), 0);
  // Idle again: every page is free, nothing waits or runs (the gauges follow within a step).
  for (int i = 0; i < 100 && Metric(*w, "strata_worker_free_kv_pages") != 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Metric(*w, "strata_worker_free_kv_pages"), 8);
  EXPECT_EQ(Metric(*w, "strata_worker_running_requests"), 0);
  EXPECT_EQ(Metric(*w, "strata_worker_queued_requests"), 0);
}

TEST_P(WorkerClusterTest, CorruptBlocksInTransitAreRecomputed) {
  auto cache = StartCache();
  auto writer = StartWorker("writer", "both", cache->grpc_address());
  auto reader = StartWorker("reader", "both", cache->grpc_address(), {"worker.fault.corrupt=1"});
  const auto prompt = Prompt(200, 20);
  auto wstub = Stub(*writer);
  v1::PrefillResponse pre;
  ASSERT_TRUE(Prefill(*wstub, prompt, &pre).ok());
  ASSERT_EQ(pre.block_keys_size(), 3);
  auto rstub = Stub(*reader);
  const Stream s = Generate(*rstub, prompt, 12);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.usage().cached().total(), 0u);  // nothing corrupt was used
  EXPECT_EQ(s.tokens, Reference(prompt, 12));
  EXPECT_GT(Metric(*reader, "strata_cache_client_fetch_failures_total"), 0);
}

TEST_P(WorkerClusterTest, CacheServerKilledDuringAFetchMeansRecomputation) {
  auto cache = StartCache();
  auto writer = StartWorker("writer", "both", cache->grpc_address());
  // Every transfer of the reader is held for 1.5 s: the cache dies while its fetch is in flight.
  auto reader = StartWorker("reader", "both", cache->grpc_address(),
                            {"worker.fault.delay=1", "worker.fault.delay_by=1500ms"});
  const auto prompt = Prompt(200, 21);
  auto wstub = Stub(*writer);
  v1::PrefillResponse pre;
  ASSERT_TRUE(Prefill(*wstub, prompt, &pre).ok());
  ASSERT_EQ(pre.block_keys_size(), 3);
  auto rstub = Stub(*reader);
  Stream s;
  std::thread request([&] { s = Generate(*rstub, prompt, 12); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cache->Kill();
  request.join();
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.usage().cached().total(), 0u);
  EXPECT_EQ(s.tokens, Reference(prompt, 12));
  // The worker keeps serving without its cache.
  const Stream again = Generate(*rstub, Prompt(70, 22), 4);
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, Reference(Prompt(70, 22), 4));
}

// A cache server restarted on the same data directory serves from SSD (DRAM residency is gone);
// the worker reconnects on its own and counts those tokens as SSD hits (its resident blocks are
// off, else the prompt would come from its own pool).
TEST_P(WorkerClusterTest, RestartedCacheServerServesFromSsd) {
  const std::vector<std::string> ssd = {"cache.ssd.capacity=64MiB", "cache.ssd.slots_per_file=64"};
  auto cache = StartCache(false, "cache", ssd);
  auto w = StartWorker("both-0", "both", cache->grpc_address(), {"worker.resident_blocks=false"});
  auto stub = Stub(*w);
  const auto prompt = Prompt(200, 50);
  v1::PrefillResponse pre;
  ASSERT_TRUE(Prefill(*stub, prompt, &pre).ok());
  ASSERT_EQ(pre.block_keys_size(), 3);
  cache->Kill(SIGTERM);
  std::vector<std::string> again = ssd;
  again.push_back("cache.listen=" + cache->grpc_address());
  cache = StartCache(false, "cache", again);
  Stream s;
  for (int attempt = 0; attempt < 20; ++attempt) {  // until the worker has reconnected
    s = Generate(*stub, prompt, 8);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    if (s.last.usage().cached().total() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(s.last.usage().cached().total(), 192u);
  EXPECT_EQ(s.last.usage().cached().ssd(), 192u);
  EXPECT_EQ(s.tokens, Reference(prompt, 8));
}

TEST_P(WorkerClusterTest, DecodeWorkerKilledMidStreamIsAClearError) {
  auto w = StartWorker("both-0", "both", "");
  auto stub = Stub(*w);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::GenerateRequest req;
  SetPrompt(&req, Prompt(80, 30));
  *req.mutable_sampling() = Greedy(1500);
  auto reader = stub->Generate(&ctx, req);
  v1::TokenChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));  // streaming has started
  w->Kill();
  while (reader->Read(&chunk)) {
  }
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_FALSE(st.error_message().empty());
}

INSTANTIATE_TEST_SUITE_P(Presets, WorkerClusterTest, testing::Values("tiny", "small-v3"));

}  // namespace
}  // namespace strata
